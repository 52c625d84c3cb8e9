"""Evaluate position nodes on compact values: a tensor that is the same along a dim is held once along it.

The causal-mask proof (:mod:`autoshard.capture.causal`) evaluates, on the CPU, the nodes that build a mask's
positions.  Hugging Face builds them for one row and expands them over the batch (``expand`` to ``(B, S)``),
then runs ``diff``, ``ne``, ``cumsum`` and ``index`` on the expanded tensor: evaluated as they are, these ops
do their work once per batch row, for rows that are all the same (LLaMA-3-70B at batch 1024 x 4096: 4M
elements per op, about 0.2 s of every capture).

A :class:`Value` is the tensor ``compact.expand(shape)``: each dim of ``compact`` is either the full size or
1, and 1 means every index along that dim holds the same values.  Ops whose result provably stays the same
along such a dim run on the compact tensors (the rules below); every other op runs on the full tensors
(stride-0 views, no copy) as it did before, and its result is compacted again along its stride-0 dims.
Rules:

- pointwise ops (torch's ``pointwise`` tag, the bitwise ``&``, ``|``, ``^``, dtype casts) and
  ``unsqueeze``: the output at an index depends on the inputs at that index only, so the broadcast of the
  compact inputs is the compact output;
- ``expand`` and ``slice``: views; a dim held once stays held once;
- ``cumsum``, ``cumprod``, ``diff`` along ``dim``: each fibre along ``dim`` is computed on its own, so inputs
  that are the same along another dim give outputs that are the same along it;
- ``index.Tensor`` with an integer tensor for every dim: along a dim the source holds once, every in-range
  index reads the same values, so that index tensor only has its bounds checked.

A rule's result must have the node's dtype and a shape each of whose dims is 1 or the full size, else the op
runs on full tensors.  Values are thus equal, element for element, to full evaluation: a mask that differs
between batch rows is held per row and checked per row (``tests/capture/test_capture_compact.py`` compares
both evaluations node by node).

Example::

    v = value_of(torch.arange(4).expand(1024, 4))   # Value(compact (1, 4), shape (1024, 4))
    v.full()                                         # the (1024, 4) tensor, a view
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

__all__ = ["Value", "evaluate", "value_of"]

aten = torch.ops.aten


@dataclass(frozen=True, slots=True)
class Value:
    """The tensor ``compact.expand(shape)``; ``compact`` has ``shape``'s rank, each dim 1 or the full size."""

    compact: torch.Tensor
    shape: tuple[int, ...]

    @property
    def dtype(self) -> torch.dtype:
        return self.compact.dtype

    def full(self) -> torch.Tensor:
        """The whole tensor, as a view of ``compact`` (stride 0 along the dims held once)."""
        return self.compact.expand(self.shape)


def value_of(t: torch.Tensor) -> Value:
    """``t`` held once along each of its stride-0 dims (equal along them by construction)."""
    shape = tuple(int(s) for s in t.shape)
    if math.prod(shape) == 0:
        return Value(t, shape)  # empty: nothing to hold once
    compact = t
    for dim, (size, stride) in enumerate(zip(shape, t.stride(), strict=True)):
        if size > 1 and stride == 0:
            compact = compact.narrow(dim, 0, 1)
    return Value(compact, shape)


def evaluate(node: fx.Node, inputs: Mapping[fx.Node, Value]) -> Value | None:
    """The value of ``node`` from its inputs' values; ``None`` when the op fails on the CPU here."""
    val = node.meta.get("val")
    rule = _rule(node.target)
    if rule is not None and isinstance(val, torch.Tensor):
        shape = tuple(int(s) for s in val.shape)
        try:
            out = rule(node, inputs, shape)
        except Exception:  # the full evaluation below decides (it fails too where the op is invalid)
            out = None
        if out is not None and _fits(out, shape, val.dtype):
            return Value(out.expand(shape), shape) if math.prod(shape) == 0 else Value(out, shape)
    full = {n: v.full() for n, v in inputs.items()}
    out = _run(node, full)
    if out is None and any(not t.is_contiguous() for t in full.values()):  # a view op on a stride-0 input
        out = _run(node, {n: t.contiguous() for n, t in full.items()})
    return value_of(out) if isinstance(out, torch.Tensor) else None


def _fits(out: Any, shape: tuple[int, ...], dtype: torch.dtype) -> bool:
    return (
        isinstance(out, torch.Tensor)
        and out.dtype == dtype
        and out.dim() == len(shape)
        and all(c in (1, s) for c, s in zip(out.shape, shape, strict=True))
    )


def _substitute(a: Any, values: Mapping[fx.Node, Any]) -> Any:
    return fx.node.map_aggregate(a, lambda x: values[x] if isinstance(x, fx.Node) else x)


def _on_cpu(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    return {k: torch.device("cpu") if k == "device" else v for k, v in kwargs.items()}


def _run(node: fx.Node, values: Mapping[fx.Node, Any]) -> torch.Tensor | None:
    """Run the node's op on ``values`` (tensors or compacts) on the CPU; ``None`` when it fails."""
    assert callable(node.target)
    args = _substitute(node.args, values)
    kwargs = _on_cpu(_substitute(dict(node.kwargs), values))
    try:
        out = node.target(*args, **kwargs)
    except Exception:  # an op we cannot run here: its value stays unknown (the mask is not proven)
        return None
    return out if isinstance(out, torch.Tensor) else None


def _bound(node: fx.Node) -> dict[str, Any]:
    """The node's arguments by their schema names (``self``, ``dim``, ``prepend``, ..), defaults filled in."""
    assert isinstance(node.target, torch._ops.OpOverload)
    bound: dict[str, Any] = {}
    for i, arg in enumerate(node.target._schema.arguments):
        if i < len(node.args):
            bound[arg.name] = node.args[i]
        elif arg.name in node.kwargs:
            bound[arg.name] = node.kwargs[arg.name]
        elif arg.has_default_value():
            bound[arg.name] = arg.default_value
    return bound


def _compacts(node: fx.Node, inputs: Mapping[fx.Node, Value], shape: tuple[int, ...]) -> Any:
    """Pointwise ops and ``unsqueeze``: the op of the compact inputs."""
    return _run(node, {n: v.compact for n, v in inputs.items()})


def _expand(node: fx.Node, inputs: Mapping[fx.Node, Value], shape: tuple[int, ...]) -> Any:
    (source,) = inputs.values()
    c = source.compact
    return c.reshape((1,) * (len(shape) - c.dim()) + tuple(c.shape))  # new leading dims: held once


def _slice(node: fx.Node, inputs: Mapping[fx.Node, Value], shape: tuple[int, ...]) -> Any:
    (source,) = inputs.values()
    dim = _bound(node).get("dim", 0) % max(len(shape), 1)
    return source.compact if source.compact.shape[dim] == 1 else _compacts(node, inputs, shape)


def _along(node: fx.Node, inputs: Mapping[fx.Node, Value], shape: tuple[int, ...]) -> Any:
    """``cumsum``, ``cumprod``, ``diff``: whole along ``dim``, held once along the dims every input holds once."""
    dim = _bound(node).get("dim", -1) % len(shape)
    if any(len(v.shape) != len(shape) for v in inputs.values()) or any(
        v.shape[d] != shape[d] for v in inputs.values() for d in range(len(shape)) if d != dim
    ):
        return None  # inputs of the output's shape off ``dim``, as the op requires
    held = [max(v.compact.shape[d] for v in inputs.values()) for d in range(len(shape))]
    wide = {
        n: v.compact.expand(*(v.shape[d] if d == dim else held[d] for d in range(len(shape))))
        for n, v in inputs.items()
    }
    return _run(node, wide)


def _index(node: fx.Node, inputs: Mapping[fx.Node, Value], shape: tuple[int, ...]) -> Any:
    """``x[i0, i1, ..]``: along a dim ``x`` holds once, any in-range index reads the same (index 0)."""
    bound = _bound(node)
    x, indices = inputs[bound["self"]], bound["indices"]
    if len(indices) != len(x.shape) or not all(isinstance(i, fx.Node) for i in indices):
        return None
    new: list[torch.Tensor] = []
    for dim, index in enumerate(indices):
        c = inputs[index].compact
        if c.dtype not in (torch.int64, torch.int32) or c.numel() == 0:
            return None
        if x.compact.shape[dim] == 1:
            size = x.shape[dim]
            if int(c.min()) < -size or int(c.max()) >= size:
                return None  # out of range: the full evaluation fails as the op does
            c = torch.zeros((1,) * c.dim(), dtype=c.dtype)
        new.append(c)
    return aten.index.Tensor(x.compact, new)


_Rule = Callable[[fx.Node, Mapping[fx.Node, Value], tuple[int, ...]], Any]

_RULES: dict[str, _Rule] = {
    "__and__": _compacts, "__or__": _compacts, "__xor__": _compacts, "_to_copy": _compacts, "to": _compacts,
    "unsqueeze": _compacts, "expand": _expand, "slice": _slice, "cumsum": _along, "cumprod": _along,
    "diff": _along, "index": _index,
}  # fmt: skip


def _rule(target: Any) -> _Rule | None:
    if (
        not isinstance(target, torch._ops.OpOverload)
        or target.namespace != "aten"
        or target._schema.is_mutable
    ):
        return None  # in-place ops run on full tensors (where writing through a stride-0 view fails)
    if torch.Tag.pointwise in target.tags:
        return _compacts
    rule = _RULES.get(target._schema.name.removeprefix("aten::"))
    overload = target._overloadname
    return None if rule in (_index, _slice) and overload != "Tensor" else rule
