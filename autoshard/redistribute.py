"""Redistribution: how a tensor laid out under one :class:`ShardingSpec` becomes another, as a list of steps.

This module is the single source of truth for spec → spec changes: the cost model prices its steps
(:func:`redistribute_time`), codegen emits them, the report prints them, and
:func:`autoshard.redistribute_local.apply_steps_local` executes them on the simulated mesh as the reference
semantics codegen must match.

Input: source and target spec, the global shape, the element size, the mesh shape (and, optionally, a
cluster whose ``collective_time`` prices the steps).  Output: a tuple of :class:`Step`, each one collective
or local op on the process group of one mesh axis, executable with ``torch.distributed`` primitives there.

The move set (the step kinds, their bytes, the nesting rule) lives in :mod:`autoshard.redistribute_steps`;
the reference execution in :mod:`autoshard.redistribute_local`.

**Algorithm.**  A shortest-path search (Dijkstra) over layouts, i.e. one placement per axis (at most
``(ndim + 2) ** mesh_ndim`` of them), whose edges are the valid steps (``redistribute_steps._moves``).  An edge weighs
``cluster.collective_time(kind, nbytes, axis)`` when a cluster is given, else its ring volume
``(n−1)/n · S`` (``2(n−1)/n · S`` for all-reduce); local steps are free.  Ties go to less volume on outer
axes (the slower links, as clusters lay axes outermost-first over nodes), then to fewer steps; moves are
explored in a fixed order, so a plan depends on its inputs only.  ``P`` is offered only on axes where the
target has it (entering ``P`` is free, but leaving it needs a reduction that moves at least the bytes of
the gather or all-to-all it would replace).  Without special cases the search finds: ``reduce_scatter``
for ``P → S`` (not all-reduce + slice), ``all_to_all`` for ``S(i) → S(j)``, slices before reductions and
gathers (so those move fewer bytes), detours around nested shards, and the hierarchical all-reduce
``(P, P) → (R, R)`` = reduce-scatter inner, all-reduce outer on ``1/n`` of the bytes, all-gather inner.
Axes of size 1 carry no layout: their placements are treated as ``R``.

Cost: one search from a source settles every target at once; trees, edges and plans are memoised, so an
edge-cost matrix (one source, many targets) costs one search per row: ~0.1–0.3 ms per entry on 2-D and
3-D meshes.  Pass the *same* cluster wherever a plan is needed (or keep the steps in the plan record), so
that the steps priced are the steps emitted.

Example::

    >>> src, dst = ShardingSpec.parse("(S(0), S(0))"), ShardingSpec.parse("(R, S(0))")
    >>> for step in plan_redistribute(src, dst, (8, 8), 4, (2, 2)):
    ...     print(step)
    all_to_all(axis=1, dim=0->1, 64 B)
    all_gather(axis=0, dim=0, 128 B)
    all_to_all(axis=1, dim=1->0, 128 B)
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import NamedTuple, Protocol

from autoshard.errors import ShardingError
from autoshard.placement import ShardingSpec
from autoshard.redistribute_steps import (
    COLLECTIVE_KINDS,
    Step,
    StepKind,
    _Layout,
    _layout,
    _Move,
    _moves,
    _non_sum_partial,
    _targets,
)

__all__ = [
    "COLLECTIVE_KINDS",
    "CollectiveCost",
    "Step",
    "StepKind",
    "count_kinds",
    "plan_redistribute",
    "redistribute_time",
]


class CollectiveCost(Protocol):
    """What redistribution needs of a cluster: its mesh and the time of one collective on one axis."""

    @property
    def mesh_shape(self) -> tuple[int, ...]: ...

    def collective_time(self, kind: str, nbytes: int, axis: int = 0) -> float: ...

    def __hash__(self) -> int: ...  # plans and times are memoised per cluster


# -- search --------------------------------------------------------------------------------------------------
_Key = tuple[float, int, int]  # (time or ring volume, volume weighted by outerness, step count)


def _move_key(axis: int, move: _Move, mesh_shape: tuple[int, ...], cluster: CollectiveCost | None) -> _Key:
    kind, _, _, nbytes = move
    if kind not in COLLECTIVE_KINDS:
        return 0.0, 0, 1
    n = mesh_shape[axis]
    volume = (2 if kind == "all_reduce" else 1) * (n - 1) * nbytes // n
    primary = volume if cluster is None else cluster.collective_time(kind, nbytes, axis=axis)
    return primary, volume * (len(mesh_shape) - 1 - axis), 1


_Edge = tuple[_Key, _Layout, int, _Move]  # (price, next layout, axis, move)
# layout -> (previous layout, axis, move) on its cheapest path from the source
_Tree = dict[_Layout, tuple[_Layout, int, _Move]]


class _Graph(NamedTuple):
    """Everything the layouts and the prices of their moves depend on, besides the layouts themselves."""

    shape: tuple[int, ...]
    itemsize: int
    mesh_shape: tuple[int, ...]
    targets: tuple[tuple[int, ...], ...]  # from _targets
    cluster: CollectiveCost | None


@lru_cache(maxsize=1 << 10)
def _edge_table(graph: _Graph) -> dict[_Layout, tuple[_Edge, ...]]:
    """The priced moves out of each layout, shared by every search on ``graph``; filled lazily by _edges."""
    return {}


def _edges(layout: _Layout, table: dict[_Layout, tuple[_Edge, ...]], graph: _Graph) -> tuple[_Edge, ...]:
    edges = table.get(layout)
    if edges is None:
        shape, itemsize, mesh_shape, targets, cluster = graph
        moves = _moves(layout, shape, itemsize, mesh_shape, targets)
        edges = tuple((_move_key(axis, mv, mesh_shape, cluster), nxt, axis, mv) for axis, mv, nxt in moves)
        table[layout] = edges
    return edges


@lru_cache(maxsize=1 << 12)
def _shortest_tree(start: _Layout, graph: _Graph) -> tuple[_Tree, dict[_Layout, _Key]]:
    """Cheapest paths from ``start`` to every layout (Dijkstra), shared by all targets of one source,
    with each layout's price (its first component is the path's time when a cluster prices the moves).

    The returned dicts are cached: read them, never change them.
    """
    table = _edge_table(graph)
    best: dict[_Layout, _Key] = {start: (0.0, 0, 0)}
    came_from: _Tree = {}
    frontier: list[tuple[_Key, int, _Layout]] = [((0.0, 0, 0), 0, start)]
    pushed = 1
    while frontier:
        key, _, layout = heapq.heappop(frontier)
        if key > best[layout]:
            continue
        for d, nxt, axis, move in _edges(layout, table, graph):
            new_key = (key[0] + d[0], key[1] + d[1], key[2] + d[2])
            if nxt not in best or new_key < best[nxt]:
                best[nxt], came_from[nxt] = new_key, (layout, axis, move)
                heapq.heappush(frontier, (new_key, pushed, nxt))
                pushed += 1
    return came_from, best


def _shortest_plan(
    start: _Layout,
    goal: _Layout,
    shape: tuple[int, ...],
    itemsize: int,
    mesh_shape: tuple[int, ...],
    cluster: CollectiveCost | None,
) -> tuple[Step, ...]:
    targets = _targets(goal, len(shape), mesh_shape)
    came_from, _ = _shortest_tree(start, _Graph(shape, itemsize, mesh_shape, targets, cluster))
    assert goal in came_from, "every layout reaches every other through the fully replicated one"
    steps: list[Step] = []
    while goal != start:
        goal, axis, (kind, src_dim, dst_dim, nbytes) = came_from[goal]
        steps.append(Step(kind, axis, src_dim, dst_dim, nbytes))
    return tuple(reversed(steps))


# -- public API ----------------------------------------------------------------------------------------------
def plan_redistribute(
    src: ShardingSpec,
    dst: ShardingSpec,
    shape: Sequence[int],
    itemsize: int,
    mesh_shape: Sequence[int],
    *,
    cluster: CollectiveCost | None = None,
) -> tuple[Step, ...]:
    """The cheapest steps that turn a tensor laid out as ``src`` into ``dst``; ``()`` when nothing changes.

    Steps are priced by ``cluster`` when given, else by ring volume (module docstring).  Raises
    :class:`ShardingError` when a spec does not fit the tensor or mesh, or uses a non-sum ``Partial``.
    """
    shape, mesh_shape = tuple(int(s) for s in shape), tuple(int(n) for n in mesh_shape)
    return _plan_cached(src, dst, shape, int(itemsize), mesh_shape, cluster)


@lru_cache(maxsize=1 << 16)
def _plan_cached(
    src: ShardingSpec,
    dst: ShardingSpec,
    shape: tuple[int, ...],
    itemsize: int,
    mesh_shape: tuple[int, ...],
    cluster: CollectiveCost | None,
) -> tuple[Step, ...]:
    ends = _endpoints(src, dst, shape, itemsize, mesh_shape)
    if ends is None:
        return ()
    return _shortest_plan(*ends, shape, itemsize, mesh_shape, cluster)


def _endpoints(
    src: ShardingSpec, dst: ShardingSpec, shape: tuple[int, ...], itemsize: int, mesh_shape: tuple[int, ...]
) -> tuple[_Layout, _Layout] | None:
    """The search's start and goal layouts after checking the request; None when nothing has to move."""

    def where() -> str:  # formatted only on error: the planner calls this ~10^4 times
        return f"redistributing {src} -> {dst} for shape {shape} on mesh {mesh_shape}"

    if any(n < 1 for n in mesh_shape) or itemsize < 1:
        raise ShardingError(f"{where()}: mesh axes and itemsize (bytes per element) must be >= 1")
    try:
        start, goal = _layout(src, shape, mesh_shape, "source"), _layout(dst, shape, mesh_shape, "target")
    except ShardingError as e:
        raise ShardingError(f"{where()}: {e}") from e
    if src == dst:  # a non-sum partial may stay as it is
        return None
    for spec in (src, dst):
        bad = _non_sum_partial(spec)
        if bad is not None:
            raise ShardingError(f"{where()}: only sum-partials can be redistributed, {spec} holds {bad}")
    return None if start == goal else (start, goal)


def redistribute_time(
    src: ShardingSpec, dst: ShardingSpec, shape: Sequence[int], itemsize: int, cluster: CollectiveCost
) -> float:
    """Seconds to redistribute ``src`` → ``dst`` on ``cluster``'s mesh: the sum of its collectives' times."""
    return _time_cached(src, dst, tuple(int(s) for s in shape), int(itemsize), cluster)


@lru_cache(maxsize=1 << 16)
def _time_cached(
    src: ShardingSpec, dst: ShardingSpec, shape: tuple[int, ...], itemsize: int, cluster: CollectiveCost
) -> float:
    # Read the price straight off the cached search tree: it is the sum of the path's collective times,
    # so no Step objects are built and no collective is priced twice (the planner asks this ~10^4 times).
    mesh_shape = tuple(cluster.mesh_shape)
    ends = _endpoints(src, dst, shape, itemsize, mesh_shape)
    if ends is None:
        return 0.0
    start, goal = ends
    targets = _targets(goal, len(shape), mesh_shape)
    _, best = _shortest_tree(start, _Graph(shape, itemsize, mesh_shape, targets, cluster))
    return float(best[goal][0])


def count_kinds(steps: Iterable[Step]) -> dict[StepKind, int]:
    """How many steps of each kind, e.g. ``{"all_gather": 2, "local_slice": 1}`` (for reports and tests)."""
    return dict(Counter(s.kind for s in steps))
