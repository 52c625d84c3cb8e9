"""Batch, instance and group normalisation (layer and RMS norm live in ``reduction``).

Input ``(N, C, *spatial)``; per-channel parameters and statistics ``(C,)``.

- ``batch_norm`` in **eval** (running statistics): a per-channel affine map -- every dim may be split, the
  channel letter shared with weight, bias and the running statistics.  Not linear (it adds a shift).
- ``batch_norm`` in **training**: statistics over ``N`` and the spatial dims, so only the channel dim may be
  split here.  Batch splitting needs statistics synchronised across devices (SyncBatchNorm); capture
  rewrites training batch norm into its statistic ops (:mod:`autoshard.capture.batchnorm`), where a batch
  split makes the per-channel sums Partial and the planner prices their all-reduce.  This rule serves graphs
  that keep the op whole.
- ``instance_norm``: statistics per ``(n, c)`` over the spatial dims: ``N`` and ``C`` split freely.
- ``group_norm``: statistics per ``(n, group)``: ``N`` splits, and ``C`` in whole groups (the hook divides
  ``num_groups`` by the piece count); spatial dims stay whole.

Example: ``batch_norm(x[8,4,6,6], w, b, rm, rv, training=False)`` on mesh (2,) splits ``N`` (``S(0)`` with
parameters replicated), ``C`` (``S(1)`` with parameters ``S(0)``) or a spatial dim.
"""

from __future__ import annotations

import torch
from torch import fx

from autoshard.strategies.dimmap import DimMap, Letters, fresh_letters, strategies_from_map
from autoshard.strategies.local import LocalCall, LocalContext, bind, default_call, with_arg
from autoshard.strategies.registry import register
from autoshard.strategies.strategy import OpStrategy, tensor_meta

aten = torch.ops.aten


def _ndim(node: object) -> int:
    val = tensor_meta(node) if isinstance(node, fx.Node) else None
    assert val is not None, f"{node} must be a tensor"
    return val.dim()


def _node_or_none(v: object) -> fx.Node | None:
    return v if isinstance(v, fx.Node) else None


def _channel_map(
    node: fx.Node, n_params: int, whole: str, *, stats_outputs: int = 0
) -> tuple[DimMap, tuple[str, ...]]:
    """Letters ``n c s0 s1 ..`` for the input and output; ``(c,)`` for each parameter; ``whole`` names the
    kinds of dim kept whole (``n``: batch, ``c``: channels, ``s``: spatial)."""
    x = node.args[0]
    nd = _ndim(x)
    letters = tuple(fresh_letters(nd))
    kinds = ["n", "c", *("s" * (nd - 2))] if nd >= 2 else ["c"]
    unsplit = frozenset(c for c, k in zip(letters, kinds, strict=True) if k in whole)
    chan = letters[kinds.index("c")]
    params: tuple[Letters | None, ...] = ((chan,),) * n_params
    return DimMap((letters, *params), (letters,) + ((chan,),) * stats_outputs, unsplittable=unsplit), letters


@register(aten.batch_norm.default)
def batch_norm(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    """Eval: any split; training: channels only (module doc)."""
    b = bind(node.target, node.args, node.kwargs)
    roles = [_node_or_none(b[k]) for k in ("weight", "bias", "running_mean", "running_var")]
    dm, _ = _channel_map(node, 4, "ns" if b["training"] else "")
    return strategies_from_map(node, (b["input"], *roles), dm, mesh_shape)


@register(aten.instance_norm.default)
def instance_norm(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    """Statistics per (sample, channel): batch and channels split; spatial dims whole."""
    b = bind(node.target, node.args, node.kwargs)
    roles = [_node_or_none(b[k]) for k in ("weight", "bias", "running_mean", "running_var")]
    if not b["use_input_stats"]:  # running statistics: a per-channel affine map, like eval batch norm
        dm, _ = _channel_map(node, 4, "")
    else:
        dm, _ = _channel_map(node, 4, "s")
    return strategies_from_map(node, (b["input"], *roles), dm, mesh_shape)


def _group_norm_local(ctx: LocalContext) -> LocalCall:
    """A device holding ``1/k`` of the channels holds ``1/k`` of the groups: localise ``num_groups``."""
    b = ctx.bound()
    x = ctx.node.args[0]
    assert isinstance(x, fx.Node)
    spec = ctx.input_spec(x)
    pieces = spec.shard_count(1, ctx.mesh_shape) if spec is not None else 1
    if pieces == 1:
        return default_call(ctx)
    args, kwargs = with_arg(ctx.target, ctx.args, ctx.kwargs, "num_groups", int(b["num_groups"]) // pieces)
    return LocalCall(ctx.target, args, kwargs)


@register(aten.group_norm.default, local_args=_group_norm_local)
def group_norm(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    """Statistics per (sample, group): the batch splits, and the channels in whole groups (a channel split
    whose piece count divides ``num_groups``); spatial dims whole."""
    b = bind(node.target, node.args, node.kwargs)
    roles = [_node_or_none(b[k]) for k in ("weight", "bias")]
    dm, _ = _channel_map(node, 2, "s")
    groups = int(b["num_groups"])
    return [
        s
        for s in strategies_from_map(node, (b["input"], *roles), dm, mesh_shape)
        if s.inputs[0] is None or groups % s.inputs[0].shard_count(1, mesh_shape) == 0
    ]
