"""Redistribution prices for whole edge-cost matrices at once: the same numbers, without a search per pair.

:func:`autoshard.redistribute.redistribute_time` prices one (source spec, target spec) pair by a Dijkstra search
over layouts; an edge needs every pair of the producer's and consumer's distinct specs (LLaMA-3-8B on a 3-D
mesh: ~430k pairs over ~175 layout graphs; a Python search per pair took 36 s of 54 s of planning).

Here each layout graph, one per (tensor shape, element size, mesh), is built once from the move list the
search itself walks (``redistribute_steps._moves``), priced by the cluster's ``collective_time`` (a zigzag
cluster's: its plain cluster's graph with the moves on its axis repriced).  Shortest paths then come from a
vectorised Bellman-Ford over every source layout an edge needs at once (numpy, rows = sources).  Per target,
only the axes where the target is ``P`` may be entered as ``P`` (as in the search): one edge set per mask.

Exactness: Bellman-Ford computes ``D[s, v] = min(D[s, v], D[s, u] + w(u, v))``, the same left-to-right float
sums the Dijkstra search accumulates along a path, and both return the minimum over all paths of that sum;
``tests/problem/test_pricing.py`` checks bit-for-bit equality with :func:`redistribute_time`.

Dim order: a layout graph depends on the tensor's dims only through their sizes (which moves divide, and
the bytes each moves), so the graphs of two shapes that order the same sizes differently are one graph with
its dims renamed, and so are their shortest paths.  Each shape is priced on its dims sorted by size
(``(B, H, S, D)`` and ``(B, S, H, D)`` share one graph): LLaMA-3-70B on 16 x 8 x 8 builds 36 graphs instead
of 42, among them the two largest twice.  Path sums are the same floats whatever the move order
(``_bellman_ford``), so the tables are too.  A dim of size 1 adds nothing either: no mesh axis of size > 1
divides it (axes of size 1 carry no layout) and it leaves every local size's product alone, so it is
dropped (``(1, 8, H, S, D)`` is priced on the graph of ``(8, H, S, D)``; 70B: 27 graphs, not 36).

Special cases follow :meth:`autoshard.problem.costs.StepCache.time`: ``None`` on either side costs 0, equal
specs cost 0, a spec that does not fit the tensor or a non-sum ``Partial`` makes the pair impossible (inf).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from autoshard.cluster import Cluster
from autoshard.placement import Shard, ShardingSpec
from autoshard.problem.pairs import spec_pairs
from autoshard.problem.shortest import bellman_ford as _bellman_ford
from autoshard.problem.skeleton import skeleton
from autoshard.redistribute_steps import (
    _P,
    COLLECTIVE_KINDS,
    _non_sum_partial,
)
from autoshard.redistribute_steps import (
    _encode as _encode_layout,
)

if TYPE_CHECKING:
    from autoshard.problem.costs import StepCache

__all__ = ["PriceTable", "pairwise_ids"]


@dataclass(frozen=True, slots=True)
class _Graph:
    """Every layout of one (shape, itemsize) on the mesh that fits, and the priced moves between them."""

    index: dict[tuple[int, ...], int]  # layout -> row/column
    u: np.ndarray  # move sources (layout index)
    v: np.ndarray  # move targets
    w: np.ndarray  # seconds
    enters_p: np.ndarray  # (moves,) bool per axis: the axis whose move enters P, -1 for none
    axis: np.ndarray  # the mesh axis of each move
    moves: tuple[tuple[str, int, int], ...]  # (kind, bytes, axis) of each move: what its price is asked for
    # the moves each P-axis mask allows, sorted for relaxation: price-free, one dict per skeleton, shared by
    # its graphs and their zigzag copies (problem/shortest.py ``_order``)
    orders: dict = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class _Plan:
    """What one table reads of the layouts alone, no price (a zigzag cluster's table reads its plain one's)."""

    template: np.ndarray  # zeros, inf where a side does not fit or is a non-sum partial (read-only)
    free: np.ndarray  # bool: the pairs that never move (equal specs, None on a side), set to 0 last
    canon: tuple[int, ...]  # the shape the layout graph is built on (module docstring: "Dim order")
    start_idx: np.ndarray  # the layouts of the source specs that are layouts of the graph (the live rows)
    # per P-axis mask: the cells of the live rows and its goal columns (an open mesh), the goals' layouts
    groups: tuple[tuple[tuple[bool, ...], tuple[np.ndarray, np.ndarray], np.ndarray], ...]


class PriceTable:
    """Memoised all-sources shortest paths per layout graph, for one cluster; ``base``: (the plain cluster's
    table, the zigzag axis) for a :class:`~autoshard.problem.context.ZigzagCluster` (:meth:`_graph`)."""

    def __init__(self, cluster: Cluster, base: tuple[PriceTable, int] | None = None) -> None:
        self.cluster, self.base = cluster, base
        self.mesh_shape = tuple(cluster.mesh_shape)
        self._graphs: dict[tuple[tuple[int, ...], int], _Graph] = {}
        # (shape, itemsize, P-axis mask) -> (per layout its row or -1, distances (rows, layouts))
        self._rows: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        self._prices: dict[tuple[str, int, int], float] = {}
        # pairwise(): (src specs, dst specs, shape, itemsize) -> table; _start(): (spec, shape) -> sorted-dims layout
        self._tables: dict[tuple, np.ndarray] = {}
        self._plans: dict[tuple, _Plan] = {}  # _plan(): the same keys
        self._starts: dict[tuple[ShardingSpec, tuple[int, ...]], tuple[int, ...] | str]
        self._starts = base[0]._starts if base else {}  # a layout reads the mesh alone: shared with the plain

    @staticmethod
    @functools.lru_cache(maxsize=8)
    def for_cluster(cluster: Cluster) -> PriceTable:
        """One shared table per cluster: a re-plan on the same mesh (the recomputation retry, another
        input shape) reuses every layout graph and shortest path already priced."""
        from autoshard.problem.context import plain_cluster, zigzag_axis_of

        axis = zigzag_axis_of(cluster)
        base = None if axis is None else (PriceTable.for_cluster(plain_cluster(cluster)), axis)
        return PriceTable(cluster, base)

    # -- the public entry --------------------------------------------------------------------------------------
    def pairwise(
        self,
        src: Sequence[ShardingSpec | None],
        dst: Sequence[ShardingSpec | None],
        shape: tuple[int, ...],
        itemsize: int,
    ) -> np.ndarray:
        """``T[i, j]``: seconds to redistribute ``src[i]`` into ``dst[j]`` (specs distinct on each side).

        Memoised per (specs, shape, itemsize): the edges of a transformer ask for the same tables many times
        (LLaMA-3-70B on 16 x 8 x 8: 282 tables per build, 109 distinct) and every build of a plan asks again.
        The table returned is read-only (shared)."""
        key = (tuple(src), tuple(dst), shape, itemsize)
        found = self._tables.get(key)
        if found is not None:
            return found
        # a zigzag cluster's table reads the layouts of its plain cluster's: only the prices differ
        plan = (self.base[0] if self.base else self)._plan(key)
        table = plan.template.copy()
        if plan.groups:
            graph = self._graph(plan.canon, itemsize)
            for mask, cells, goal_idx in plan.groups:
                rows, dist = self._distances(plan.canon, itemsize, mask, graph, plan.start_idx)
                table[cells] = dist[rows[plan.start_idx][:, None], goal_idx]
        table[plan.free] = 0.0
        table.setflags(write=False)
        self._tables[key] = table
        return table

    def _plan(self, key: tuple) -> _Plan:
        """What the table ``key`` reads of the layouts alone (no price): kept per key."""
        found = self._plans.get(key)
        if found is None:
            found = self._plans[key] = self._layouts(*key)
        return found

    def _layouts(
        self, src: tuple[ShardingSpec | None, ...], dst: tuple[ShardingSpec | None, ...], shape, itemsize: int
    ) -> _Plan:
        table = np.zeros((len(src), len(dst)))
        # one layout graph per shape up to the order of its dims (module docstring: "Dim order")
        canon, perm = _canonical(shape)
        starts = [self._start(s, shape, perm) for s in src]
        goals = [self._start(d, shape, perm) for d in dst]
        by_mask: dict[tuple[bool, ...], list[int]] = {}
        for j, g in enumerate(goals):
            if isinstance(g, tuple):
                by_mask.setdefault(tuple(p == _P for p in g), []).append(j)
            elif g != "none":
                table[:, j] = math.inf
        for i, s in enumerate(starts):
            if not isinstance(s, tuple) and s != "none":
                table[i, :] = math.inf
        live = [i for i, s in enumerate(starts) if isinstance(s, tuple)]
        table.setflags(write=False)
        free = self._free(src, dst, starts)
        if not live or not by_mask:
            return _Plan(table, free, canon, np.zeros(0, dtype=np.intp), ())
        index = self._graph(canon, itemsize).index
        start_idx = np.array([index[starts[i]] for i in live], dtype=np.intp)  # type: ignore[index]
        rows = np.array(live, dtype=np.intp)[:, None]
        goal_idx = [index[g] if isinstance(g, tuple) else -1 for g in goals]  # every grouped goal is a layout
        groups = tuple(
            (m, (rows, np.array(cols, dtype=np.intp)), np.array([goal_idx[j] for j in cols], dtype=np.intp))
            for m, cols in by_mask.items()
        )
        return _Plan(table, free, canon, start_idx, groups)

    @staticmethod
    def _free(src: Sequence, dst: Sequence, starts: list) -> np.ndarray:
        """Equal specs that fit never move (a non-sum partial may stay as it is); None on either side is free."""
        free = np.zeros((len(src), len(dst)), dtype=bool)
        where = {spec: j for j, spec in enumerate(dst)}
        for i, spec in enumerate(src):
            j = where.get(spec)
            if spec is not None and j is not None and starts[i] != "unfit":
                free[i, j] = True
        for i, s in enumerate(starts):
            if s == "none":
                free[i, :] = True
        for j, spec in enumerate(dst):
            if spec is None:
                free[:, j] = True
        free.setflags(write=False)
        return free

    def _start(
        self, spec: ShardingSpec | None, shape: tuple[int, ...], perm: tuple[int, ...]
    ) -> tuple[int, ...] | str:
        """The encoded layout on the dims sorted by size (``perm`` of :func:`_canonical`), ``"none"`` (costs
        nothing), ``"unfit"`` (does not fit the tensor: impossible even unchanged) or ``"bad"`` (a non-sum
        partial: it may only stay as it is)."""
        if spec is None:
            return "none"
        key = (spec, shape)
        found = self._starts.get(key)
        if found is None:
            found = self._starts[key] = _relabel(self._encode(spec, shape), perm)
        return found

    def _encode(self, spec: ShardingSpec, shape: tuple[int, ...]) -> tuple[int, ...] | str:
        # ShardingSpec.check_fits's test without its message (most specs of a strategy list do not fit)
        sharded = _sharded(spec, self.mesh_shape)
        if sharded is None or any(d >= len(shape) for d, _ in sharded):
            return "unfit"
        counts = [1] * len(shape)
        for d, n in sharded:
            counts[d] *= n
        if any(s % c for s, c in zip(shape, counts, strict=True)):
            return "unfit"
        if _non_sum_partial(spec) is not None:
            return "bad"
        return _spec_layout(spec, self.mesh_shape)

    # -- graphs and distances -----------------------------------------------------------------------------------
    def _graph(self, shape: tuple[int, ...], itemsize: int) -> _Graph:
        key = (shape, itemsize)
        found = self._graphs.get(key)
        if found is None:
            if self.base is None:
                found = self._build(shape, itemsize)
            else:  # the plain graph, the moves on the zigzag axis repriced: off it, a ZigzagCluster's
                table, axis = self.base  # collective_time is the plain one's (the same float)
                found = table._graph(shape, itemsize)
                w = found.w.copy()
                for k in np.flatnonzero(found.axis == axis):
                    w[k] = self._price(*found.moves[k])
                found = dataclasses.replace(found, w=w)
            self._graphs[key] = found
        return found

    def _build(self, shape: tuple[int, ...], itemsize: int) -> _Graph:
        """The skeleton of ``shape`` (shared by shapes that divide alike: :mod:`autoshard.problem.skeleton`),
        its moves' bytes and prices for this shape and cluster."""
        sk = skeleton(shape, self.mesh_shape)
        moves = tuple(zip(sk.kinds, sk.nbytes(shape, itemsize), sk.axis.tolist(), strict=True))
        w = np.array([self._price(*m) for m in moves], dtype=np.float64)
        return _Graph(sk.index, sk.u, sk.v, w, sk.enters_p, sk.axis, moves, sk.orders)

    def _price(self, kind: str, nbytes: int, axis: int) -> float:
        if kind not in COLLECTIVE_KINDS:
            return 0.0
        key = (kind, nbytes, axis)
        found = self._prices.get(key)
        if found is None:
            found = self._prices[key] = self.cluster.collective_time(kind, nbytes, axis=axis)
        return found

    def _distances(
        self,
        shape: tuple[int, ...],
        itemsize: int,
        mask: tuple[bool, ...],
        graph: _Graph,
        starts: np.ndarray | list[int],
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(rows, dist)``: shortest path prices from every start layout so far asked of this graph and mask,
        ``dist[rows[s]]`` from layout ``s`` (``rows[s] == -1``: not asked yet); the rows of ``starts`` are
        added first.  Rows keep their place as others are added."""
        key = (shape, itemsize, mask)
        found = self._rows.get(key)
        if found is None:
            found = (np.full(len(graph.index), -1, dtype=np.intp), np.zeros((0, len(graph.index))))
        rows, dist = found
        starts = np.asarray(starts, dtype=np.intp)
        new = rows[starts] < 0
        if new.any():
            missing = np.unique(starts[new]).tolist()
            warm = None
            if any(mask):  # every path with one P axis fewer is a path here too: start from those prices
                # drop the outermost P axis: the innermost (fastest) one's moves into P lower the most prices,
                # so they stay in the warm start (70B on 16 x 8 x 8: a warm start without them costs 7x more)
                first = min(a for a, m in enumerate(mask) if m)
                fewer = tuple(m and a != first for a, m in enumerate(mask))
                sub_rows, sub_dist = self._distances(
                    shape, itemsize, fewer, graph, np.array(missing, dtype=np.intp)
                )
                warm = (fewer, sub_dist[sub_rows[missing]])
            more = _bellman_ford(graph, mask, missing, warm)
            rows = rows.copy()
            rows[missing] = np.arange(len(dist), len(dist) + len(missing))
            dist = np.vstack([dist, more])
            self._rows[key] = (rows, dist)
        return rows, dist


def pairwise_ids(
    src: Sequence[int] | np.ndarray, dst: Sequence[int] | np.ndarray, shape, itemsize: int, cache: StepCache
) -> np.ndarray:
    """``T[i, j]`` = seconds of interned spec ``src[i]`` -> ``dst[j]`` (-1 is None: free), as
    :meth:`StepCache.time` prices one pair, each distinct pair priced once, a whole table at a time."""
    return spec_pairs(src, dst, shape, itemsize, cache).table(cache.prices)


_spec_layout = functools.lru_cache(maxsize=4096)(_encode_layout)  # the layout does not depend on the shape


@functools.lru_cache(maxsize=4096)  # isinstance on torch placements is slow; a plan sees few distinct specs
def _sharded(spec: ShardingSpec, mesh_shape: tuple[int, ...]) -> tuple[tuple[int, int], ...] | None:
    """(dim, axis size) per axis that shards a dim; None when ``spec`` has not one placement per mesh axis."""
    if spec.mesh_ndim != len(mesh_shape):
        return None
    return tuple((p.dim, n) for p, n in zip(spec.placements, mesh_shape, strict=True) if isinstance(p, Shard))


@functools.lru_cache(maxsize=1024)
def _canonical(shape: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``shape`` with its dims of size 1 dropped and the others sorted by size (ties by position), and where
    each dim goes: ``perm[d]`` (out of range for a dim of size 1: no layout that fits shards one)."""
    order = sorted((d for d in range(len(shape)) if shape[d] != 1), key=lambda d: (shape[d], d))
    perm = [len(shape) + d for d in range(len(shape))]
    for new, d in enumerate(order):
        perm[d] = new
    return tuple(shape[d] for d in order), tuple(perm)


def _relabel(layout: tuple[int, ...] | str, perm: tuple[int, ...]) -> tuple[int, ...] | str:
    """An encoded layout with each sharded dim ``d`` renamed ``perm[d]`` (``R``/``P`` codes are negative)."""
    if isinstance(layout, str):
        return layout
    return tuple(perm[p] if p >= 0 else p for p in layout)
