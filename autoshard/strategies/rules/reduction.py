"""Reductions, scans and normalisations.

Dim maps: kept dims are batch-like; reduced dims are

- *contracted* for ``sum`` and ``mean``: splitting one makes the output Partial (``sum`` of local sums; a
  ``mean``'s ``local_args`` hook divides by the global count instead of the local one, so the local means
  sum to the global mean), and Partial passes through (both are linear);
- *unsplittable* for everything else (``amax``, ``max.dim``, ``argmax``, ``prod``, ``var``, ``any``,
  ``logsumexp``): a ``P(max)`` layout would work for some, but no other stage handles it, so we forbid it.

``softmax``/``log_softmax`` keep their dim whole; ``cumsum`` likewise (and is linear); ``layer_norm`` and
``rms_norm`` keep the normalised dims whole, so their weight and bias are always replicated.

Example: ``mean(x[B,S,H], dim=-1, keepdim=True)`` on mesh (2,) gives ``R -> R``, ``S(0) -> S(0)``,
``S(1) -> S(1)``, ``S(2) -> P`` and ``P -> P``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import fx

from autoshard.placement import Shard
from autoshard.strategies.dimmap import DimMap, Letters, fresh_letters, strategies_from_map
from autoshard.strategies.local import LocalCall, LocalContext, bind, default_call
from autoshard.strategies.registry import register
from autoshard.strategies.strategy import OpStrategy, output_vals, tensor_meta

aten = torch.ops.aten


def _ndim(node: object) -> int:
    val = tensor_meta(node) if isinstance(node, fx.Node) else None
    assert val is not None, f"{node} must be a tensor"
    return val.dim()


def _reduced_dims(dim: object, ndim: int) -> list[int]:
    """Normalised reduced dims; ``None`` or ``[]`` means all dims."""
    if dim is None or (isinstance(dim, Sequence) and len(dim) == 0):
        return list(range(ndim))
    assert isinstance(dim, int | Sequence), f"reduction dims must be an int or a list, got {dim!r}"
    dims = [dim] if isinstance(dim, int) else [int(d) for d in dim]
    return sorted({d % ndim if ndim else 0 for d in dims})


def _reduction_map(node: fx.Node, dims: list[int], keepdim: bool, *, summable: bool) -> DimMap:
    x = node.args[0]
    letters = tuple(fresh_letters(_ndim(x)))
    kept: Letters = tuple(None if d in dims else c for d, c in enumerate(letters))
    out: Letters = kept if keepdim else tuple(c for c in kept if c is not None)
    reduced = "" if summable else "".join(letters[d] for d in dims)
    n_out = len(output_vals(node))
    return DimMap(
        (letters,),
        (out,) * n_out,
        unsplittable=frozenset(reduced),
        linear_in=(frozenset({0}),) if summable else (),
    )


def _bound_reduction(node: fx.Node) -> tuple[list[int], bool]:
    b = bind(node.target, node.args, node.kwargs)
    ndim = _ndim(b["self"])
    return _reduced_dims(b.get("dim"), ndim), bool(b.get("keepdim", False))


# -- sum-like ---------------------------------------------------------------------------------------------------


def scaled_mean(
    x: torch.Tensor, dim: list[int], keepdim: bool, dtype: torch.dtype | None, scale: float
) -> torch.Tensor:
    """``mean(x, dim) * scale``: the local term of a mean over a split dim (``scale`` = 1 / shard count)."""
    return torch.ops.aten.mean.dim(x, dim, keepdim, dtype=dtype) * scale


def _mean_local(ctx: LocalContext) -> LocalCall:
    b = ctx.bound()
    x = ctx.node.args[0]
    ndim = _ndim(x)
    dims = _reduced_dims(b.get("dim"), ndim)
    spec = ctx.input_spec(x)
    assert spec is not None
    pieces = 1
    for p, n in zip(spec.placements, ctx.mesh_shape, strict=True):
        if isinstance(p, Shard) and p.dim in dims:
            pieces *= n
    if pieces == 1:
        return default_call(ctx)
    return LocalCall(
        scaled_mean, (b["self"], dims, bool(b.get("keepdim", False)), b.get("dtype"), 1.0 / pieces)
    )


@register(aten.sum.dim_IntList, aten.sum.default)
def sum_(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    dims, keepdim = _bound_reduction(node)
    return strategies_from_map(
        node, (node.args[0],), _reduction_map(node, dims, keepdim, summable=True), mesh_shape
    )


@register(aten.mean.dim, aten.mean.default, local_args=_mean_local)
def mean(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    dims, keepdim = _bound_reduction(node)
    return strategies_from_map(
        node, (node.args[0],), _reduction_map(node, dims, keepdim, summable=True), mesh_shape
    )


# -- other reductions: reduced dims whole ------------------------------------------------------------------------


@register(
    aten.amax.default, aten.amin.default, aten.max.dim, aten.min.dim, aten.max.default, aten.min.default,
    aten.argmax.default, aten.argmin.default, aten.prod.dim_int, aten.prod.default, aten.var.correction,
    aten.var.dim, aten.std.correction, aten.std.dim, aten.any.dim, aten.any.dims, aten.any.default,
    aten.all.dim, aten.all.dims, aten.all.default, aten.logsumexp.default, aten.var_mean.correction,
    aten.norm.ScalarOpt_dim,
)  # fmt: skip
def reduction(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    """Non-additive reductions: kept dims batch-like, reduced dims unsplittable."""
    dims, keepdim = _bound_reduction(node)
    dm = _reduction_map(node, dims, keepdim, summable=False)
    return strategies_from_map(node, (node.args[0],), dm, mesh_shape)


# -- along one dim: softmax, scans -------------------------------------------------------------------------------


def _along_dim(node: fx.Node, mesh_shape: tuple[int, ...], *, linear: bool) -> list[OpStrategy]:
    x = node.args[0]
    ndim = _ndim(x)
    dim = int(bind(node.target, node.args, node.kwargs)["dim"]) % max(ndim, 1)
    letters = tuple(fresh_letters(ndim))
    dm = DimMap(
        (letters,),
        (letters,),
        unsplittable=frozenset(letters[dim : dim + 1]),
        linear_in=(frozenset({0}),) if linear else (),
    )
    return strategies_from_map(node, (x,), dm, mesh_shape)


@register(
    aten.softmax.int,
    aten._softmax.default,
    aten.log_softmax.int,
    aten._log_softmax.default,
    aten.cumprod.default,
)
def softmax(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    """The softmax (or scan) dim stays whole; every other dim is batch-like."""
    return _along_dim(node, mesh_shape, linear=False)


@register(aten.cumsum.default)
def cumsum(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    """The scan dim stays whole; linear, so Partial passes through."""
    return _along_dim(node, mesh_shape, linear=True)


@register(aten.diff.default)
def diff(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    """``diff(x, n, dim, prepend, append)``: the dim whole; ``prepend``/``append`` share the other dims;
    linear in all tensors together."""
    b = bind(node.target, node.args, node.kwargs)
    x = b["self"]
    ndim = _ndim(x)
    dim = int(b["dim"]) % max(ndim, 1)
    letters = tuple(fresh_letters(ndim + 2))
    own, pre, post = letters[:ndim], letters[ndim], letters[ndim + 1]
    extra = [t if isinstance(t, fx.Node) else None for t in (b["prepend"], b["append"])]
    ext_letters = [
        None if t is None else tuple(c if d != dim else tag for d, c in enumerate(own))
        for t, tag in zip(extra, (pre, post), strict=True)
    ]
    group = frozenset({0} | {i + 1 for i, t in enumerate(extra) if t is not None})
    dm = DimMap(
        (own, *ext_letters),
        (own,),
        unsplittable=frozenset({own[dim], pre, post}),
        linear_in=(group,),
    )
    return strategies_from_map(node, (x, *extra), dm, mesh_shape)


# -- normalisation -------------------------------------------------------------------------------------------------


@register(
    aten.layer_norm.default,
    aten.native_layer_norm.default,
    aten.rms_norm.default,
    aten._fused_rms_norm.default,
)
def norm(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    """Leading dims batch-like; normalised dims whole; weight/bias replicated.

    ``native_layer_norm`` also returns ``mean`` and ``rstd`` (leading dims, then size-1 dims), which follow
    the leading dims; ``_fused_rms_norm`` returns ``rstd`` likewise.
    """
    b = bind(node.target, node.args, node.kwargs)
    x, w, bias = b["input"], b.get("weight"), b.get("bias")
    ndim, k = _ndim(x), len(b["normalized_shape"])
    letters = tuple(fresh_letters(ndim))
    normed = letters[ndim - k :]
    stats: Letters = (*letters[: ndim - k], *(None,) * k)
    outs = (letters,) + (stats,) * (len(output_vals(node)) - 1)
    roles = (x, w if isinstance(w, fx.Node) else None, bias if isinstance(bias, fx.Node) else None)
    dm = DimMap((letters, normed, normed), outs, unsplittable=frozenset(normed))
    return strategies_from_map(node, roles, dm, mesh_shape)
