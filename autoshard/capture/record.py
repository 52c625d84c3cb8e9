"""From a traced graph to the :class:`~autoshard.capture.meta.Captured` record.

Input: a :class:`Traced` (what a tracer returned: the graph, its placeholders' kinds and FQNs, its outputs'
kinds, export's lifted constants), after :mod:`~autoshard.capture.clean` and
:mod:`~autoshard.capture.annotate` have run on it.  Output: the frozen ``Captured`` record (parameters and
buffers by FQN, user inputs, outputs, repeated blocks, notes).  Also the one graph edit that needs the
model itself: tied parameters (one tensor under several FQNs) become one placeholder
(:func:`merge_tied_parameters`).

Reads ``META_KIND``, ``META_FQN``, ``META_TENSOR``; writes nothing on nodes.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx, nn

from autoshard.capture.annotate import PlaceholderInfo
from autoshard.capture.clean import merge_placeholders
from autoshard.capture.meta import (
    META_FQN,
    META_KIND,
    META_TENSOR,
    UNKNOWN_DIM,
    BlockInfo,
    Captured,
    Method,
    OutputInfo,
    TensorMeta,
    tensor_meta_of,
)

__all__ = ["Traced", "has_unknown_dim", "merge_tied_parameters", "outputs_of", "record"]


@dataclass
class Traced:
    """A traced graph before annotation, with what the tracer told us about its placeholders and outputs."""

    gm: fx.GraphModule
    method: Method
    placeholders: dict[str, PlaceholderInfo]
    output_kinds: list[tuple[str, str | None]]
    constants: dict[str, torch.Tensor] = field(default_factory=dict)


def merge_tied_parameters(traced: Traced, model: nn.Module) -> dict[str, list[str]]:
    """Merge the placeholders of tied parameters into the one named as ``model.named_parameters()`` names it.

    Returns kept placeholder name -> the other FQNs of its tensor.
    """
    canonical: dict[int, str] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        canonical.setdefault(id(param), name)
    kept: dict[str, str] = {}  # canonical FQN -> placeholder name
    same_as: dict[str, str] = {}
    aliases: dict[str, list[str]] = {}
    for name, info in traced.placeholders.items():
        if info.kind != "parameter" or info.fqn is None:
            continue
        fqn = canonical.get(id(model.get_parameter(info.fqn)), info.fqn)
        if fqn in kept:
            same_as[name] = kept[fqn]
            aliases.setdefault(kept[fqn], []).append(info.fqn)
        else:
            kept[fqn] = name
            if fqn != info.fqn:
                aliases.setdefault(name, []).append(info.fqn)
            traced.placeholders[name] = PlaceholderInfo("parameter", fqn)
    if same_as:
        merge_placeholders(traced.gm, same_as, recompile=False)
    return aliases


def has_unknown_dim(meta: Any) -> bool:
    metas = meta if isinstance(meta, tuple) else (meta,)
    return any(isinstance(m, TensorMeta) and UNKNOWN_DIM in m.shape for m in metas)


def record(
    traced: Traced, model: nn.Module, info: BlockInfo | None, seconds: float, notes: list[str]
) -> Captured:
    gm = traced.gm
    by_kind: dict[str, dict[str, TensorMeta]] = {"parameter": {}, "buffer": {}}
    for node in gm.graph.nodes:
        kind, fqn = node.meta.get(META_KIND), node.meta.get(META_FQN)
        if kind in by_kind and fqn is not None and isinstance(node.meta[META_TENSOR], TensorMeta):
            by_kind[kind][fqn] = node.meta[META_TENSOR]
    if traced.method == "symbolic_trace":  # leaf modules hide their parameters: list the model's own
        by_kind["parameter"] = {n: _meta_of(p) for n, p in model.named_parameters()}
        by_kind["buffer"] = {n: _meta_of(b) for n, b in model.named_buffers()}
    user_inputs = tuple(n.name for n in gm.graph.nodes if n.meta.get(META_KIND) == "user_input")
    return Captured(
        graph_module=gm,
        params=types.MappingProxyType(by_kind["parameter"]),
        buffers=types.MappingProxyType(by_kind["buffer"]),
        user_inputs=user_inputs,
        outputs=outputs_of(gm, traced.output_kinds),
        blocks=info,
        method=traced.method,
        seconds=seconds,
        notes=tuple(notes),
        constants=types.MappingProxyType(traced.constants),
    )


def _meta_of(t: torch.Tensor) -> TensorMeta:
    meta = tensor_meta_of(t)
    assert isinstance(meta, TensorMeta)
    return meta


def outputs_of(gm: fx.GraphModule, kinds: list[tuple[str, str | None]]) -> tuple[OutputInfo, ...]:
    output = next(n for n in gm.graph.nodes if n.op == "output")
    values = output.args[0] if isinstance(output.args[0], (tuple, list)) else (output.args[0],)
    result = []
    for i, value in enumerate(values):
        kind, target = kinds[i] if i < len(kinds) else ("user_output", None)
        name = value.name if isinstance(value, fx.Node) else ""
        meta = value.meta.get(META_TENSOR) if isinstance(value, fx.Node) else None
        tensor = meta if isinstance(meta, TensorMeta) else None
        result.append(OutputInfo(name, kind, tensor, target))  # type: ignore[arg-type]
    return tuple(result)
