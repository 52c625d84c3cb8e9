"""Mesh-shape search: which device mesh, 1-D to 4-D, makes the best plan on ``nodes`` × devices per node.

Input: a model, its example inputs, a hardware profile and a node count.  Output: a :class:`MeshSearch`: the
best :class:`~autoshard.plans.Plan` (lowest predicted step time) and every candidate mesh with its predicted
step time, or why it could not be planned.

Candidates (:func:`candidate_meshes`).  Ranks are laid row-major over the mesh, so axes are outermost-first
over nodes (:mod:`autoshard.cluster`): a mesh splits into *inter-node* axes (the leading ones, whose groups
span nodes) and *intra-node* axes (the trailing ones, whose product divides the devices per node).  Every
ordered factorisation of the device count into 1 to ``max_axes`` factors of at least 2 that the cluster
accepts (even process groups) is a candidate, with one canonical order per group of axes of the same kind
(sizes non-increasing: axes of one kind are priced alike, so reordering them only renames the axes), and,
on several nodes, intra-node axes that fill a node (an axis with part of its group inside a node and part
across is only tried as the 1-D mesh).

The model is captured once and each candidate re-plans the same capture (the mesh only enters at strategy
generation), so a search costs one capture plus one strategy/cost/solve pass per candidate.  With pins, the
price of the pins (a solve of the problem without them, :attr:`~autoshard.plans.Plan.unpinned_step_time`)
is shown for the best plan only, so it is solved for that one only
(:class:`~autoshard.planner_steps.DeferredPrices`).

Pruning (``prune=True``, the default).  Before any candidate is planned, each gets a *floor*
(:mod:`autoshard.meshbound`): the parts its plan space splits into (one per recomputation policy, and ``k``
of ``N`` blocks recomputed), each relaxed to a lower-bound problem on the reported step, built on first use.
Candidates are planned in order of the first part's optimum without the budget (policy none's), most
promising first (ties, and candidates without a floor first, in the given order).  Before planning one, the
best step so far is the ceiling: when every part's bound -- its optimum without the budget, else its
Lagrangian bound under the budget, stopped at the first multiplier that reaches the ceiling -- reaches it,
the candidate cannot beat the best and is listed as ``pruned: bound X s >= best Y s`` without being
planned.  Otherwise it is planned with that ceiling (:func:`autoshard.plan`'s ``ceiling``: its solver stops
at a bound that reaches it, confirmed by the lower-bound problem without the budget,
:func:`autoshard.planner_rerank.by_step`).

Ties keep the earlier mesh in the given order either way: a candidate before the best one is pruned only
when its bound is strictly above the best step, one after it when the bound reaches it.  So pruning never
changes the plan returned nor its claim (``tests/test_meshsearch_prune.py`` compares it with the unpruned
search, mesh by mesh).  LLaMA-3-8B ``--forbid tp`` on one 8 x A100 node: 4x2 and 2x2x2 are pruned by
their floors under the budget (``python -m benchmarks.rank_step --case forbid``).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from autoshard.capture import Captured, capture
from autoshard.cluster import Cluster, load_cluster
from autoshard.errors import AutoshardError, MeshError
from autoshard.meshbound import MeshFloor, mesh_floor, prove_above
from autoshard.planner_steps import deferred_prices
from autoshard.plans import Plan
from autoshard.search import BoundExceeded

__all__ = ["MeshCandidate", "MeshSearch", "candidate_meshes", "price_over_meshes", "search_mesh"]


@dataclass(frozen=True, slots=True)
class MeshCandidate:
    """One mesh tried: its predicted step time and memory per device, or why no plan was made."""

    mesh_shape: tuple[int, ...]
    step_seconds: float | None
    memory_bytes: float | None
    seconds: float  # planning time of this candidate
    error: str | None = None
    bound: float | None = None  # pruned: a proven lower bound on its step time, at least ``best``
    best: float | None = None  # pruned: the best step time when it was pruned
    timings: Mapping[str, float] = field(default_factory=dict)  # planned: its Plan.timings (stages)
    floor: float | None = None  # ordering key: its first part's lower-bound optimum without the budget
    proof: tuple[str, ...] = ()  # pruned before planning: each part's bound (autoshard.meshbound)
    cpu_seconds: float = 0.0  # CPU time of this candidate (bounding and planning), for benchmarks

    @property
    def pruned(self) -> bool:
        return self.bound is not None

    def __str__(self) -> str:
        mesh = "x".join(map(str, self.mesh_shape))
        if self.bound is not None:
            bound, best = _apart(self.bound, self.best or 0.0)
            return f"{mesh}: pruned: bound {bound} s >= best {best} s"
        if self.step_seconds is None:
            return f"{mesh}: {self.error}"
        return f"{mesh}: {self.step_seconds:.4g} s/step, {self.memory_bytes / 2**30:.1f} GiB/device"  # type: ignore[operator]


def _apart(a: float, b: float) -> tuple[str, str]:
    """``a`` and ``b`` with 4 significant digits, or as many more (up to 10) as tell them apart."""
    for digits in range(4, 11):
        if f"{a:.{digits}g}" != f"{b:.{digits}g}":
            break
    return f"{a:.{digits}g}", f"{b:.{digits}g}"


@dataclass(frozen=True)
class MeshSearch:
    """The best plan and every candidate, best first (candidates without a plan last)."""

    plan: Plan
    candidates: tuple[MeshCandidate, ...]

    @property
    def mesh_shape(self) -> tuple[int, ...]:
        return self.plan.mesh_shape


def _factorisations(n: int, parts: int) -> list[tuple[int, ...]]:
    """Ordered factorisations of ``n`` into exactly ``parts`` factors >= 2."""
    if parts == 1:
        return [(n,)] if n >= 2 else []
    out: list[tuple[int, ...]] = []
    for f in range(2, n + 1):
        if n % f == 0:
            out.extend((f, *rest) for rest in _factorisations(n // f, parts - 1))
    return out


def candidate_meshes(nodes: int, devices_per_node: int, max_axes: int = 4) -> list[tuple[int, ...]]:
    """Canonical candidate meshes (module docstring), fewest axes first."""
    if max_axes < 1:
        raise MeshError(f"max_axes must be >= 1, got {max_axes}")
    total = nodes * devices_per_node
    if total == 1:
        return [(1,)]
    found: list[tuple[int, ...]] = []
    for parts in range(1, max_axes + 1):
        for mesh in _factorisations(total, parts):
            if _canonical(mesh, devices_per_node, nodes) and _accepted(mesh, nodes, devices_per_node):
                found.append(mesh)
    return found


def _canonical(mesh: tuple[int, ...], per_node: int, nodes: int) -> bool:
    """Sizes non-increasing within the inter-node axes and within the intra-node axes; on several nodes,
    the intra-node axes fill a node exactly (the 1-D mesh aside)."""
    inner = 1
    split = len(mesh)
    while split > 0 and per_node % (inner * mesh[split - 1]) == 0:
        inner *= mesh[split - 1]
        split -= 1
    groups = (mesh[:split], mesh[split:])
    if nodes > 1 and len(mesh) > 1 and inner != per_node:
        return False
    return all(list(g) == sorted(g, reverse=True) for g in groups)


def _accepted(mesh: tuple[int, ...], nodes: int, per_node: int) -> bool:
    from autoshard.cluster import _axis_groups

    try:
        _axis_groups(mesh, per_node)
    except MeshError:
        return False
    return math.prod(mesh) == nodes * per_node


def search_mesh(
    model: torch.nn.Module,
    profile: Any,
    example_args: tuple[Any, ...] | Any = (),
    example_kwargs: Mapping[str, Any] | None = None,
    *,
    nodes: int = 1,
    max_axes: int = 3,  # 4-D meshes multiply strategies per op: minutes on some models (issue 17)
    meshes: list[tuple[int, ...]] | None = None,
    progress: Callable[[str], None] | None = None,
    captured: Captured | None = None,
    prune: bool = True,
    **plan_options: Any,
) -> MeshSearch:
    """Plan ``model`` on every candidate mesh of ``nodes`` nodes of ``profile``; the best plan wins.

    ``meshes`` overrides the candidates; ``captured`` is a capture of this model and these inputs to reuse;
    ``prune`` skips candidates proven unable to beat the best so far (module docstring);
    ``plan_options`` go to :func:`autoshard.plan` unchanged.  The
    returned plan's notes list the runners-up with their predicted step times.  Raises the first candidate's
    :class:`~autoshard.errors.AutoshardError` (the 1-D mesh's: the simplest to act on) when no mesh gives a plan.
    """
    from autoshard.planner import plan as plan_one

    base = load_cluster(profile, nodes=nodes)
    shapes = meshes or candidate_meshes(nodes, base.devices_per_node, max_axes)
    args = example_args if isinstance(example_args, tuple) else (example_args,)
    if captured is None:
        captured = capture(model, args, dict(example_kwargs or {}), blocks=plan_options.get("blocks", "auto"))
    results: dict[int, tuple[MeshCandidate, Plan | None]] = {}
    errors: dict[int, AutoshardError] = {}
    floors, spent = _floors(captured, base, nodes, shapes, plan_options, progress) if prune else ({}, {})
    order = sorted(range(len(shapes)), key=lambda i: (_key(floors.get(i)), i))
    best: tuple[float, int, Plan] | None = None  # step, index in shapes, plan
    with deferred_prices() as later:  # only the winner's unpinned price is shown: only it is solved
        for i in order:
            shape, floor = shapes[i], floors.get(i)
            record = _Recorder(shape, floor, *spent.get(i, (0.0, 0.0)))
            # ties keep the earlier mesh: one before the best must be strictly slower to lose
            ceiling = math.inf if best is None or not prune else best[0]
            if best is not None and i < best[1]:
                ceiling = math.nextafter(ceiling, math.inf)
            proven = prove_above(floor, ceiling) if floor is not None and math.isfinite(ceiling) else None
            if proven is not None:
                assert best is not None
                results[i] = (record(bound=proven[0], best=best[0], proof=proven[1]), None)
                continue
            if progress is not None:
                progress(f"mesh {'x'.join(map(str, shape))}")
            try:
                cluster = Cluster(base.profile, nodes, shape)
                plan = plan_one(
                    model, cluster, args, example_kwargs, captured=captured, ceiling=ceiling, **plan_options
                )
            except BoundExceeded as e:
                assert best is not None
                results[i] = (record(bound=e.bound, best=best[0]), None)
                continue
            except AutoshardError as e:
                errors[i] = e
                # the whole message (never cut mid-clause), less the fix
                what = " ".join(str(e).split()).partition(" Fix: ")[0]
                results[i] = (record(error=what), None)
                continue
            step = plan.predicted_step_time
            results[i] = (record(step, plan.memory_per_device, timings=plan.timings), plan)
            if best is None or (step, i) < best[:2]:
                best = (step, i, plan)
            later.keep_only(best[2])  # the others' unpinned problems are freed
    results = {i: results[i] for i in sorted(results)}  # the given order: ties keep the earlier mesh
    planned = sorted(
        (r for r in results.values() if r[1] is not None), key=lambda r: r[0].step_seconds or 0.0
    )
    if not planned:
        raise errors[min(errors)]  # the earliest mesh's in the given order (the 1-D mesh's)
    cut = tuple(
        sorted((c for c, p in results.values() if p is None and c.pruned), key=lambda c: c.bound or 0.0)
    )
    ranked = (*(c for c, _ in planned), *cut, *(c for c, p in results.values() if p is None and not c.pruned))
    chosen = planned[0][1]
    assert chosen is not None
    chosen = later.price(chosen)
    tried = f"{len(shapes)} meshes tried" + (f", {len(cut)} pruned by a lower bound" if cut else "")
    lines = [f"mesh search: {tried}; best {ranked[0]}"]
    lines += [f"  runner-up {c}" for c in ranked[1:6]]
    chosen = dataclasses.replace(chosen, meshes_searched=len(shapes))  # the unpinned price: its mesh only
    return MeshSearch(_with_notes(chosen, tuple(lines)), ranked)


def price_over_meshes(
    found: MeshSearch,
    model: torch.nn.Module,
    profile: Any,
    example_args: tuple[Any, ...],
    example_kwargs: Mapping[str, Any] | None,
    progress: Callable[[str], None] | None = None,
    **plan_options: Any,
) -> Plan:
    """``found.plan`` with the price of its pins taken against the unpinned optimum over the same meshes
    (a second search, without ``annotations``, ``allow`` and ``forbid``), that optimum's mesh recorded:
    the default prices them on the plan's own mesh only (new-user trial: 8B ``--nodes 2 --forbid cp`` read
    "+3.5%" against mesh 2x8's unpinned plan while the unpinned search found mesh 16 faster)."""
    free = {k: v for k, v in plan_options.items() if k not in ("annotations", "allow", "forbid")}
    meshes = [c.mesh_shape for c in found.candidates]
    nodes = int(found.plan.cluster.get("nodes", 1))
    best = search_mesh(
        model, profile, example_args, example_kwargs, nodes=nodes, meshes=meshes, progress=progress, **free
    ).plan
    own = found.plan.unpinned_step_time  # its own mesh's, at most the pinned plan's step (an unpinned plan)
    if own is not None and own <= best.predicted_step_time:
        return dataclasses.replace(found.plan, unpinned_mesh=found.plan.mesh_shape)
    return dataclasses.replace(
        found.plan, unpinned_step_time=best.predicted_step_time, unpinned_mesh=best.mesh_shape
    )


class _Recorder:
    """Makes a candidate's record, timed (wall and CPU) from construction plus what its floor took earlier."""

    def __init__(self, shape: tuple[int, ...], floor: MeshFloor | None, wall: float, cpu: float) -> None:
        self.shape, self.floor = shape, None if floor is None else floor.floor
        self._wall, self._cpu = time.perf_counter() - wall, time.process_time() - cpu

    def __call__(
        self, step: float | None = None, memory: float | None = None, **fields: Any
    ) -> MeshCandidate:
        wall, cpu = time.perf_counter() - self._wall, time.process_time() - self._cpu
        return MeshCandidate(self.shape, step, memory, wall, floor=self.floor, cpu_seconds=cpu, **fields)


def _floors(
    captured: Captured,
    base: Cluster,
    nodes: int,
    shapes: list[tuple[int, ...]],
    options: Mapping[str, Any],
    progress: Callable[[str], None] | None,
) -> tuple[dict[int, MeshFloor], dict[int, tuple[float, float]]]:
    """Each candidate's floor (:mod:`autoshard.meshbound`) where one is known, and the seconds it took (wall,
    CPU)."""
    floors: dict[int, MeshFloor] = {}
    spent: dict[int, tuple[float, float]] = {}
    for i, shape in enumerate(shapes):
        if progress is not None:
            progress(f"bounding mesh {'x'.join(map(str, shape))}")
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            found = mesh_floor(captured, Cluster(base.profile, nodes, shape), options)
        except AutoshardError:
            found = None  # planning the mesh reports it
        spent[i] = (time.perf_counter() - t0, time.process_time() - c0)
        if found is not None:
            floors[i] = found
    return floors, spent


def _key(floor: MeshFloor | None) -> float:
    """Most promising first; a mesh without a floor is planned first (its plan may set the ceiling)."""
    return -math.inf if floor is None else floor.floor


def _with_notes(plan: Plan, lines: tuple[str, ...]) -> Plan:
    return dataclasses.replace(plan, notes=(*plan.notes, *lines))
