"""The min-plus table kernel of variable elimination: a bucket's parts summed and minimised over a variable.

Input: domain sizes, the eliminated variable ``var``, the bucket's parts ``(scope, table)`` (scopes sorted,
tables indexed in scope order) and the variables to keep.  Output: ``min`` of the parts' sum over every
variable outside ``keep``, as a table over ``keep`` in increasing order (:func:`reduced`).

Contract (bit for bit): every entry of the sum is the parts added *in their order*, ``((p0 + p1) + p2) +
...``, as :meth:`~autoshard.search.exact.ExactSolver._back` adds them at the chosen plan, so the argmin it
recomputes there is the first minimum of the same numbers.  ``min`` itself never rounds, so any grouping of
the *minimisation* gives the same table; only the additions' order is fixed.  Hence the freedom used here:

* the leading parts whose sum stays smaller than the whole table (a unary cost and one pair matrix: a
  ``S_var x S_a`` table) are added once, at their own shape, not once per slab;
* the whole table is never allocated: it is built a slab at a time (:data:`SLAB` entries, in cache) and
  each slab reduced at once into its share of the output (``np.minimum.reduce(..., out=)``), one buffer
  reused for every slab;
* the table's axes are var's, then the others in increasing order but for the largest domain, moved last
  (:func:`_inner_last`): numpy's inner loops run along the last axis, and a 4-strategy variable there made
  each of them four entries long (the 405B stage's relaxed solves: its 575 kernel calls 2.64 -> 1.12 s CPU);
  the output is transposed back to ``keep``'s order, every entry the same sum;
* eliminating ``var`` alone (the usual step: ~80 % of LLaMA-3-70B's table entries), the slabs run along
  the first *kept* variable, so each slab holds every strategy of ``var`` and reduces straight into its
  rows of the output: no running ``np.minimum`` over slabs and no temporary per slab.

LLaMA-3-70B on 16 x 8 x 8, its plan's 1,953 calls (1.6e9 table entries) replayed (``python -m
benchmarks.minplus 70``): the same tables to the bit; 1.47 -> 1.33 s CPU against the whole-slab kernel
before (2 MiB slabs along ``var``, a running minimum), 1.29 s with tables recalled across solves
(:mod:`~autoshard.search.recall`), on a machine at load 9 (quiet: ~0.9 s before).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from autoshard.search.recall import LEAST, recall

__all__ = ["SLAB", "fold_min", "reduced"]

#: Entries of one slab of a bucket's table (512 KiB of float64, within this machine's 2 MiB L2 cache with
#: the inputs beside it): variable elimination sums and minimises a bucket a slab at a time, so no table
#: of ``S^(width+1)`` entries is allocated (LLaMA-3-70B on 16 x 8 x 8: 7.8 M entries, 62 MB, per solve)
#: and each slab is summed and reduced while in cache.
SLAB = 1 << 16


def reduced(
    sizes: Sequence[int] | Mapping[int, int],
    var: int,
    parts: Sequence[tuple[tuple[int, ...], np.ndarray]],
    keep: Sequence[int],
) -> np.ndarray:
    """``min`` of the sum of ``parts`` over every variable of theirs outside ``keep`` (module doc)."""
    keep = tuple(sorted(keep))
    order = (var, *_inner_last(sorted({w for f, _ in parts for w in f}.union(keep) - {var}), sizes))
    full = tuple(sizes[w] for w in order)
    lined = []  # each part aligned to ``order``: var's axis first, size 1 where it is absent
    for fscope, arr in parts:
        axes = sorted(range(len(fscope)), key=lambda k: order.index(fscope[k]))
        if axes != list(range(len(fscope))):  # var to the front, the largest domain to the back: a view
            arr = np.transpose(arr, axes)
        lined.append(arr.reshape([sizes[w] if w in fscope else 1 for w in order]))
    drop = tuple(k for k, w in enumerate(order) if w not in keep)
    made = [w for w in order[1:] if w in keep]  # the output's axes: the kept variables in ``order``...
    at = -1
    if var in keep:  # ... with var among them where it sorts
        at = sum(1 for w in made if w < var)
        made.insert(at, var)
    if math.prod(full) < LEAST:
        return _in_order(_reduce(lined, full, drop, at), made, keep)
    arrays = [arr for _, arr in parts]  # a large table: another solver's, when it had the same parts
    key = recall.key((full, drop, at, tuple(tuple(order.index(w) for w in f) for f, _ in parts)), arrays)
    found = recall.find(key, arrays)
    if found is None:
        found = _in_order(_reduce(lined, full, drop, at), made, keep)
        recall.keep(key, arrays, found)
    return found


def _inner_last(rest: list[int], sizes: Sequence[int] | Mapping[int, int]) -> list[int]:
    """``rest`` (sorted) with its largest domain moved last, where numpy's inner loops run: a 4-strategy
    variable there (the 405B stage's relaxed problems, sorted last by its index) made every inner loop four
    entries long, 13-14 ns an entry against 4-6 ns with a domain of ~100 there."""
    if len(rest) < 2:
        return rest
    big = max(rest, key=lambda w: sizes[w])  # the first of the largest: deterministic
    if sizes[big] <= sizes[rest[-1]]:
        return rest
    return [w for w in rest if w != big] + [big]


def _in_order(table: np.ndarray, made: list[int], keep: tuple[int, ...]) -> np.ndarray:
    """``table``, whose axes are the variables ``made``, with its axes in ``keep``'s (increasing) order."""
    if list(keep) == made:
        return table
    return np.ascontiguousarray(np.transpose(table, [made.index(w) for w in keep]))


def _reduce(lined: list[np.ndarray], full: tuple[int, ...], drop: tuple[int, ...], at: int) -> np.ndarray:
    """The parts aligned to the table's axes (var's first), summed and minimised over ``drop``; ``at``:
    var's place among the kept variables (-1: not kept)."""
    head, rest = _prefix(lined, full)
    if drop == (0,) and len(full) > 1:
        return _over_var(head, rest, full)
    return _by_var_slabs(head, rest, full, drop, at >= 0, max(at, 0))


def _prefix(lined: list[np.ndarray], full: tuple[int, ...]) -> tuple[np.ndarray, list[np.ndarray]]:
    """The leading parts added while their sum is smaller than ``full``, and the parts left to add."""
    head = lined[0]
    for k, a in enumerate(lined[1:], 1):
        if np.broadcast_shapes(head.shape, a.shape) == full:
            return head, lined[k:]
        head = head + a
    return head, []


def _over_var(head: np.ndarray, rest: list[np.ndarray], full: tuple[int, ...]) -> np.ndarray:
    """``min`` over axis 0 (var) only: slabs along axis 1, each reduced straight into its output rows."""
    out = np.empty(full[1:])
    width = max(1, SLAB // max(1, full[0] * math.prod(full[2:])))
    buf = np.empty((full[0], min(width, full[1]), *full[2:])) if rest else None
    for lo in range(0, full[1], width):
        hi = min(full[1], lo + width)
        table = head[:, lo:hi] if head.shape[1] > 1 else head
        if buf is None:
            table = np.broadcast_to(table, (full[0], hi - lo, *full[2:]))
        else:
            table = np.add(table, _cut(rest[0], lo, hi), out=buf[:, : hi - lo])
            for a in rest[1:]:
                np.add(table, _cut(a, lo, hi), out=table)
        np.minimum.reduce(table, axis=0, out=out[lo:hi])
    return out


def _cut(a: np.ndarray, lo: int, hi: int) -> np.ndarray:
    return a[:, lo:hi] if a.shape[1] > 1 else a


def _by_var_slabs(
    head: np.ndarray,
    rest: list[np.ndarray],
    full: tuple[int, ...],
    drop: tuple[int, ...],
    kept: bool,
    at: int,
) -> np.ndarray:
    """Any other reduction: slabs along var's axis; kept, each slab fills its rows of the output, else
    the slabs' minima are combined.  ``at``: var's place among the kept variables."""
    inner = math.prod(full[1:])
    slab = max(1, SLAB // max(inner, 1))
    buf = np.empty((min(slab, full[0]), *full[1:])) if rest else None
    out: np.ndarray | None = None
    for lo in range(0, full[0], slab):
        hi = min(full[0], lo + slab)
        table = head[lo:hi] if head.shape[0] > 1 else head
        if buf is None:
            table = np.broadcast_to(table, (hi - lo, *full[1:]))
        else:
            table = np.add(table, rest[0][lo:hi] if rest[0].shape[0] > 1 else rest[0], out=buf[: hi - lo])
            for a in rest[1:]:
                np.add(table, a[lo:hi] if a.shape[0] > 1 else a, out=table)
        if kept:
            if out is None:
                out = np.empty((full[0], *(n for k, n in enumerate(full[1:], 1) if k not in drop)))
            if drop:
                np.minimum.reduce(table, axis=drop, out=out[lo:hi])
            else:
                out[lo:hi] = table
        else:
            low = np.minimum.reduce(table, axis=drop)
            out = low if out is None else np.minimum(out, low)  # (a scalar when nothing is kept)
    assert out is not None
    return np.moveaxis(out, 0, at) if kept and at else out


def fold_min(u: np.ndarray, mats: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Argmin and min over ``v``'s strategies of ``u[v] + mats[0][a, v] (+ mats[1][b, v])``, per ``a (, b)``:
    eliminating a node of degree <= 2 (:mod:`~autoshard.search.reduce`), the parts added in that order."""
    table = u.reshape((1,) * len(mats) + (-1,))
    for k, mat in enumerate(mats):
        shape = [1] * (len(mats) + 1)
        shape[k], shape[-1] = mat.shape
        table = table + mat.reshape(shape)  # (S_nbr0, [S_nbr1,] S_v)
    arg = np.asarray(np.argmin(table, axis=-1))  # the minimum read at the argmin: a minimum along the short
    # last axis runs row by row (15 ms on a (200, 200, 27) table, against 2 ms for both)
    return arg, np.take_along_axis(table, arg[..., None], axis=-1)[..., 0]
