"""Shortest path prices over one layout graph (:mod:`autoshard.problem.pricing`): a vectorised Bellman-Ford.

Input: a layout graph (its moves sorted into ``u``, ``v``, ``w`` arrays), the mesh axes that may be entered as
``P``, the start layouts, optionally the converged prices of a smaller mask.  Output: per start, the least
left-to-right float sum over every path to each layout, the sums the Dijkstra search of
:func:`autoshard.redistribute.redistribute_time` accumulates (``tests/problem/test_pricing.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from autoshard.problem.pricing import _Graph

__all__ = ["allowed_moves", "bellman_ford"]


def allowed_moves(graph: _Graph, mask: tuple[bool, ...]) -> np.ndarray:
    """Per move, whether it may be taken when only the ``mask`` axes may be entered as ``P``."""
    return np.array([True, *mask])[graph.enters_p + 1]  # enters_p == -1 -> index 0 (always allowed)


def bellman_ford(
    graph: _Graph,
    mask: tuple[bool, ...],
    starts: list[int],
    warm: tuple[tuple[bool, ...], np.ndarray] | None = None,
) -> np.ndarray:
    """Shortest path prices from each of ``starts`` to every layout, moves into ``P`` only on ``mask`` axes.

    Rows of the working table are layouts and columns the starts, so a relaxation gathers whole rows (moves
    sorted by target: one ``minimum.reduceat`` per round takes the best move into each layout).

    ``warm``: a smaller mask and its converged prices from the same starts.  Those are prices of paths that
    exist here too, and they already satisfy every move of the smaller graph, so only the moves added since
    can lower them at first.  The result is the same bit for bit: once no move lowers anything, each entry
    is the least left-to-right float sum over all paths, whatever upper bounds the search started from
    (rounding is monotone: ``a <= b`` gives ``a + w <= b + w``).

    A round relaxes only the moves out of layouts whose price just fell (or every move once a quarter of them
    are such: a move that lowers nothing changes nothing, so the fixed point, hence every result, is the same
    bit for bit; :class:`_Blocks` relaxes them all without ``reduceat``), and only the start columns where a
    price fell (a column's prices depend on that column alone): after the first rounds few starts still
    change (70B on 16 x 8 x 8: 15-40 of 234).  Those columns are copied out together (a contiguous working
    table: row gathers, not a gather of rows and columns) and written back once they are final."""
    o = _order(graph, mask)
    u, v, w = o.u, o.v, graph.w[o.sel, None]
    changed = np.zeros(len(graph.index), dtype=bool)
    if warm is None:
        dist = np.full((len(graph.index), len(starts)), math.inf)  # (layouts, starts)
        dist[starts, np.arange(len(starts))] = 0.0
        column = np.full(len(graph.index), -1)
        column[starts] = np.arange(len(starts))
        first = column[u] >= 0  # the first round in closed form: one move out of a start costs 0.0 + w == w
        np.minimum.at(dist, (v[first], column[u[first]]), w[first, 0])
        changed[v[first]] = True
        active = changed[u]  # only moves out of a layout whose price just fell can lower anything
    else:
        dist = np.array(warm[1].T)
        active = o.added(graph, warm[0])  # the moves the smaller mask did not allow
    work, held = dist, None  # held: the start columns still falling, which work copies (None: work is dist)
    buf = np.empty(len(u) * len(starts))  # the gathered sums of a round, written in place (_sums)
    full: _Blocks | None = None  # built on the first round that relaxes every move (warm starts seldom do)
    for _ in range(len(graph.index)):
        count = np.count_nonzero(active)
        if not count:
            break
        if count * _FULL >= len(u):  # most moves: relax them all, a minimum per rank block (_Blocks)
            full = full or _Blocks(o.blocks.u, w[o.blocks.order], o.blocks.targets, o.blocks.sizes)
            relaxed, targets = full.relax(work, buf), full.targets
        else:
            au, av, aw = u[active], v[active], w[active]
            heads = _heads(av)
            targets = av[heads]
            relaxed = np.minimum.reduceat(_sums(work, au, aw, buf), heads, axis=0)
        current = work[targets]
        better = relaxed < current
        changed[:] = False
        changed[targets] = better.any(axis=1)
        work[targets] = np.minimum(relaxed, current)
        fell = better.any(axis=0)
        if not fell.all():  # a column where nothing fell is final: keep relaxing the others, compacted
            if held is not None:
                dist[:, held] = work
            held = np.flatnonzero(fell) if held is None else held[fell]
            work = dist[:, held]
            if not len(held):
                break
        active = changed[u]
    if held is not None and len(held):
        dist[:, held] = work
    return dist.T


#: relax every move once a 1/_FULL share of them is active (tuned on 70B: the answer is the same either way)
_FULL = 4


@dataclass(frozen=True, slots=True)
class _Ranks:
    """Every move ordered for a relaxation without ``minimum.reduceat`` (half of the search's time, 70B).

    Moves are sorted by rank (the k-th move into its target), then by target, targets ordered by in-degree
    (most first): rank k's block is the same targets as rank 0's, cut to the first ``sizes[k]``, so the best
    move into each target is one ``minimum`` per rank over contiguous rows.  A minimum is exact, so the rows
    are the ones ``reduceat`` gives, in the order of ``targets``.  No price enters: ``order`` (into the moves
    sorted by target) gathers each graph's prices (:class:`_Blocks`)."""

    order: np.ndarray
    u: np.ndarray
    targets: np.ndarray
    sizes: tuple[int, ...]

    @staticmethod
    def of(u: np.ndarray, v: np.ndarray, heads: np.ndarray) -> _Ranks:
        counts = np.diff(np.append(heads, len(v)))
        by_degree = np.argsort(-counts, kind="stable")
        place = np.empty(len(heads), dtype=np.int64)
        place[by_degree] = np.arange(len(heads))
        rank = np.arange(len(v)) - np.repeat(heads, counts)
        order = np.lexsort((np.repeat(place, counts), rank))
        return _Ranks(order, u[order], v[heads][by_degree], tuple(np.bincount(rank).tolist()))


@dataclass(frozen=True, slots=True)
class _Blocks:
    """:class:`_Ranks` with one graph's prices: a full relaxation round."""

    u: np.ndarray
    w: np.ndarray
    targets: np.ndarray
    sizes: tuple[int, ...]

    def relax(self, work: np.ndarray, buf: np.ndarray) -> np.ndarray:
        sums = _sums(work, self.u, self.w, buf)
        best, start = sums[: self.sizes[0]], self.sizes[0]
        for size in self.sizes[1:]:
            np.minimum(best[:size], sums[start : start + size], out=best[:size])
            start += size
        return best  # a view of buf: read before the next round writes it


@dataclass(frozen=True, slots=True)
class _Order:
    """The moves one P-axis mask allows, sorted by target, and their :class:`_Ranks`: what a relaxation reads
    of a layout graph's structure alone.  Every graph of one skeleton (:mod:`autoshard.problem.skeleton`: the
    shapes that divide alike, and a zigzag cluster's copy of a plain graph) has the same moves in the same
    order, only other prices, so it is kept per skeleton and mask (``graph.orders``) and each call gathers its
    own prices by ``sel``: the arrays a call sorting afresh makes, so the same relaxations and results."""

    sel: np.ndarray  # the allowed moves, in target order (a stable sort): indices into the graph's moves
    u: np.ndarray
    v: np.ndarray
    blocks: _Ranks
    warm: dict[tuple[bool, ...], np.ndarray]  # per smaller mask, the moves it did not allow (added())

    def added(self, graph: _Graph, fewer: tuple[bool, ...]) -> np.ndarray:
        """Per move (in this order), whether mask ``fewer`` did not allow it: a warm start's first moves."""
        found = self.warm.get(fewer)
        if found is None:
            found = self.warm[fewer] = ~allowed_moves(graph, fewer)[self.sel]
        return found


def _order(graph: _Graph, mask: tuple[bool, ...]) -> _Order:
    found = graph.orders.get(mask)
    if found is None:
        allowed = np.flatnonzero(allowed_moves(graph, mask))
        sel = allowed[np.argsort(graph.v[allowed], kind="stable")]
        u, v = graph.u[sel], graph.v[sel]
        found = graph.orders[mask] = _Order(sel, u, v, _Ranks.of(u, v, _heads(v)), {})
    return found


def _sums(work: np.ndarray, au: np.ndarray, aw: np.ndarray, buf: np.ndarray) -> np.ndarray:
    """``work[au] + aw`` (per move, its source's prices plus its own), the same floats, into the front of
    ``buf``: a fresh table each round cost more than the sums (LLaMA-3-70B: 6 MB, page faults each time)."""
    out = buf[: len(au) * work.shape[1]].reshape(len(au), work.shape[1])
    np.take(
        work, au, axis=0, out=out, mode="clip"
    )  # indices are layouts: "clip" never clips, only skips a copy
    return np.add(out, aw, out=out)


def _heads(targets: np.ndarray) -> np.ndarray:
    """Where each run of equal targets starts (moves sorted by target): ``minimum.reduceat``'s segments; none
    for no move (a one-device mesh's graph)."""
    if not len(targets):
        return np.zeros(0, dtype=np.intp)
    return np.flatnonzero(np.concatenate(([True], targets[1:] != targets[:-1])))
