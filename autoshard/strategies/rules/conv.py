"""Convolutions, pooling and resampling: ops over a batch, a channel and spatial dims.

Spatial dims stay whole everywhere in this family (a split would need halo exchange, which no stage models).

- **Convolution** (``conv1d/2d/3d``, ``conv_transpose1d/2d/3d``, ``convolution``): the dim map of a matmul
  over channels, ``"nc..,oc..,o->no.."`` (a transposed convolution's weight is ``"co.."``): split the batch
  ``n``; split output channels ``o`` (a column split: weight rows and bias); split input channels ``c``
  (a row split: the output is Partial, and the bias is added on the first device of each Partial axis only,
  as for ``linear``).  Grouped convolutions (``groups > 1``) split only the batch.
- **Pooling** (``max/avg_pool1d/2d/3d``, ``adaptive_*``, ``max_pool*_with_indices``): leading dims (batch,
  channels) batch-like; average pooling is linear, so Partial passes through it.
- **Resampling** (``upsample_nearest*``, ``upsample_(bi|tri)linear*``, ``_upsample_*``): leading dims
  batch-like, spatial dims whole; every mode is a fixed linear map of the input, so Partial passes through.

Example: ``conv2d(x[8,4,H,W], w[16,4,3,3], b[16])`` on mesh (2,) gives ``R, R, R -> R``,
``S(0), R, R -> S(0)`` (data parallel), ``R, S(0), S(0) -> S(1)`` (output channels) and
``S(1), S(1), R -> P`` (input channels), plus Partial through the input or the weight.
"""

from __future__ import annotations

import torch
from torch import fx

from autoshard.strategies.dimmap import DimMap, Letters, fresh_letters, strategies_from_map
from autoshard.strategies.local import LocalCall, LocalContext, bind, with_arg
from autoshard.strategies.registry import register
from autoshard.strategies.strategy import OpStrategy, output_vals, tensor_meta

aten = torch.ops.aten


def _ndim(node: object) -> int:
    val = tensor_meta(node) if isinstance(node, fx.Node) else None
    assert val is not None, f"{node} must be a tensor"
    return val.dim()


def _ops(*names: str) -> list[torch._ops.OpOverload]:
    """``aten.<packet>.<overload>`` for each ``"packet.overload"`` that exists in this torch."""
    found = []
    for name in names:
        packet, _, overload = name.partition(".")
        op = getattr(getattr(aten, packet, None), overload, None)
        if op is not None:
            found.append(op)
    return found


# -- convolution -------------------------------------------------------------------------------------------------

_CONV = _ops(
    "conv1d.default", "conv2d.default", "conv3d.default", "conv1d.padding", "conv2d.padding",
    "conv3d.padding", "convolution.default", "conv_transpose1d.default", "conv_transpose2d.input",
    "conv_transpose3d.input",
)  # fmt: skip


def _transposed(node: fx.Node) -> bool:
    if node.target is aten.convolution.default:
        return bool(bind(node.target, node.args, node.kwargs)["transposed"])
    return "conv_transpose" in str(node.target)


def _conv_local(ctx: LocalContext) -> LocalCall:
    """Drop the bias on every device but the first of each axis on which the output is Partial."""
    if all(ctx.coord[a] == 0 for a in ctx.partial_axes_of_output()):
        return LocalCall(ctx.target, ctx.args, dict(ctx.kwargs))
    args, kwargs = with_arg(ctx.node.target, ctx.args, ctx.kwargs, "bias", None)
    return LocalCall(ctx.target, args, kwargs)


@register(*_CONV, local_args=_conv_local)
def convolution(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    """Batch, output-channel (column) or input-channel (row, Partial) split; spatial dims whole."""
    b = bind(node.target, node.args, node.kwargs)
    x, w, bias = b["input"], b["weight"], b.get("bias")
    bias = bias if isinstance(bias, fx.Node) else None
    spatial: Letters = (None,) * (_ndim(w) - 2)
    batched = _ndim(x) == _ndim(w)  # conv2d also takes an unbatched (C, H, W) input
    lead: Letters = ("n",) if batched else ()
    grouped = int(b.get("groups") or 1) > 1
    c, o = (None, None) if grouped else ("c", "o")
    w_letters: Letters = (c, o, *spatial) if _transposed(node) else (o, c, *spatial)
    dm = DimMap(
        ((*lead, c, *spatial), w_letters, (o,) if bias is not None else None),
        ((*lead, o, *spatial),),
        linear_in=(frozenset({0}), frozenset({1})),
    )
    return strategies_from_map(node, (x, w, bias), dm, mesh_shape)


# -- pooling and resampling ----------------------------------------------------------------------------------------

_POOL_DIMS = {"1d": 1, "2d": 2, "3d": 3}


def _spatial_dims(node: fx.Node) -> int:
    name = str(node.target)
    return next(k for tag, k in _POOL_DIMS.items() if tag in name)


def _leading_map(node: fx.Node, *, linear: bool) -> DimMap:
    """Every output shares the input's leading letters; the last ``k`` spatial dims carry none."""
    x = node.args[0]
    n, k = _ndim(x), _spatial_dims(node)
    lead = tuple(fresh_letters(n - k))
    letters: Letters = (*lead, *(None,) * k)
    return DimMap(
        (letters,),
        (letters,) * len(output_vals(node)),
        linear_in=(frozenset({0}),) if linear else (),
    )


_MAX_POOL = _ops(
    "max_pool1d.default", "max_pool2d.default", "max_pool3d.default", "max_pool2d_with_indices.default",
    "max_pool3d_with_indices.default", "max_pool1d_with_indices.default", "adaptive_max_pool1d.default",
    "adaptive_max_pool2d.default", "adaptive_max_pool3d.default",
)  # fmt: skip
_AVG_POOL = _ops(
    "avg_pool1d.default", "avg_pool2d.default", "avg_pool3d.default", "adaptive_avg_pool1d.default",
    "adaptive_avg_pool2d.default", "adaptive_avg_pool3d.default", "_adaptive_avg_pool2d.default",
    "_adaptive_avg_pool3d.default",
)  # fmt: skip
_RESAMPLE = _ops(
    "upsample_nearest1d.vec", "upsample_nearest2d.vec", "upsample_nearest3d.vec", "upsample_nearest1d.default",
    "upsample_nearest2d.default", "upsample_nearest3d.default", "_upsample_nearest_exact1d.vec",
    "_upsample_nearest_exact2d.vec", "_upsample_nearest_exact3d.vec", "upsample_linear1d.vec",
    "upsample_bilinear2d.vec", "upsample_trilinear3d.vec", "upsample_bilinear2d.default",
    "upsample_bicubic2d.vec", "_upsample_bilinear2d_aa.vec",
)  # fmt: skip


@register(*_MAX_POOL)
def max_pool(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    """Leading dims batch-like (values and indices alike); not linear."""
    return strategies_from_map(node, (node.args[0],), _leading_map(node, linear=False), mesh_shape)


@register(*_AVG_POOL, *_RESAMPLE)
def linear_resample(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    """Average pooling and interpolation: leading dims batch-like; linear, so Partial passes through."""
    return strategies_from_map(node, (node.args[0],), _leading_map(node, linear=True), mesh_shape)
