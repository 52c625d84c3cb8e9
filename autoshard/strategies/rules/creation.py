"""Ops that create tensors: ``arange``, ``zeros``/``ones``/``full``/``empty``, ``new_*``, ``*_like``, ``fill``.

With no tensor input to follow, a created tensor may take ANY spec that divides (R or S per axis, never P):
each device builds just its piece locally -- the ``local_args`` hook localises ``size`` and shifts ``arange``'s
start -- so no layout costs communication, and a sharded creation saves memory (a ``(B, 1, S, S)`` attention
mask need never exist whole).  ``new_*`` read only dtype/device from their tensor argument (unconstrained, no
gradient).  ``*_like`` and ``fill`` follow their input's layout (the local shape comes from the local piece).

Example: ``arange(8)`` on mesh (2,) gives ``-> R`` and ``-> S(0)``; device 1 runs ``arange(4, 8, 1)``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

from autoshard.strategies.dimmap import DimMap, fresh_letters, strategies_from_map
from autoshard.strategies.local import LocalCall, LocalContext, bind, default_call, with_arg
from autoshard.strategies.registry import register
from autoshard.strategies.strategy import OpStrategy, tensor_meta

aten = torch.ops.aten


def _out_ndim(node: fx.Node) -> int:
    val = tensor_meta(node)
    assert val is not None, f"{node} must produce a tensor"
    return val.dim()


def _size_local(ctx: LocalContext) -> LocalCall:
    args, kwargs = with_arg(ctx.node.target, ctx.args, ctx.kwargs, "size", list(ctx.local_out_shape()))
    return LocalCall(ctx.target, args, kwargs)


def _arange_local(ctx: LocalContext) -> LocalCall:
    spec = ctx.output_spec(0)
    if spec.is_replicated():
        return default_call(ctx)
    b = ctx.bound()
    start = b.get("start", 0)
    step = b.get("step", 1)
    kwargs = {k: v for k, v in ctx.kwargs.items() if k in ("dtype", "layout", "device", "pin_memory")}
    runs = ctx.out_intervals(0)
    if len(runs) > 1:  # the zigzag layout of context parallelism: this device's positions, in local order
        bounds = tuple((start + first * step, start + (first + length) * step) for first, length in runs)
        return LocalCall(_aranges, (bounds, step), kwargs)
    first, length = runs[0] if runs else (0, 0)
    local_start = start + first * step
    return LocalCall(aten.arange.start_step, (local_start, local_start + length * step, step), kwargs)


def _aranges(bounds: tuple[tuple[Any, Any], ...], step: Any, **kwargs: Any) -> torch.Tensor:
    """``arange`` of several runs, concatenated (a device's positions under a zigzag split)."""
    return torch.cat([aten.arange.start_step(lo, hi, step, **kwargs) for lo, hi in bounds])


def _free(
    node: fx.Node, mesh_shape: tuple[int, ...], roles: tuple[fx.Node | None, ...] = ()
) -> list[OpStrategy]:
    letters = tuple(fresh_letters(_out_ndim(node)))
    dm = DimMap((None,) * len(roles), (letters,), free_out=frozenset(letters))
    return strategies_from_map(node, roles, dm, mesh_shape)


@register(aten.arange.default, aten.arange.start, aten.arange.start_step, local_args=_arange_local)
def arange(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    return _free(node, mesh_shape)


@register(
    aten.zeros.default, aten.ones.default, aten.full.default, aten.empty.memory_format, local_args=_size_local
)
def full(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    return _free(node, mesh_shape)


@register(
    aten.new_zeros.default, aten.new_ones.default, aten.new_full.default, aten.new_empty.default,
    local_args=_size_local,
)  # fmt: skip
def new_full(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    """The tensor argument lends dtype and device only: it is left unconstrained."""
    return _free(node, mesh_shape)


@register(aten.scalar_tensor.default)
def scalar_tensor(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    return _free(node, mesh_shape)


@register(
    aten.zeros_like.default, aten.ones_like.default, aten.empty_like.default, aten.full_like.default,
    aten.fill.Scalar, aten.fill_.Scalar, aten.zero_.default,
)  # fmt: skip
def like(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    """Output takes the input's shape, so it takes its layout; the input's values do not matter (no grad)."""
    x = bind(node.target, node.args, node.kwargs)["self"]
    letters = tuple(fresh_letters(_out_ndim(node)))
    return strategies_from_map(node, (x,), DimMap((letters,), (letters,)), mesh_shape, nondiff=(0,))
