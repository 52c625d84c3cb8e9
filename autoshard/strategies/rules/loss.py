"""Losses: ``cross_entropy_loss``, ``nll_loss``/``nll_loss_nd``/``nll_loss2d``, ``mse_loss``, ``l1_loss``.

Class-index losses (``input (N, C, d...)``, ``target (N, d...)``): the class dim stays whole (a vocab-parallel
cross entropy needs collectives inside the op, which no single local op expresses); batch dims ``N, d...``:

- ``reduction='none'``: batch-like (input, target and output split together);
- ``'sum'``: splitting a batch dim makes the output Partial (the dim map contracts it);
- ``'mean'``: the mean is over non-ignored targets (weighted), a count that depends on every device's labels.
  We split the *input* along a batch dim while the (small, integer) *target stays replicated*: the
  ``local_args`` hook slices the device's targets out of the full ones, sums its losses and divides by the
  global count computed from the full targets (:func:`sharded_mean_loss`) -- the pieces sum to the exact mean.
  Splitting the target too would need that count from other devices, so it is not offered.

Soft-label cross entropy (float ``target`` shaped like ``input``), ``mse_loss`` and ``l1_loss`` count every
element: the mean's pieces are local means scaled by 1 / shard count, as for ``mean``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import fx

from autoshard.placement import Partial, Replicate, Shard
from autoshard.strategies.dimmap import DimMap, Letters, fresh_letters, strategies_from_map
from autoshard.strategies.local import LocalCall, LocalContext, bind, default_call
from autoshard.strategies.registry import register
from autoshard.strategies.strategy import AxisChoice, OpStrategy, expand, tensor_meta

aten = torch.ops.aten
_CLASS_LOSSES = (aten.cross_entropy_loss.default, aten.nll_loss.default, aten.nll_loss_nd.default,
                 aten.nll_loss2d.default)  # fmt: skip
_MEAN = 1


def _val(node: object) -> torch.Tensor:
    val = tensor_meta(node) if isinstance(node, fx.Node) else None
    assert val is not None, f"{node} must be a tensor"
    return val


def sharded_mean_loss(
    op_name: str,
    input: torch.Tensor,
    target: torch.Tensor,
    weight: torch.Tensor | None,
    ignore_index: int,
    label_smoothing: float,
    target_slices: Sequence[tuple[int, int, int]],
) -> torch.Tensor:
    """This device's term of a mean class-index loss: its summed loss over the global (weighted) count.

    ``input`` is the local piece; ``target`` the full targets; ``target_slices`` the ``(dim, start, length)``
    cuts that select this device's targets.
    """
    local = target
    for dim, start, length in target_slices:
        local = local.narrow(dim, start, length)
    if op_name == "cross_entropy_loss":
        total = aten.cross_entropy_loss.default(input, local, weight, 2, ignore_index, label_smoothing)
    else:
        total = aten.nll_loss_nd.default(input, local, weight, 2, ignore_index)
    valid = target != ignore_index
    counted = valid.to(total.dtype) if weight is None else weight[target.masked_fill(~valid, 0)] * valid
    return total / counted.sum()


def _class_loss_local(ctx: LocalContext) -> LocalCall:
    b = ctx.bound()
    x, target = ctx.node.args[:2]
    assert isinstance(x, fx.Node) and isinstance(target, fx.Node)
    t_spec = ctx.input_spec(target)
    if (
        b["reduction"] != _MEAN
        or t_spec is None
        or not t_spec.is_replicated()
        or ctx.output_spec().is_replicated()
    ):
        return default_call(ctx)
    x_val = _val(x)
    slices = [
        (d if d == 0 else d - 1, *ctx.in_range(x, d))
        for d in range(x_val.dim())
        if d != 1 and ctx.in_range(x, d)[1] != x_val.shape[d]
    ]
    name = "cross_entropy_loss" if ctx.node.target is aten.cross_entropy_loss.default else "nll_loss"
    return LocalCall(
        sharded_mean_loss,
        (name, b["self"], b["target"], b["weight"], b["ignore_index"], b.get("label_smoothing", 0.0), slices),
    )


def scaled_loss(op_name: str, scale: float, *args: object, **kwargs: object) -> torch.Tensor:
    """``aten.<op_name>(*args) * scale``: a mean over every element (mse, l1, soft labels) on a local piece."""
    return getattr(aten, op_name).default(*args, **kwargs) * scale


def _loss_local(ctx: LocalContext) -> LocalCall:
    if ctx.node.target in _CLASS_LOSSES and not _val(ctx.node.args[1]).is_floating_point():
        return _class_loss_local(ctx)
    b = ctx.bound()
    if b["reduction"] != _MEAN or not ctx.output_spec().partial_axes():
        return default_call(ctx)
    x = ctx.node.args[0]
    spec = ctx.input_spec(x)
    assert spec is not None
    pieces = 1
    for p, n in zip(spec.placements, ctx.mesh_shape, strict=True):
        if isinstance(p, Shard):
            pieces *= n
    name = str(ctx.target).split(".")[1]  # "aten.mse_loss.default" -> "mse_loss"
    return LocalCall(scaled_loss, (name, 1.0 / pieces, *ctx.args), dict(ctx.kwargs))


@register(*_CLASS_LOSSES, local_args=_loss_local)
def class_loss(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    b = bind(node.target, node.args, node.kwargs)
    x, target, weight = b["self"], b["target"], b.get("weight")
    weight = weight if isinstance(weight, fx.Node) else None
    xv, tv = _val(x), _val(target)
    if tv.is_floating_point():
        return _elementwise_loss(node, mesh_shape, (x, target, weight), class_dim=1 if xv.dim() > 1 else 0)
    if xv.dim() < 2:
        r = Replicate()
        return expand(
            node, (x, target, weight), [AxisChoice((r, r, r), (r,), False)], mesh_shape, nondiff=(2,)
        )
    letters = fresh_letters(xv.dim())
    batch: Letters = (letters[0], *letters[2:])
    reduction = b["reduction"]
    out: Letters = batch if reduction == 0 else ()
    dm = DimMap(
        (tuple(letters), batch, (letters[1],)),
        (out,),
        unsplittable=frozenset(letters if reduction == _MEAN else letters[1:2]),
    )
    choices = dm.choices()
    if reduction == _MEAN:  # split the input only; the target stays whole (module doc)
        r = Replicate()
        choices += [AxisChoice((Shard(d), r, r), (Partial(),), True) for d in range(xv.dim()) if d != 1]
    return expand(node, (x, target, weight), choices, mesh_shape, nondiff=(2,))


def _elementwise_loss(
    node: fx.Node, mesh_shape: tuple[int, ...], roles: tuple[fx.Node | None, ...], class_dim: int | None
) -> list[OpStrategy]:
    """Losses over every element: batch-like dims; ``'sum'``/``'mean'`` contract them (mean via scaling)."""
    b = bind(node.target, node.args, node.kwargs)
    letters = tuple(fresh_letters(_val(roles[0]).dim()))
    out: Letters = letters if b["reduction"] == 0 else ()
    if class_dim is not None and b["reduction"] == 0:
        out = tuple(c for d, c in enumerate(letters) if d != class_dim)
    whole = frozenset(letters[class_dim]) if class_dim is not None else frozenset()
    weight: tuple[Letters, ...] = (letters[class_dim : class_dim + 1],) if class_dim is not None else ()
    dm = DimMap((letters, letters, *weight[: len(roles) - 2]), (out,), unsplittable=whole)
    return strategies_from_map(node, roles, dm, mesh_shape, nondiff=(2,) if len(roles) > 2 else ())


@register(aten.mse_loss.default, aten.l1_loss.default, local_args=_loss_local)
def mse_loss(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    x, target = node.args[:2]
    assert isinstance(x, fx.Node) and isinstance(target, fx.Node)
    if tuple(_val(x).shape) != tuple(_val(target).shape):
        return expand(node, (x, target), [AxisChoice((Replicate(),) * 2, (Replicate(),), False)], mesh_shape)
    return _elementwise_loss(node, mesh_shape, (x, target), class_dim=None)
