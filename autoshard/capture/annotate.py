"""Annotation passes: write autoshard's ``node.meta`` keys on a cleaned graph.

Input: a cleaned ``fx.GraphModule`` whose nodes hold torch's ``meta["val"]`` (FakeTensors, on the export path)
or already hold ``META_TENSOR`` (the ``symbolic_trace`` path records it while running the graph), plus a
:class:`PlaceholderInfo` per placeholder taken from the export graph signature.
Output: the same GraphModule, every node carrying ``META_TENSOR``, ``META_OP``, ``META_MODULE``,
``META_MODULE_TYPE``, ``META_REQUIRES_GRAD`` and ``META_FLOPS``; placeholders (and ``get_attr`` nodes)
also ``META_KIND`` and, for parameters/buffers/constants, ``META_FQN``. See :mod:`autoshard.capture.meta`.

Reads: ``meta["val"]``, ``meta["nn_module_stack"]`` (``{key: (path, type)}``, innermost last),
``META_NO_GRAD`` (set by the clean pass that inlines ``set_grad_enabled(False)`` regions).

Example::

    annotate(gm, placeholders, trainable={"lin.weight"}, root=model)
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torch import fx, nn

from autoshard.capture.flops import family, node_flops
from autoshard.capture.meta import (
    META_FLOPS,
    META_FQN,
    META_KIND,
    META_MODULE,
    META_MODULE_TYPE,
    META_NO_GRAD,
    META_OP,
    META_REQUIRES_GRAD,
    META_TENSOR,
    PlaceholderKind,
    TensorMeta,
    op_name,
    op_set,
    tensor_meta_of,
)

__all__ = ["ALL_KEYS", "PlaceholderInfo", "annotate", "normalize_module_path"]

ALL_KEYS = (META_TENSOR, META_OP, META_MODULE, META_MODULE_TYPE, META_REQUIRES_GRAD, META_FLOPS)

# Ops whose result never carries a gradient to its inputs although its dtype is floating.
NON_DIFFERENTIABLE = op_set(
    """detach zeros_like ones_like empty_like full_like rand_like randn_like new_zeros new_ones new_empty
    new_full bernoulli sym_size"""
)


@dataclass(frozen=True, slots=True)
class PlaceholderInfo:
    """What one placeholder stands for (from the export graph signature)."""

    kind: PlaceholderKind
    fqn: str | None = None
    """Fully qualified name for parameters, buffers and constants."""


def annotate(
    gm: fx.GraphModule,
    placeholders: Mapping[str, PlaceholderInfo],
    trainable: frozenset[str] | set[str],
    root: nn.Module | None = None,
) -> fx.GraphModule:
    """Run every annotation pass in order and check that each node got every key.

    ``trainable`` holds the FQNs of parameters with ``requires_grad``; ``root`` resolves ``call_module``
    and ``get_attr`` targets (``symbolic_trace`` graphs).
    """
    annotate_placeholders(gm, placeholders, root)
    annotate_tensors(gm)
    annotate_ops_and_modules(gm, root)
    annotate_requires_grad(gm, trainable, root)
    annotate_flops(gm, root)
    for node in gm.graph.nodes:
        missing = [k for k in ALL_KEYS if k not in node.meta]
        assert not missing, f"annotate: node {node.name} lacks {missing}"
    return gm


def annotate_placeholders(
    gm: fx.GraphModule, placeholders: Mapping[str, PlaceholderInfo], root: nn.Module | None
) -> None:
    """Writes ``META_KIND`` and ``META_FQN`` on placeholders and ``get_attr`` nodes."""
    param_names = {name for name, _ in root.named_parameters(remove_duplicate=False)} if root else set()
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            info = placeholders.get(node.name, PlaceholderInfo("user_input"))
            node.meta[META_KIND] = info.kind
            if info.fqn is not None:
                node.meta[META_FQN] = info.fqn
        elif node.op == "get_attr" and root is not None:
            fqn = str(node.target)
            node.meta[META_KIND] = "parameter" if fqn in param_names else "buffer"
            node.meta[META_FQN] = fqn


def annotate_tensors(gm: fx.GraphModule) -> None:
    """Writes ``META_TENSOR`` from ``meta["val"]`` where the tracer left it and it is not set yet."""
    for node in gm.graph.nodes:
        if META_TENSOR in node.meta:
            continue
        if node.op == "output":
            node.meta[META_TENSOR] = tuple(_item_meta(a) for a in _flat_outputs(node))
        else:
            node.meta[META_TENSOR] = tensor_meta_of(node.meta.get("val"))


def _flat_outputs(node: fx.Node) -> list[Any]:
    out = node.args[0]
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _item_meta(arg: Any) -> TensorMeta | None:
    meta = arg.meta.get(META_TENSOR) if isinstance(arg, fx.Node) else None
    return meta if isinstance(meta, TensorMeta) else None


_GETATTR = re.compile(r"getattr\(([^()]*), '([^']+)'\)")
_PATH_PATTERNS = (
    (re.compile(r"^L\['self'\]\.?|^L__self__\.?|^self\.?"), ""),
    (re.compile(r"\._modules\['([^']+)'\]"), r".\1"),
    (re.compile(r"\[(\d+)\]"), r".\1"),
    (re.compile(r"\['([^']+)'\]"), r".\1"),
    (re.compile(r"@\d+$"), ""),
    (re.compile(r"\.{2,}"), "."),
)


def normalize_module_path(raw: str) -> str:
    """``"L['self'].model.layers[3].mlp"`` (and other tracers' spellings) -> ``"model.layers.3.mlp"``."""
    path = raw.strip()
    while (unwrapped := _GETATTR.sub(r"\1.\2", path)) != path:  # innermost getattr(...) first
        path = unwrapped
    for pattern, repl in _PATH_PATTERNS:
        path = pattern.sub(repl, path)
    return path.strip(".")


def _innermost_module(node: fx.Node) -> tuple[str, str]:
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return "", ""
    path, cls = list(stack.values())[-1]
    cls_name = cls.__name__ if isinstance(cls, type) else str(cls).rsplit(".", 1)[-1]
    return normalize_module_path(str(path)), cls_name


def annotate_ops_and_modules(gm: fx.GraphModule, root: nn.Module | None) -> None:
    """Writes ``META_OP``, ``META_MODULE`` and ``META_MODULE_TYPE``.

    Ops take the innermost entry of ``nn_module_stack``; a ``call_module`` node its own target;
    parameter/buffer nodes the module owning them (``a.b.weight`` -> ``a.b``); the rest ``""``.
    """
    for node in gm.graph.nodes:
        node.meta[META_OP] = op_name(node, root)
        if node.op == "call_module":
            path, cls = str(node.target), type(root.get_submodule(str(node.target))).__name__ if root else ""
        elif META_FQN in node.meta:
            path, cls = node.meta[META_FQN].rpartition(".")[0], ""
        else:
            path, cls = _innermost_module(node)
        node.meta[META_MODULE] = path
        node.meta[META_MODULE_TYPE] = cls


def annotate_requires_grad(
    gm: fx.GraphModule,
    trainable: frozenset[str] | set[str],
    root: nn.Module | None,
    inputs: frozenset[str] = frozenset(),
) -> None:
    """Writes ``META_REQUIRES_GRAD``: trainable parameters start it; floating ops propagate it.

    User inputs are data and start without gradient, but for the placeholders named in ``inputs`` (a later
    pipeline stage's hidden states, whose gradient goes back to the previous stage).  An op carries a
    gradient when any input does, its result is floating point, it is differentiable, and it is not inside
    a ``set_grad_enabled(False)`` region.
    """
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "get_attr"):
            value = node.meta.get(META_FQN) in trainable and node.meta.get(META_KIND) == "parameter"
            value = value or (node.name in inputs and node.meta.get(META_KIND) == "user_input")
        elif node.op == "output":
            value = any(_arg_requires_grad(a) for a in node.all_input_nodes)
        else:
            value = _op_requires_grad(node, root)
        node.meta[META_REQUIRES_GRAD] = bool(value)


def _arg_requires_grad(node: fx.Node) -> bool:
    return bool(node.meta.get(META_REQUIRES_GRAD, False))


def _op_requires_grad(node: fx.Node, root: nn.Module | None) -> bool:
    if node.meta.get(META_NO_GRAD) or family(node, root) in NON_DIFFERENTIABLE:
        return False
    meta = node.meta.get(META_TENSOR)
    metas = [meta] if isinstance(meta, TensorMeta) else [m for m in (meta or ()) if isinstance(m, TensorMeta)]
    if not any(m.is_floating for m in metas):
        return False
    if any(_arg_requires_grad(a) for a in node.all_input_nodes):
        return True
    if node.op == "call_module" and root is not None:
        return any(p.requires_grad for p in root.get_submodule(str(node.target)).parameters())
    return False


def annotate_flops(gm: fx.GraphModule, root: nn.Module | None) -> None:
    """Writes ``META_FLOPS`` (see :mod:`autoshard.capture.flops`)."""
    for node in gm.graph.nodes:
        node.meta[META_FLOPS] = node_flops(node, root)
