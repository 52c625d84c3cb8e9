"""Ops that move, select or join data without arithmetic.

- **reshape family** (``view``, ``reshape``, ``_unsafe_view``, ``flatten``, ``unflatten``, ``squeeze``,
  ``unsqueeze``): dims are grouped by matching products of sizes, ignoring size-1 dims (``(B, S, H) ->
  (B, S, nh, hd)`` has groups ``B|B``, ``S|S``, ``H|nh·hd``).  Only the first dim of a group can carry a shard
  across the reshape, and only while the shard count also divides the first dim on the other side
  (``H`` split 2 ways becomes ``nh`` split 2 ways when ``nh`` is even).  Sizes in the arguments are localised.
- **permutations** (``permute``, ``transpose``, ``t``, ``movedim``, ``x.T`` as ``numpy_T``, ``x.mT``): a pure
  dim map.
- **repeat_interleave** along a dim: a block of the dim maps to a block of the output, so it splits too.
- **expand**: kept dims carry their shard; an expanded (size-1) or new dim may be split in the output alone
  (each device expands to its slice; sizes localised) -- GQA's ``repeat_kv`` is ``expand`` + ``reshape``.
- **repeat**, **slice**, **select**, **narrow**, **split**/**chunk**/**unbind**, **cat**/**stack**, **pad**,
  **flip**: the dim they act on stays whole (a slice covering the whole dim keeps it splittable); other dims are
  batch-like.  Everything here is linear, so Partial passes through (a constant ``pad`` only with value 0).
- ``tril``/``triu``: every dim splittable; the hook shifts ``diagonal`` by the piece's row and column offsets.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import fx

from autoshard.placement import Partial, Replicate, Shard
from autoshard.strategies.dimmap import DimMap, Letters, fresh_letters, strategies_from_map
from autoshard.strategies.local import LocalCall, LocalContext, bind, with_arg
from autoshard.strategies.registry import register
from autoshard.strategies.strategy import AxisChoice, OpStrategy, expand, output_vals, tensor_meta

aten = torch.ops.aten
_LINEAR0 = (frozenset({0}),)


def _shape(node: object) -> tuple[int, ...]:
    val = tensor_meta(node) if isinstance(node, fx.Node) else None
    assert val is not None, f"{node} must be a tensor"
    return tuple(int(s) for s in val.shape)


# -- reshape family -----------------------------------------------------------------------------------------------


def view_groups(in_shape: Sequence[int], out_shape: Sequence[int]) -> list[tuple[int, int]]:
    """``(input dim, output dim)`` pairs that may carry one shard across a reshape: the first non-1 dim of each
    group of dims with equal products.  Example: ``(2, 8, 32) -> (2, 8, 4, 8)`` gives ``[(0, 0), (1, 1), (2, 2)]``.
    """
    if 0 in in_shape or 0 in out_shape:
        return []
    ins = [d for d, s in enumerate(in_shape) if s != 1]
    outs = [d for d, s in enumerate(out_shape) if s != 1]
    pairs: list[tuple[int, int]] = []
    i = j = 0
    while i < len(ins) and j < len(outs):
        pairs.append((ins[i], outs[j]))
        pi, pj = in_shape[ins[i]], out_shape[outs[j]]
        i, j = i + 1, j + 1
        while pi != pj:
            if pi < pj:
                pi *= in_shape[ins[i]]
                i += 1
            else:
                pj *= out_shape[outs[j]]
                j += 1
    return pairs


def _reshape_strategies(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    x = node.args[0]
    assert isinstance(x, fx.Node)
    choices = [AxisChoice((Replicate(),), (Replicate(),), False)]
    choices += [AxisChoice((Shard(a),), (Shard(b),), True) for a, b in view_groups(_shape(x), _shape(node))]
    choices.append(AxisChoice((Partial(),), (Partial(),), False))
    return expand(node, (x,), choices, mesh_shape)


def _sizes_local(ctx: LocalContext) -> LocalCall:
    """Replace the ``size``/``shape`` argument with the local output shape."""
    name = "shape" if "shape" in ctx.bound() else "size"
    args, kwargs = with_arg(ctx.node.target, ctx.args, ctx.kwargs, name, list(ctx.local_out_shape()))
    return LocalCall(ctx.target, args, kwargs)


def _unflatten_local(ctx: LocalContext) -> LocalCall:
    b = ctx.bound()
    dim = int(b["dim"]) % len(_shape(ctx.node.args[0]))
    local = ctx.local_out_shape()[dim : dim + len(b["sizes"])]
    args, kwargs = with_arg(ctx.node.target, ctx.args, ctx.kwargs, "sizes", list(local))
    return LocalCall(ctx.target, args, kwargs)


@register(aten.view.default, aten.reshape.default, aten._unsafe_view.default, local_args=_sizes_local)
def view(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    return _reshape_strategies(node, mesh_shape)


@register(aten.unflatten.int, local_args=_unflatten_local)
def unflatten(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    return _reshape_strategies(node, mesh_shape)


@register(aten.flatten.using_ints, aten.unsqueeze.default, aten.unsqueeze_.default)
def unsqueeze(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    """Reshapes whose arguments carry no sizes: the op runs unchanged on local pieces."""
    return _reshape_strategies(node, mesh_shape)


def _squeeze_local(ctx: LocalContext) -> LocalCall:
    """Squeeze exactly the dims that are 1 globally: a shard of size 1 must not vanish."""
    x = ctx.node.args[0]
    shape = _shape(x)
    b = ctx.bound()
    asked = b.get("dim", b.get("dims"))
    dims = range(len(shape)) if asked is None else [asked] if isinstance(asked, int) else list(asked)
    ones = [d % len(shape) for d in dims if shape[d] == 1]
    return LocalCall(aten.squeeze.dims, (ctx.args[0], ones))


@register(
    aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze_.dim, local_args=_squeeze_local
)
def squeeze(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    return _reshape_strategies(node, mesh_shape)


# -- permutations ------------------------------------------------------------------------------------------------


def _permutation(node: fx.Node) -> list[int]:
    n = len(_shape(node.args[0]))
    b = bind(node.target, node.args, node.kwargs)
    if node.target is aten.permute.default:
        return [int(d) % n for d in b["dims"]]
    perm = list(range(n))
    if node.target in (aten.t.default, aten.numpy_T.default):
        return perm[::-1]
    if node.target in (aten.mT.default,):
        perm[-2], perm[-1] = perm[-1], perm[-2]
        return perm
    if node.target is aten.movedim.int:
        src, dst = int(b["source"]) % n, int(b["destination"]) % n
        perm.pop(src)
        perm.insert(dst, src)
        return perm
    first, second = ("axis0", "axis1") if node.target is aten.swapaxes.default else ("dim0", "dim1")
    d0, d1 = (int(b[first]) % n, int(b[second]) % n) if n else (0, 0)
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return perm


@register(
    aten.permute.default, aten.transpose.int, aten.t.default, aten.movedim.int, aten.swapaxes.default,
    aten.numpy_T.default, aten.mT.default,
)  # fmt: skip
def permute(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    letters = tuple(fresh_letters(len(_shape(node.args[0]))))
    out = tuple(letters[d] for d in _permutation(node))
    return strategies_from_map(
        node, (node.args[0],), DimMap((letters,), (out,), linear_in=_LINEAR0), mesh_shape
    )


# -- expand / repeat -------------------------------------------------------------------------------------------------


@register(aten.expand.default, local_args=_sizes_local)
def expand_(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    """Kept dims carry their shard; expanded and new dims may be split in the output alone."""
    in_shape, out_shape = _shape(node.args[0]), _shape(node)
    out = tuple(fresh_letters(len(out_shape)))
    offset = len(out_shape) - len(in_shape)
    letters: Letters = tuple(
        out[offset + d] if s == out_shape[offset + d] else None for d, s in enumerate(in_shape)
    )
    free = frozenset(c for c in out if c not in letters)
    dm = DimMap((letters,), (out,), free_out=free, linear_in=_LINEAR0)
    return strategies_from_map(node, (node.args[0],), dm, mesh_shape)


@register(aten.repeat.default)
def repeat(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    """Dims repeated once are batch-like; repeated and new dims stay whole."""
    in_shape, out_shape = _shape(node.args[0]), _shape(node)
    out = tuple(fresh_letters(len(out_shape)))
    offset = len(out_shape) - len(in_shape)
    letters: Letters = tuple(
        out[offset + d] if s == out_shape[offset + d] else None for d, s in enumerate(in_shape)
    )
    dm = DimMap((letters,), (out,), linear_in=_LINEAR0)
    return strategies_from_map(node, (node.args[0],), dm, mesh_shape)


# -- along one dim: slice, select, narrow, split, flip, pad ----------------------------------------------------------


def _keep_whole(
    node: fx.Node,
    mesh_shape: tuple[int, ...],
    whole: Sequence[int],
    *,
    drop: int | None = None,
    linear: bool = True,
) -> list[OpStrategy]:
    """Input letters map to every output; dims in ``whole`` are unsplittable, ``drop`` is removed (select)."""
    x = node.args[0]
    letters = tuple(fresh_letters(len(_shape(x))))
    out: Letters = tuple(c for d, c in enumerate(letters) if d != drop)
    outs = (out,) * len(output_vals(node))
    dm = DimMap(
        (letters,),
        outs,
        unsplittable=frozenset(letters[d] for d in whole),
        linear_in=_LINEAR0 if linear else (),
    )
    return strategies_from_map(node, (x,), dm, mesh_shape)


def _dim(node: fx.Node, name: str = "dim") -> int:
    n = len(_shape(node.args[0]))
    return int(bind(node.target, node.args, node.kwargs)[name]) % max(n, 1)


@register(aten.slice.Tensor)
def slice_(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    """The sliced dim stays whole unless the slice covers all of it (then local slicing is the identity)."""
    b = bind(node.target, node.args, node.kwargs)
    dim, size = _dim(node), _shape(node.args[0])[_dim(node)]
    full = b["start"] in (None, 0) and (b["end"] is None or b["end"] >= size) and b["step"] == 1
    return _keep_whole(node, mesh_shape, [] if full else [dim])


@register(aten.select.int)
def select(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    return _keep_whole(node, mesh_shape, [_dim(node)], drop=_dim(node))


@register(aten.unbind.int)
def unbind(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    return _keep_whole(node, mesh_shape, [_dim(node)], drop=_dim(node))


@register(
    aten.narrow.default,
    aten.split.Tensor,
    aten.split_with_sizes.default,
    aten.chunk.default,
    aten.tensor_split.sections,
)
def split(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    """The dim being cut stays whole; every piece keeps the other dims' shards."""
    return _keep_whole(node, mesh_shape, [_dim(node)])


@register(aten.flip.default)
def flip(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    n = len(_shape(node.args[0]))
    dims = [int(d) % n for d in bind(node.target, node.args, node.kwargs)["dims"]]
    return _keep_whole(node, mesh_shape, dims)


@register(aten.constant_pad_nd.default, aten.pad.default)
def pad(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    """Padded dims stay whole; Partial passes through a constant pad of 0."""
    b = bind(node.target, node.args, node.kwargs)
    n, pads = len(_shape(node.args[0])), list(b["pad"])
    whole = [n - 1 - i for i in range(len(pads) // 2) if pads[2 * i] or pads[2 * i + 1]]
    linear = b.get("mode", "constant") != "constant" or not b.get("value")  # reflect/replicate are linear
    return _keep_whole(node, mesh_shape, whole, linear=linear)


@register(aten.slice_scatter.default)
def slice_scatter(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    """``slice_scatter(x, src, dim, ..)`` (functional slice assignment): the written dim whole in both, other
    dims shared; linear in ``x`` and ``src`` together."""
    x, src = node.args[0], node.args[1]
    n = len(_shape(x))
    dim = _dim(node)
    letters = tuple(fresh_letters(n + 1))
    own, sdim = letters[:n], letters[n]
    src_letters = tuple(sdim if d == dim else c for d, c in enumerate(own))
    dm = DimMap(
        (own, src_letters), (own,), unsplittable=frozenset({own[dim], sdim}), linear_in=(frozenset({0, 1}),)
    )
    return strategies_from_map(node, (x, src), dm, mesh_shape)


@register(aten.repeat_interleave.self_int)
def repeat_interleave(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    """``x.repeat_interleave(r, dim)``: each element of ``dim`` becomes ``r`` adjacent ones, so a block of
    ``dim`` maps to a block of the output and the dim may split like the others; ``dim=None`` flattens (the
    result stays whole)."""
    b = bind(node.target, node.args, node.kwargs)
    x = node.args[0]
    n = len(_shape(x))
    if b["dim"] is None and n > 1:
        letters = tuple(fresh_letters(n))
        dm = DimMap((letters,), ((None,),), unsplittable=frozenset(letters), linear_in=_LINEAR0)
        return strategies_from_map(node, (x,), dm, mesh_shape)
    fixed_size = b.get("output_size") is not None  # a global size: the repeated dim must stay whole
    return _keep_whole(node, mesh_shape, [int(b["dim"]) % max(n, 1)] if fixed_size else [])


# -- join: cat, stack ----------------------------------------------------------------------------------------------


def _join(node: fx.Node, mesh_shape: tuple[int, ...], *, new_dim: bool) -> list[OpStrategy]:
    b = bind(node.target, node.args, node.kwargs)
    tensors = [t for t in b["tensors"] if isinstance(t, fx.Node)]
    out_shape = _shape(node)
    n_in = len(out_shape) - 1 if new_dim else len(out_shape)
    dim = int(b["dim"]) % len(out_shape)
    out = tuple(fresh_letters(len(out_shape)))
    letters: Letters = tuple(c for d, c in enumerate(out) if not (new_dim and d == dim))
    # legacy empty 1-D inputs (shape (0,)) are skipped by cat: leave them unconstrained
    roles = [t if len(_shape(t)) == n_in else None for t in tensors]
    dm = DimMap(
        tuple(letters if r is not None else None for r in roles),
        (out,),
        unsplittable=frozenset(out[dim]),
        linear_in=(frozenset(i for i, r in enumerate(roles) if r is not None),),
    )
    return strategies_from_map(node, roles, dm, mesh_shape)


@register(aten.cat.default)
def cat(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    """The cat dim stays whole; other dims batch-like; Partial when every input is Partial."""
    return _join(node, mesh_shape, new_dim=False)


@register(aten.stack.default)
def stack(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    return _join(node, mesh_shape, new_dim=True)


# -- triangular masks ----------------------------------------------------------------------------------------------


def _tri_local(ctx: LocalContext) -> LocalCall:
    x = ctx.node.args[0]
    assert isinstance(x, fx.Node)
    n = len(_shape(x))
    row0, _ = ctx.in_range(x, n - 2)
    col0, _ = ctx.in_range(x, n - 1)
    diagonal = int(ctx.bound()["diagonal"]) + row0 - col0
    args, kwargs = with_arg(ctx.node.target, ctx.args, ctx.kwargs, "diagonal", diagonal)
    return LocalCall(ctx.target, args, kwargs)


@register(aten.tril.default, aten.triu.default, local_args=_tri_local)
def tril(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    """Every dim splittable: a piece keeps ``j - i >= diagonal`` with its own row/column offsets."""
    letters = tuple(fresh_letters(len(_shape(node.args[0]))))
    return strategies_from_map(
        node, (node.args[0],), DimMap((letters,), (letters,), linear_in=_LINEAR0), mesh_shape
    )
