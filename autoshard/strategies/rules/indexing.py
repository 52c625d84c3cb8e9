"""Indexing: ``index``, ``index_put``, ``gather``, ``scatter*``, ``index_select``, ``index_add``.

The common rule: **the indexed dim of the indexed tensor stays whole** (an index may point anywhere in it);
every other dim is batch-like, shared with the index and value tensors where their sizes agree.  Dims of the
*index* tensors themselves may be split (each device looks up its own indices in the full indexed dim), which
splits the corresponding output dims.  The ops are linear in the indexed tensor (and ``index_put``/``scatter``/
``index_add`` in the values jointly with it), so Partial passes through.

Advanced indexing (``x[i, j]`` as ``aten.index.Tensor``) follows NumPy: index tensors broadcast to one shape
``I``; the output is ``x``'s unindexed dims with ``I`` in place of the indexed ones when those are adjacent,
else ``I`` first.  Boolean masks (data-dependent shapes) are replicate-only.

Example: the HF attention mask ``cumsum[(B,1,1,1) arange, (1,1,S,1) arange]`` may split ``B`` or ``S`` of
the output by splitting the index tensors, with ``cumsum`` replicated.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import fx

from autoshard.strategies.dimmap import DimMap, Letters, fresh_letters, strategies_from_map
from autoshard.strategies.local import bind
from autoshard.strategies.registry import register, replicate_strategy
from autoshard.strategies.strategy import OpStrategy, tensor_meta

aten = torch.ops.aten


def _shape(node: object) -> tuple[int, ...]:
    val = tensor_meta(node) if isinstance(node, fx.Node) else None
    assert val is not None, f"{node} must be a tensor"
    return tuple(int(s) for s in val.shape)


def _align(shape: Sequence[int], letters: Letters, full: Sequence[int]) -> Letters:
    """Letters of a tensor broadcast (right-aligned) against ``full`` with ``letters``."""
    offset = len(full) - len(shape)
    return tuple(letters[offset + d] if s == full[offset + d] else None for d, s in enumerate(shape))


class _Advanced:
    """Letter layout of ``x[indices]`` (NumPy advanced indexing)."""

    def __init__(self, x: fx.Node, indices: Sequence[fx.Node | None]) -> None:
        x_shape = _shape(x)
        pos = [i for i, t in enumerate(indices) if t is not None]
        idx_nodes = [t for t in indices if t is not None]
        self.broadcast = tuple(int(s) for s in torch.broadcast_shapes(*(_shape(t) for t in idx_nodes)))
        letters = fresh_letters(len(x_shape) + len(self.broadcast))
        self.x: tuple[str, ...] = tuple(letters[: len(x_shape)])
        self.i: tuple[str, ...] = tuple(letters[len(x_shape) :])
        self.indexed = frozenset(self.x[p] for p in pos)
        self.index: list[Letters] = [_align(_shape(t), self.i, self.broadcast) for t in idx_nodes]
        kept = [c for d, c in enumerate(self.x) if d not in pos]
        adjacent = pos == list(range(pos[0], pos[-1] + 1))
        if adjacent:
            before = [c for d, c in enumerate(self.x) if d < pos[0]]
            self.out: tuple[str, ...] = (*before, *self.i, *kept[len(before) :])
        else:
            self.out = (*self.i, *kept)
        self.nodes = idx_nodes


def _is_bool(node: fx.Node) -> bool:
    val = tensor_meta(node)
    return val is not None and val.dtype == torch.bool


@register(aten.index.Tensor, aten.index.Tensor_hacked_twin, aten._unsafe_index.Tensor)
def index(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    """``x[indices]``: indexed dims of ``x`` whole; other dims and index-tensor dims batch-like."""
    b = bind(node.target, node.args, node.kwargs)
    x, indices = b["self"], list(b["indices"])
    if any(_is_bool(t) for t in indices if t is not None):
        return [replicate_strategy(node, mesh_shape)]
    lay = _Advanced(x, indices)
    dm = DimMap(
        (lay.x, *lay.index),
        (lay.out,),
        unsplittable=lay.indexed,
        linear_in=(frozenset({0}),),
    )
    return strategies_from_map(node, (x, *lay.nodes), dm, mesh_shape)


@register(
    aten.index_put.default,
    aten.index_put_.default,
    aten.index_put.hacked_twin,
    aten.index_put_.hacked_twin,
    aten._unsafe_index_put.default,
)
def index_put(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    """``x[indices] = v``: ``x``'s unindexed dims batch-like (shared with ``v``); the indexed part whole."""
    b = bind(node.target, node.args, node.kwargs)
    x, indices, values = b["self"], list(b["indices"]), b["values"]
    if any(_is_bool(t) for t in indices if t is not None):
        return [replicate_strategy(node, mesh_shape)]
    lay = _Advanced(x, indices)
    x_shape = _shape(x)
    sizes = dict(zip(lay.x, x_shape, strict=True)) | dict(zip(lay.i, lay.broadcast, strict=True))
    view = [sizes[c] for c in lay.out]
    v_letters = _align(_shape(values), lay.out, view)
    dm = DimMap(
        (lay.x, *lay.index, v_letters),
        (lay.x,),
        unsplittable=lay.indexed | frozenset(lay.i),
        linear_in=(frozenset({0, len(lay.nodes) + 1}),),
    )
    return strategies_from_map(node, (x, *lay.nodes, values), dm, mesh_shape)


def _dim(b: dict[str, object], ndim: int) -> int:
    d = b["dim"]
    assert isinstance(d, int)
    return d % max(ndim, 1)


@register(aten.gather.default)
def gather(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    """``out[.., j, ..] = x[.., index[.., j, ..], ..]``: ``x``'s gather dim whole; ``index`` dims split freely."""
    b = bind(node.target, node.args, node.kwargs)
    x, idx = b["self"], b["index"]
    xs, ids = _shape(x), _shape(idx)
    dim = _dim(b, len(xs))
    xl = fresh_letters(len(xs))
    il = fresh_letters(len(ids), avoid=xl)
    whole = {xl[dim]}
    for d in range(len(xs)):
        if d != dim and xs[d] == ids[d]:
            il[d] = xl[d]
        elif d != dim:
            whole |= {xl[d], il[d]}
    dm = DimMap(
        (tuple(xl), tuple(il)), (tuple(il),), unsplittable=frozenset(whole), linear_in=(frozenset({0}),)
    )
    return strategies_from_map(node, (x, idx), dm, mesh_shape)


@register(
    aten.scatter.src,
    aten.scatter.value,
    aten.scatter_add.default,
    aten.scatter.reduce,
    aten.scatter_reduce.two,
    aten.scatter_.src,
    aten.scatter_.value,
    aten.scatter_add_.default,
    aten.scatter_reduce_.two,
)
def scatter(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    """Scatter dim whole everywhere; other dims batch-like where self, index and src sizes agree.

    ``scatter(self, dim, index, src)`` and ``scatter_add`` are linear in ``(self, src)`` together.
    """
    b = bind(node.target, node.args, node.kwargs)
    x, idx, src = b["self"], b["index"], b.get("src")
    src = src if isinstance(src, fx.Node) else None
    xs, ids = _shape(x), _shape(idx)
    ss = _shape(src) if src is not None else ids
    dim = _dim(b, len(xs))
    xl = fresh_letters(len(xs))
    il = fresh_letters(len(ids), avoid=xl)
    sl = fresh_letters(len(ss), avoid=xl + il)
    whole = {xl[dim], il[dim], sl[dim]}
    for d in range(len(xs)):
        if d != dim and xs[d] == ids[d] == ss[d]:
            il[d] = sl[d] = xl[d]
        elif d != dim:
            whole |= {xl[d], il[d], sl[d]}
    name = node.target.name() if isinstance(node.target, torch._ops.OpOverload) else ""
    linear = src is not None and "reduce" not in name and "value" not in str(node.target)
    dm = DimMap(
        (tuple(xl), tuple(il), tuple(sl) if src is not None else None),
        (tuple(xl),),
        unsplittable=frozenset(whole),
        linear_in=(frozenset({0, 2}),) if linear else (),
    )
    return strategies_from_map(node, (x, idx, src), dm, mesh_shape)


@register(aten.index_select.default)
def index_select(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    """``x.index_select(dim, i)``: ``x``'s dim whole; the index (and that output dim) may split."""
    b = bind(node.target, node.args, node.kwargs)
    x, idx = b["self"], b["index"]
    xs = _shape(x)
    dim = _dim(b, len(xs))
    xl = fresh_letters(len(xs) + 1)
    i = xl.pop()
    out = tuple(i if d == dim else c for d, c in enumerate(xl))
    idx_letters: Letters = (i,) if len(_shape(idx)) == 1 else ()
    dm = DimMap(
        (tuple(xl), idx_letters), (out,), unsplittable=frozenset(xl[dim]), linear_in=(frozenset({0}),)
    )
    return strategies_from_map(node, (x, idx), dm, mesh_shape)


@register(aten.index_add.default, aten.index_add_.default)
def index_add(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    """``self.index_add(dim, i, src)``: the add dim whole; other dims shared with ``src``; linear in both."""
    b = bind(node.target, node.args, node.kwargs)
    x, idx, src = b["self"], b["index"], b["source"]
    xs, ss = _shape(x), _shape(src)
    dim = _dim(b, len(xs))
    xl = fresh_letters(len(xs))
    sl = fresh_letters(len(ss), avoid=xl)
    whole = {xl[dim], sl[dim] if ss else ""}
    for d in range(len(ss)):
        if d != dim and d < len(xs) and xs[d] == ss[d]:
            sl[d] = xl[d]
        elif d != dim:
            whole |= {sl[d]}
    idx_letters: Letters = (sl[dim],) if len(_shape(idx)) == 1 and ss else ()
    dm = DimMap(
        (tuple(xl), idx_letters, tuple(sl)),
        (tuple(xl),),
        unsplittable=frozenset(whole - {""}),
        linear_in=(frozenset({0, 2}),),
    )
    return strategies_from_map(node, (x, idx, src), dm, mesh_shape)
