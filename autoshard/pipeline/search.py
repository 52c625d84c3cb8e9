"""The joint search: pipeline degree, microbatches, schedule and cuts, each stage's intra-op plan inside.

Input: a model and one global step's example inputs, a :class:`~autoshard.cluster.Cluster`, the user's
pins (:mod:`autoshard.pipeline.options`) and a ``build`` function from the planner (capture → priced
:class:`~autoshard.problem.build.BuiltProblem`, annotations applied).
Output: the best :class:`Candidate`; :mod:`autoshard.pipeline.assemble` turns it into a Plan.

For each degree ``p`` (stages laid over the outermost mesh axis, whole nodes per stage unless the degree
only fits inside a node) and each microbatch count ``m``:

1. capture the model at one microbatch's shapes (``B / m`` samples; cached per size, and identical layers
   are captured twice and solved once, so the cost of all this is flat in depth);
2. build the intra-op problem on the stage's sub-mesh with ``CostOptions(microbatches=m)`` and memory
   re-weighted for the stage holding ``L / p`` layers and ``min(m, p)`` microbatches in flight
   (:func:`~autoshard.pipeline.layers.stage_memory_problem`); solve it with the exact solver
   (``search="auto"`` runs no CP-SAT inside this loop; under a binding budget that is the Lagrangian plan)
   — one solve per (sub-mesh, microbatch count, recomputation), not per cut; that re-weighted problem is
   pessimistic, not a floor, so before a candidate is refused :mod:`autoshard.pipeline.refit` checks a true
   lower bound and tries other plans at the real budget, unless each schedule's floor rules the candidate
   out or a bound on those plans' steps reaches the best step (:mod:`autoshard.pipeline.floors`; the first
   candidate's refit waits for one, :mod:`autoshard.pipeline.walk`);
3. split its costs into one layer, ``pre`` and ``post`` (:func:`~autoshard.pipeline.layers.part_costs`),
   add the p2p time of one layer's output on the inter-stage link, and run the stage DP
   (:func:`~autoshard.pipeline.stages.best_split`) for every schedule and chunk count ``v`` that torch's
   schedule classes accept (:func:`~autoshard.pipeline.schedules.torch_refuses`).

Every candidate is priced as the intra-op planner prices its plan: each stage's time is the critical path of
:func:`~autoshard.problem.step.critical_path` on its sub-mesh (tensor-parallel collectives exposed, FSDP
gathers prefetched under the previous layer, gradient sync hidden under the backward of the last
microbatch; :func:`~autoshard.pipeline.layers.part_costs`), and the p2p sends as torch's schedules batch
them (one send per neighbour and microbatch, :func:`~autoshard.pipeline.schedules.p2p_time`).  ``p = 1`` is
the intra-op planner with ``m`` microbatches (gradient accumulation), priced by the same stage function, so
its step equals the intra-op plan's ``predicted_step_time``.  The least step time over all of them wins;
ties keep the smaller ``p``, then fewer microbatches.  With ``recompute="auto"``, a candidate that does not
fit is retried with selective recomputation (torchtitan's op-level policy), then full; under a binding
budget every policy is priced (the budget shapes the intra-op plan, so recomputing can be faster).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from autoshard.capture import Captured
from autoshard.cluster import Cluster, load_cluster
from autoshard.errors import InfeasibleError, PipelineError
from autoshard.pipeline.bound import step_bound
from autoshard.pipeline.floors import live_shapes, refit_bound
from autoshard.pipeline.layers import part_costs, stage_memory_problem
from autoshard.pipeline.options import PipelineRequest, divisors
from autoshard.pipeline.pick import fastest_split, priced_shapes, stage_shapes
from autoshard.pipeline.refit import StageMemoryError, least_flight, least_refusal, refit
from autoshard.pipeline.schedules import Schedule, in_flight
from autoshard.pipeline.stages import StageSplit, price_split
from autoshard.pipeline.walk import RefitDeferred, Walk
from autoshard.problem.build import BuiltProblem
from autoshard.problem.costs import CostOptions, Recompute, node_compute
from autoshard.search import BoundExceeded, SearchProblem, Solution, solve

__all__ = ["Candidate", "Layout", "compute_floor", "layout", "microbatch_args", "search_pipeline"]

BuildFn = Callable[[Captured, Cluster, CostOptions, float], BuiltProblem]
CaptureFn = Callable[[tuple[Any, ...], dict[str, Any]], Captured]


#: Relative slack on :func:`compute_floor` before it prunes: the floor and the step sum the same figures in
#: another order, so float rounding must not let the floor pass a step it equals.
_ROUNDING = 1e-9


@dataclass(frozen=True)
class Layout:
    """Where ``degree`` stages sit: each stage's sub-mesh cluster and the link between stages."""

    degree: int
    sub: Cluster
    mesh: tuple[int, ...]  # the whole mesh, pipeline axis first when degree > 1
    axis_names: tuple[str, ...]
    across_nodes: bool
    p2p_bandwidth: float  # bytes/s one device sends to the next stage
    p2p_latency: float


#: Largest elimination table for a pipeline stage's budgeted solve; wider stages take the Lagrangian path by
#: reduction (search/wide.py).  Measured on the 405B stage (PP 16, 16 microbatches, selective recomputation):
#: at the solver's default cap its 14.2e6-entry tables fit, and the plain Lagrangian sweep's fitting plan was
#: 267.92 s (bound 234.93 s) in 30 s CPU; below it, the wide path found 236.00 s (same bound) in 6 s.
STAGE_MAX_FACTOR = 10_000_000


def layout(cluster: Cluster, degree: int) -> Layout:
    """Lay ``degree`` stages over the outermost mesh axis: across nodes when they divide the nodes."""
    if degree == 1:
        return Layout(1, cluster, cluster.mesh_shape, cluster.axis_names, False, math.inf, 0.0)
    shape, names, profile = cluster.mesh_shape, cluster.axis_names, cluster.profile
    if shape[0] % degree:
        raise PipelineError(
            f"pipeline={degree}: the stages are laid along the outermost mesh axis, of size {shape[0]} "
            f"(mesh {shape}), which {degree} does not divide; use one of {divisors(shape[0])}"
        )
    sub_shape = (shape[0] // degree, *shape[1:])
    sub_names = names
    if sub_shape[0] == 1 and len(sub_shape) > 1:
        sub_shape, sub_names = sub_shape[1:], names[1:]
    if cluster.nodes % degree == 0:
        sub = load_cluster(profile, nodes=cluster.nodes // degree, mesh=sub_shape, axis_names=sub_names)
        bandwidth = profile.inter_node.bandwidth_per_device(profile.devices_per_node)
        latency, across = profile.inter_node.step_latency, True
    elif cluster.nodes == 1 and profile.devices_per_node % degree == 0:
        inner = dataclasses.replace(profile, devices_per_node=profile.devices_per_node // degree)
        sub = load_cluster(inner, nodes=1, mesh=sub_shape, axis_names=sub_names)
        # one device to one device over the node's fabric: the all-gather bus bandwidth is that link's rate
        bandwidth = profile.intra_node.bus_bandwidth.all_gather
        latency, across = profile.intra_node.step_latency, False
    else:
        raise PipelineError(
            f"pipeline={degree}: stages must hold whole nodes ({cluster.nodes} nodes, so one of "
            f"{divisors(cluster.nodes)}) or, on one node, divide its {profile.devices_per_node} devices"
        )
    # default names follow the whole mesh's positions ("pp", "axis1", ...), as the report numbers axes
    names = ("pp", *(f"axis{i + 1}" if n.startswith("axis") else n for i, n in enumerate(sub_names)))
    return Layout(degree, sub, (degree, *sub_shape), names, across, bandwidth, latency)


@dataclass(frozen=True)
class Candidate:
    """One priced (degree, microbatches, recomputation) choice with its intra-op solution."""

    step_seconds: float
    layout: Layout
    microbatches: int
    built: BuiltProblem
    solution: Solution
    captured: Captured
    split: StageSplit | None  # None without stages
    recompute: Recompute
    priced: tuple[str, ...] = ()  # every candidate the search priced, one line each (on the winner)

    def describe(self) -> str:
        """``pp 8 × 96 microbatches (zb_v, v=2, no recompute): 17.264 s``."""
        how = f"{self.split.schedule.value}, v={self.split.virtual}, " if self.split else ""
        return (
            f"pp {self.layout.degree} × {self.microbatches} microbatches ({how}{self.recompute.value} "
            f"recompute): {self.step_seconds:.4g} s"
        )


def microbatch_args(
    args: tuple[Any, ...], kwargs: Mapping[str, Any], batch: int, size: int
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """One microbatch's inputs (the first ``size`` samples of every batch-sized tensor), as the search captures
    them: :mod:`autoshard.pipeline_replay` rebuilds a saved plan's stage problem from the same cut."""

    def cut(x: Any) -> Any:
        if isinstance(x, torch.Tensor) and x.dim() > 0 and x.shape[0] == batch:
            return x.narrow(0, 0, size)
        return x

    return tuple(cut(a) for a in args), {k: cut(v) for k, v in kwargs.items()}


def microbatch_sizes(batch: int, nodes: int) -> tuple[int, ...]:
    """The microbatch size ``"auto"`` tries with stages: the largest divisor of the batch up to ``nodes / 8``
    samples (one per data-parallel rank when each of 8 stages holds an eighth of the nodes: Megatron's
    micro-batch of 1).  Each size costs a capture and a build per degree, so there is one; pin
    ``microbatches`` to price others."""
    return (max(d for d in divisors(batch) if d <= max(1, nodes // 8)),)


def _candidates(request: PipelineRequest, cluster: Cluster, batch: int, layers: int) -> list[tuple[int, int]]:
    """(degree, microbatches) pairs to price (see :mod:`autoshard.pipeline.options`)."""
    if request.degree is not None:
        degrees = [request.degree]
    else:
        # degrees that divide the layers (identical layers split evenly; pin others), at least two layers a
        # stage (one layer per stage leaves nothing to balance and doubles the p2p)
        degrees = [
            d
            for d in divisors(cluster.nodes)
            if layers % d == 0 and 2 * d <= layers and cluster.mesh_shape[0] % d == 0
        ]
    pairs: list[tuple[int, int]] = []
    sizes = microbatch_sizes(batch, cluster.nodes)
    for p in degrees:
        pinned = request.counts(p, batch)
        if pinned is not None:
            pairs.append((p, pinned))
            continue
        counts = {1} if p == 1 else set()
        counts |= {batch // b for b in sizes if batch // b >= p}
        pairs += [(p, m) for m in sorted(counts)]
    return pairs


def search_pipeline(
    request: PipelineRequest,
    cluster: Cluster,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    *,
    batch: int,
    layers: int,
    capture_fn: CaptureFn,
    build: BuildFn,
    policies: list[Recompute],
    training: bool,
    memory_limit: float,
    method: str,
    time_limit: float,
    say: Callable[[str], None],
    ceiling: float = math.inf,
) -> Candidate:
    """The least step time over every candidate; InfeasibleError when none fits; BoundExceeded: none beats
    ``ceiling`` (a step to beat), one was pruned by a bound."""
    captures: dict[int, Captured] = {}
    walk: Walk[Candidate] = Walk(ceiling=ceiling)
    for degree, count in _candidates(request, cluster, batch, layers):
        where = layout(cluster, degree)
        size = batch // count
        if size not in captures:
            say("capture")
            captures[size] = capture_fn(*microbatch_args(args, kwargs, batch, size))
        price = functools.partial(_price_policy, request, where, count, captures[size], training, build,
                                  memory_limit, method, time_limit, len(policies) == 1)  # fmt: skip
        walk = walk.candidate(price, policies, degree, count, say)
    if walk.best is None:
        raise walk.above() or least_refusal(walk.errors, walk.floors)
    return dataclasses.replace(walk.best, priced=tuple(walk.priced))


def _price_policy(
    request: PipelineRequest,
    where: Layout,
    count: int,
    captured: Captured,
    training: bool,
    build: BuildFn,
    limit: float,
    method: str,
    time_limit: float,
    pinned: bool,
    policy: Recompute,
    hint: tuple[int, ...] | None,
    ceiling: float,
    defer: bool,
) -> Candidate | None:
    """:func:`_price` of one recomputation policy (:class:`~autoshard.pipeline.walk.Walk`'s callback)."""
    opts = CostOptions(training=training, recompute=policy, microbatches=count)
    return _price(
        request, where, count, captured, opts, build, limit, method, time_limit, hint, ceiling, defer, pinned
    )


def _price(
    request: PipelineRequest,
    where: Layout,
    count: int,
    captured: Captured,
    opts: CostOptions,
    build: BuildFn,
    limit: float,
    method: str,
    time_limit: float,
    hint: tuple[int, ...] | None = None,
    ceiling: float = math.inf,
    defer: bool = False,
    pinned: bool = True,
) -> Candidate | None:
    """The best schedule and cut of one (degree, microbatches, recomputation) candidate, its intra-op plan
    solved once; None when no cut fits.  ``ceiling`` (the best step so far): BoundExceeded without a solve
    when :func:`compute_floor`, or with stages :func:`~autoshard.pipeline.bound.step_bound` (the busiest
    device's layers, one schedule's bubble), shows that no plan of this candidate is faster.  ``pinned``: the
    policy is the only one searched, so a schedule refused with it is the user's error, not a misfit."""
    search_method = "exact" if method == "auto" else method
    degree = where.degree
    budget = limit if math.isfinite(limit) else math.inf
    built = build(captured, where.sub, opts, budget if degree == 1 else math.inf)
    if math.isfinite(ceiling):
        floor = compute_floor(built, degree)
        if floor * (1 - _ROUNDING) >= ceiling:
            raise BoundExceeded(floor, ceiling)
    if degree == 1:  # the intra-op plan with gradient accumulation, priced by the same stage function
        solution = solve(built.problem, method=search_method, time_limit=time_limit)  # type: ignore[arg-type]
        whole = part_costs(built, solution)
        step = price_split(whole, (0, whole.layers), Schedule.GPIPE, 1, 1, count).step_seconds
        return Candidate(step, where, count, built, solution, captured, None, opts.recompute)
    flight = in_flight(Schedule.ONE_F_ONE_B, 0, degree, 1, count)
    problem = stage_memory_problem(built, degree, flight)
    if math.isfinite(budget):
        problem = dataclasses.replace(problem, memory_limit=budget)
    shapes = stage_shapes(request, degree, count, built.num_blocks)
    if math.isfinite(ceiling):  # over the shapes fastest_split prices for this policy, not all torch runs
        priced = priced_shapes(shapes, opts.recompute)
        bound = step_bound(built, problem, priced, degree, ceiling, time_limit, STAGE_MAX_FACTOR)
        if bound * (1 - _ROUNDING) >= ceiling:
            raise BoundExceeded(bound, ceiling)
    if hint is not None and (
        len(hint) != problem.num_nodes or any(s >= n for s, n in zip(hint, problem.sizes, strict=True))
    ):
        hint = None  # another graph: no warm start

    def solve_at(stage: SearchProblem) -> Solution:
        return solve(
            stage,
            method=search_method,  # type: ignore[arg-type]
            time_limit=time_limit,
            hint=hint,
            incumbent=hint,  # under a binding budget the Lagrangian sweep starts from it (CP-SAT reads only hint)
            max_factor_size=STAGE_MAX_FACTOR,
        )

    refused: list[str] = []
    link = (where.p2p_bandwidth, where.p2p_latency)
    split_of = functools.partial(fastest_split, request, degree, link, built, count, budget, refused)
    best: StageSplit | None = None
    try:
        solution = solve_at(problem)
        best = split_of(solution)
    except InfeasibleError:
        if not (math.isfinite(budget) and shapes):
            raise
    if best is None and refused and len(request.schedules) == 1:  # each reason names the schedule
        error = PipelineError if pinned else InfeasibleError  # one policy of several: refused as a misfit
        raise error(f"{degree} pipeline stages: {refused[0]}")
    if best is None and math.isfinite(budget) and shapes:  # the surrogate is no floor: pipeline/refit.py
        live = live_shapes(built, degree, shapes, budget)
        if not live.shapes:  # every shape's floor is over the budget (pipeline/floors.py): no refit
            raise live.refusal()

        def finish(ceiling: float) -> Candidate | None:
            """The refit, unless the bound on every plan it can return reaches ``ceiling``."""
            if math.isfinite(ceiling):
                bound = refit_bound(built, degree, live, ceiling, time_limit, STAGE_MAX_FACTOR)
                if bound * (1 - _ROUNDING) >= ceiling:
                    raise BoundExceeded(bound, ceiling)
            try:
                flight = least_flight(shapes, degree, count)
                solution, split = refit(problem, built, degree, flight, budget, solve_at, split_of)
            except StageMemoryError as e:
                if not request.cuts or e.proven:
                    raise
                return _no_cut(request, degree)
            return Candidate(
                split.step_seconds, where, count, built, solution, captured, split, opts.recompute
            )

        if defer and not math.isfinite(ceiling):
            raise RefitDeferred(finish)
        return finish(ceiling)
    if best is None:
        return _no_cut(request, degree)
    return Candidate(best.step_seconds, where, count, built, solution, captured, best, opts.recompute)


def _no_cut(request: PipelineRequest, degree: int) -> Candidate | None:
    """None (no cut fits), or PipelineError when the cuts are pinned."""
    if not request.cuts:
        return None
    raise PipelineError(
        f"{len(request.cuts)} pinned stage cuts fit no schedule of {degree} stages: pin {degree - 1} cuts (or "
        f"{degree} x v - 1 with v chunks per device), or make sure the pinned stages fit in memory"
    )


def compute_floor(built: BuiltProblem, degree: int) -> float:
    """A lower bound on the step of every plan of ``built`` on ``degree`` stages: each node's least compute
    over its strategies (recomputation included), times its multiplicity, times ``m / degree``.

    Why it holds: every schedule keeps its slowest device busy ``m`` microbatches long
    (:func:`~autoshard.pipeline.schedules.step_time`: ``m t* + ...``), the slowest device takes at least the
    mean ``sum_d t_d / degree``, and ``sum_d t_d`` is every node's forward and backward once
    (:func:`~autoshard.pipeline.layers.part_costs`) plus exposed collectives and p2p sends, which are never
    negative.  Recomputation only adds compute, so a policy whose floor reaches the best step so far is
    done without its (budgeted, costly) solve."""
    opts, cluster, infos = built.options, built.cluster, built.infos
    total = 0.0
    for name in built.variables:
        info = infos[name]
        if info.kind != "op":
            continue  # parameters, inputs and constants compute nothing
        inputs = tuple(infos[s] for s in info.inputs)
        least = min(sum(node_compute(info, s, cluster, opts, inputs)) for s in built.strategies[name])
        total += least * built.multiplicity[name]
    return total * opts.microbatches / degree
