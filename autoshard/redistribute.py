"""Redistribution: how a tensor laid out under one :class:`ShardingSpec` becomes another, as a list of steps.

This module is the single source of truth for spec → spec changes: the cost model prices its steps
(:func:`redistribute_time`), codegen emits them, the report prints them, and :func:`apply_steps_local`
executes them on the simulated mesh as the reference semantics codegen must match.

Input: source and target spec, the global shape, the element size, the mesh shape (and, optionally, a
cluster whose ``collective_time`` prices the steps).  Output: a tuple of :class:`Step`, each one collective
or local op on the process group of one mesh axis, executable with ``torch.distributed`` primitives there.

**Steps.**  One step changes the placement of one mesh axis ``a`` of size ``n``:

===========  ==================  ==========================================================================
from → to    kind                what every device of the axis group does
===========  ==================  ==========================================================================
S(d) → R     ``all_gather``      gather the pieces, concatenate them along ``d`` (``src_dim=d``)
R → S(d)     ``local_slice``     keep chunk ``coord[a]`` of ``n`` along ``d`` (``dst_dim=d``); no traffic
S(i) → S(j)  ``all_to_all``      split along ``j``, send chunk k to member k, concatenate along ``i``
P → R        ``all_reduce``      sum over the group
P → S(d)     ``reduce_scatter``  sum over the group, keep chunk ``coord[a]`` along ``d``
R → P        ``local_zero``      index 0 of the axis keeps the value, the others hold zeros; no traffic
S(d) → P     ``local_pad``       zero-pad ``n``× along ``d``, own block at ``coord[a]``; no traffic
===========  ==================  ==========================================================================

``Step.nbytes`` is ``S`` of the nccl-tests convention for that group's collective: the larger of the bytes one
device holds for this tensor before and after the step, i.e. the buffer unsharded over this axis.  That is the
gathered output for ``all_gather``, the input for ``reduce_scatter``, and the (unchanged) buffer for
``all_reduce`` and ``all_to_all``.  For local steps it is the same rule (what ``local_pad`` allocates).

``R → P`` keeps the value on index 0 rather than dividing by ``n``: it is exact for every dtype and leaves no
rounding.  ``S → P`` (zero-padding) moves no bytes but costs ``n``× memory; it is only chosen when the target
asks for ``P`` on that axis, never as an intermediate (a reduction of the padded buffer moves ``n``× the bytes
of the gather or all-to-all that does the same job).  Only sum-partials are supported.

**Nesting.**  When several axes shard dim ``d`` (outer axis first), a device's block index along ``d`` is a
mixed-radix number whose digits are those axes' coordinates, outermost most significant.  The group of
axis ``a`` holds *adjacent* blocks only when ``a`` is the innermost axis sharding ``d``.  Hence every step
that takes ``a`` off a dim (gather, the source side of an all-to-all, pad) or puts ``a`` on a dim (slice,
reduce-scatter, the target side of an all-to-all) requires that no axis inner to ``a`` shards that dim.
A change that breaks this, e.g. ``(S(0), S(0)) → (R, S(0))``, must first move the inner shard out of the
way and back.

**Algorithm.**  A shortest-path search (Dijkstra) over layouts, i.e. one placement per axis (at most
``(ndim + 2) ** mesh_ndim`` of them), whose edges are the valid steps above.  An edge weighs
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
import math
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal, NamedTuple, Protocol, get_args

import torch

from autoshard.errors import ShardingError
from autoshard.local_mesh import Coord, coords
from autoshard.placement import Partial, Placement, Replicate, Shard, ShardingSpec

__all__ = [
    "COLLECTIVE_KINDS",
    "CollectiveCost",
    "Step",
    "StepKind",
    "apply_steps_local",
    "count_kinds",
    "plan_redistribute",
    "redistribute_time",
]

StepKind = Literal[
    "all_gather", "all_to_all", "all_reduce", "reduce_scatter", "local_slice", "local_zero", "local_pad"
]
COLLECTIVE_KINDS: frozenset[StepKind] = frozenset(
    {"all_gather", "all_to_all", "all_reduce", "reduce_scatter"}
)

# (needs src_dim, needs dst_dim) per kind; the dims a step names are exactly these.
_DIMS: dict[StepKind, tuple[bool, bool]] = {
    "all_gather": (True, False),
    "all_to_all": (True, True),
    "all_reduce": (False, False),
    "reduce_scatter": (False, True),
    "local_slice": (False, True),
    "local_zero": (False, False),
    "local_pad": (True, False),
}


class CollectiveCost(Protocol):
    """What redistribution needs of a cluster: its mesh and the time of one collective on one axis."""

    @property
    def mesh_shape(self) -> tuple[int, ...]: ...

    def collective_time(self, kind: str, nbytes: int, axis: int = 0) -> float: ...

    def __hash__(self) -> int: ...  # plans and times are memoised per cluster


@dataclass(frozen=True, slots=True)
class Step:
    """One collective (or local op) on the process group of ``mesh_axis``; see the module docstring."""

    kind: StepKind
    mesh_axis: int
    src_dim: int | None  # dim gathered / padded / concatenated by all_to_all
    dst_dim: int | None  # dim sliced / scattered / split by all_to_all
    nbytes: int  # nccl-tests S: max(bytes per device before, after) = the buffer unsharded over this axis

    def __post_init__(self) -> None:
        if self.kind not in _DIMS:
            raise ValueError(f"unknown step kind {self.kind!r}: expected one of {get_args(StepKind)}")
        if self.mesh_axis < 0 or self.nbytes < 0:
            raise ValueError(f"step {self.kind} needs mesh_axis >= 0 and nbytes >= 0, got {self}")
        needs_src, needs_dst = _DIMS[self.kind]
        if (self.src_dim is not None) != needs_src or (self.dst_dim is not None) != needs_dst:
            raise ValueError(
                f"step {self.kind} takes src_dim={'a dim' if needs_src else 'None'} and "
                f"dst_dim={'a dim' if needs_dst else 'None'}; "
                f"got src_dim={self.src_dim}, dst_dim={self.dst_dim}"
            )

    @property
    def is_collective(self) -> bool:
        return self.kind in COLLECTIVE_KINDS

    def __str__(self) -> str:
        if self.src_dim is not None and self.dst_dim is not None:
            dims = f", dim={self.src_dim}->{self.dst_dim}"
        elif self.src_dim is not None or self.dst_dim is not None:
            dims = f", dim={self.src_dim if self.src_dim is not None else self.dst_dim}"
        else:
            dims = ""
        return f"{self.kind}(axis={self.mesh_axis}{dims}, {_format_bytes(self.nbytes)})"


def _format_bytes(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    raise AssertionError("unreachable")


# -- layouts -------------------------------------------------------------------------------------------------
# A layout is one int per mesh axis: a tensor dim d >= 0 for S(d), _R or _P.
_R, _P = -1, -2
_Layout = tuple[int, ...]


def _encode(spec: ShardingSpec, mesh_shape: tuple[int, ...]) -> _Layout:
    def code(p: Placement, n: int) -> int:
        if n == 1 or isinstance(p, Replicate):
            return _R
        return p.dim if isinstance(p, Shard) else _P

    return tuple(code(p, n) for p, n in zip(spec.placements, mesh_shape, strict=True))


def _with(layout: _Layout, axis: int, value: int) -> _Layout:
    return (*layout[:axis], value, *layout[axis + 1 :])


def _local_shape(layout: _Layout, shape: tuple[int, ...], mesh_shape: tuple[int, ...]) -> tuple[int, ...]:
    local = list(shape)
    for p, n in zip(layout, mesh_shape, strict=True):
        if p >= 0:
            local[p] //= n
    return tuple(local)


# The step kind for a change of one axis' placement, by (from, to) with every S(d) written as 0.
_KIND: dict[tuple[int, int], StepKind] = {
    (0, _R): "all_gather",
    (0, 0): "all_to_all",
    (0, _P): "local_pad",
    (_R, 0): "local_slice",
    (_R, _P): "local_zero",
    (_P, _R): "all_reduce",
    (_P, 0): "reduce_scatter",
}
_Move = tuple[StepKind, int | None, int | None, int]  # a Step's fields but its axis; built lazily for speed


def _transition(
    layout: _Layout, axis: int, target: int, local: Sequence[int], itemsize: int, mesh_shape: tuple[int, ...]
) -> _Move | None:
    """The step that sets ``axis`` to ``target`` in ``layout`` (device piece ``local``); None if invalid."""
    cur, n = layout[axis], mesh_shape[axis]
    inner = layout[axis + 1 :]
    # Only the innermost axis on a dim may leave it or join it (see "Nesting" in the module docstring).
    if (cur >= 0 and cur in inner) or (target >= 0 and (target in inner or local[target] % n)):
        return None
    kind = _KIND[min(cur, 0), min(target, 0)]
    nbytes = math.prod(local) * itemsize * (n if kind in ("all_gather", "local_pad") else 1)
    return kind, (cur if cur >= 0 else None), (target if target >= 0 else None), nbytes


def _moves(
    layout: _Layout,
    shape: tuple[int, ...],
    itemsize: int,
    mesh_shape: tuple[int, ...],
    targets: tuple[tuple[int, ...], ...],
) -> Iterator[tuple[int, _Move, _Layout]]:
    local = _local_shape(layout, shape, mesh_shape)
    for axis, axis_targets in enumerate(targets):
        for target in axis_targets:
            if target == layout[axis]:
                continue
            move = _transition(layout, axis, target, local, itemsize, mesh_shape)
            if move is not None:
                yield axis, move, _with(layout, axis, target)


def _targets(goal: _Layout, ndim: int, mesh_shape: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """The placements the search may give each axis: any, but ``P`` only where the goal has it.

    Entering ``P`` is free, but an axis that must end otherwise then needs a reduction, which moves at least
    the bytes of the gather or all-to-all it would replace.  Axes of size 1 carry no layout.
    """
    out = []
    for g, n in zip(goal, mesh_shape, strict=True):
        out.append(() if n == 1 else (_R, *range(ndim), *((_P,) if g == _P else ())))
    return tuple(out)


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


@lru_cache(maxsize=1 << 12)
def _non_sum_partial(spec: ShardingSpec) -> Placement | None:
    return next((p for p in spec.placements if isinstance(p, Partial) and p.reduce_op != "sum"), None)


@lru_cache(maxsize=1 << 12)
def _layout(spec: ShardingSpec, shape: tuple[int, ...], mesh_shape: tuple[int, ...], role: str) -> _Layout:
    """``spec`` encoded for the search, after checking that it fits the tensor and the mesh."""
    spec.check_fits(shape, mesh_shape, what=f"{role} tensor")
    return _encode(spec, mesh_shape)


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


# -- reference execution on the simulated mesh ---------------------------------------------------------------
def apply_steps_local(
    pieces: dict[Coord, torch.Tensor], src: ShardingSpec, steps: Iterable[Step], mesh_shape: Sequence[int]
) -> dict[Coord, torch.Tensor]:
    """Execute ``steps`` on every device's piece (as from :func:`autoshard.local_mesh.distribute` of ``src``).

    The reference semantics codegen must match.  Raises :class:`ShardingError` when a step does not apply to
    the layout reached so far (e.g. steps planned from another source spec).
    """
    mesh_shape = tuple(mesh_shape)
    if set(pieces) != set(coords(mesh_shape)):
        raise ShardingError(
            f"pieces must hold one tensor per device of mesh {mesh_shape}, keyed by coordinate"
        )
    some = next(iter(pieces.values()))
    if src.partial_axes() and not some.is_floating_point():
        raise ShardingError(
            f"a {some.dtype} tensor cannot be Partial ({src}): only floating tensors are summed"
        )
    layout, current = _encode(src, mesh_shape), dict(pieces)
    for i, step in enumerate(steps):
        layout = _advance(layout, step, tuple(current[(0,) * len(mesh_shape)].shape), mesh_shape, i)
        if step.kind in ("local_zero", "local_pad") and not some.is_floating_point():
            raise ShardingError(
                f"step {i} ({step}) makes a {some.dtype} tensor Partial: only floats are summed"
            )
        current = _run_step(current, step, mesh_shape)
    return current


_TARGET_OF: dict[StepKind, int | None] = {
    "all_gather": _R,
    "all_reduce": _R,
    "local_zero": _P,
    "local_pad": _P,
}


def _advance(
    layout: _Layout, step: Step, local: tuple[int, ...], mesh_shape: tuple[int, ...], i: int
) -> _Layout:
    target = _TARGET_OF.get(step.kind, step.dst_dim)
    assert target is not None
    axis = step.mesh_axis
    ok = axis < len(layout) and mesh_shape[axis] > 1 and target != layout[axis]
    expected = _transition(layout, axis, target, local, 1, mesh_shape) if ok else None
    if expected is None or expected[:2] != (step.kind, step.src_dim):
        raise ShardingError(f"step {i} ({step}) does not apply to layout {_format_layout(layout)}")
    return _with(layout, axis, target)


def _format_layout(layout: _Layout) -> str:
    return "(" + ", ".join("R" if p == _R else "P" if p == _P else f"S({p})" for p in layout) + ")"


def _run_step(
    current: dict[Coord, torch.Tensor], step: Step, mesh_shape: tuple[int, ...]
) -> dict[Coord, torch.Tensor]:
    axis = step.mesh_axis
    n = mesh_shape[axis]
    out: dict[Coord, torch.Tensor] = {}
    for c in current:
        if c[axis] != 0:
            continue
        group = [(*c[:axis], k, *c[axis + 1 :]) for k in range(n)]
        results = _GROUP_OPS[step.kind]([current[g] for g in group], step, n)
        out.update(zip(group, results, strict=True))
    return out


def _all_gather(ts: list[torch.Tensor], step: Step, n: int) -> list[torch.Tensor]:
    full = torch.cat(ts, dim=_dim(step.src_dim))
    return [full.clone() for _ in ts]


def _local_slice(ts: list[torch.Tensor], step: Step, n: int) -> list[torch.Tensor]:
    return [t.chunk(n, dim=_dim(step.dst_dim))[k].clone() for k, t in enumerate(ts)]


def _all_to_all(ts: list[torch.Tensor], step: Step, n: int) -> list[torch.Tensor]:
    sent = [t.chunk(n, dim=_dim(step.dst_dim)) for t in ts]  # sent[m][k]: from member m to member k
    return [torch.cat([sent[m][k] for m in range(n)], dim=_dim(step.src_dim)) for k in range(n)]


def _all_reduce(ts: list[torch.Tensor], step: Step, n: int) -> list[torch.Tensor]:
    total = torch.stack(ts).sum(dim=0)
    return [total.clone() for _ in ts]


def _reduce_scatter(ts: list[torch.Tensor], step: Step, n: int) -> list[torch.Tensor]:
    total = torch.stack(ts).sum(dim=0)
    return [chunk.clone() for chunk in total.chunk(n, dim=_dim(step.dst_dim))]


def _local_zero(ts: list[torch.Tensor], step: Step, n: int) -> list[torch.Tensor]:
    return [ts[0].clone()] + [torch.zeros_like(t) for t in ts[1:]]


def _local_pad(ts: list[torch.Tensor], step: Step, n: int) -> list[torch.Tensor]:
    d = _dim(step.src_dim)
    padded = []
    for k, t in enumerate(ts):
        shape = list(t.shape)
        shape[d] *= n
        z = t.new_zeros(shape)
        z.narrow(d, k * t.shape[d], t.shape[d]).copy_(t)
        padded.append(z)
    return padded


def _dim(d: int | None) -> int:
    assert d is not None, "Step.__post_init__ guarantees the dims its kind needs"
    return d


_GROUP_OPS = {
    "all_gather": _all_gather,
    "local_slice": _local_slice,
    "all_to_all": _all_to_all,
    "all_reduce": _all_reduce,
    "reduce_scatter": _reduce_scatter,
    "local_zero": _local_zero,
    "local_pad": _local_pad,
}
