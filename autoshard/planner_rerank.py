"""Rank plans by the step the report prints, and say honestly which objective was proven optimal.

Input: the plan :func:`autoshard.plan` read from the solver's optimum, its
:class:`~autoshard.problem.build.BuiltProblem` (pins folded in), the :class:`~autoshard.search.Solution` and
the reader that turns a solution into a :class:`~autoshard.plans.Plan`.
Output: the plan with the lowest reported step among a few candidates, its
:class:`~autoshard.plans.SolverReport` filled with ``step_bound``, ``step_optimal``, ``chosen`` and ``ranked``.

Why: the solver minimises a *linear* step model (node + edge costs), the report prints the critical path
(:mod:`autoshard.problem.step`: bucketed gradient sync, prefetched FSDP gathers).  They differ in three ways:

* a repeated layer's gradient sync is charged once (the other copies hidden under backward): the critical
  path exposes at least that much (its last bucket holds the last layer's sync), more when a layer's sync
  outlasts a layer's backward or buckets hold several layers;
* a repeated layer's parameter gathers (FSDP forward gathers and backward re-gathers) are charged on every
  copy: the critical path prefetches them and exposes at least one copy;
* a sync outside the repeated layers is charged in full: the critical path hides it under the backward after
  it when its gradient is ready before the last unit's (an MLP's fc2, a transformer's head).

So the objective less what the step may not pay (:mod:`autoshard.problem.unpaid`: the gathers beyond one copy,
a move several consumers may share beyond 1/m, the syncs that may hide; and the memory tie-break) is a lower
bound on every plan's reported step. Solving that lower-bound problem exactly (the same arrays, the same
solver) gives ``B <= step(p)`` for every plan ``p`` of the problem. While no candidate reaches ``B``, ``B`` is
raised by the gradient sync a backward cannot hide (:mod:`autoshard.planner_dual`: ``L + lam D``, ``lam`` by a
concave dual of at most three solves, proven in :mod:`autoshard.problem.exposure`), and that raised problem is
what prunes the candidates below. The candidates -- the solver's optimum, the lower-bound problem's optimum
and that of each ``lam`` the dual tries, then, while none of them reaches ``B``: the sync-exposed optimum
(every repeated layer's gradient sync charged on every copy, an upper model of the step), per kind of
parallelism the lower-bound and linear optima without it (the plans ``--forbid KIND`` ranks first;
:mod:`autoshard.planner_candidates` says why these), and the hand plans everyone compares against (pure data
parallel, FSDP on every axis), each the best completion under the same pins -- are priced by the critical path
and the fastest is returned. When its step is within ``RANK_TOLERANCE`` of ``B``, no plan has a lower reported
step: the plan is proven optimal *by the reported step* (``step_optimal``). Otherwise the report says "optimal
under the linear step model; step within X of the bound" -- never "optimal" alone. What is not enumerated (the
plans between the best candidate and ``B``) is covered by that X.

Shortcut (why the ranking usually prices one or two plans, not four).  Every candidate is a plan of the
same problem (the lower-bound optimum, and the hand plans, which are that problem with some strategies
masked), so each has ``step >= L >= B`` (the ``below`` check verifies ``L <= step`` on every plan priced,
for the raised problem too).
Once a candidate's step is within ``RANK_TOLERANCE`` of ``B``, no further candidate can be faster than it
by more than that tolerance: neither the lower-bound optimum nor the hand plans are solved or read then.
This holds inside a scope too (a recomputation policy, a binding budget): the scope restricts which plans
``B`` covers, and every candidate lies inside it.  Short of ``B``, a hand plan is solved only when the
lower-bound problem under its masks, solved with the best step so far as a ceiling, does not prove it slower
(:func:`_cannot_beat`: usually one unbudgeted solve instead of a budgeted one); so is each kind's restricted
pair, whose lower-bound optimum is that very solve.  The only differences from
pricing them all are the count in "best of N plans priced" and the plans left out of ``ranked``; the
plan, the bound and the claim are the same (``tests/planner/test_planner_rerank_shortcut.py``).

Scope of the bound: the plans the problem admits (the user's pins, its recomputation policy).  It covers
every recomputation policy only when the plan keeps every activation and the bound did not need the memory
budget (recomputation only adds cost to both models, and the bound's optimum fits without it).  The mesh
search compares meshes by the reported step, so the best mesh's plan is ranked the same way.

Example::

    plan = autoshard.plan(model, cluster, (ids,))
    plan.solver.step_optimal, plan.solver.step_bound, plan.solver.ranked
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np

from autoshard.errors import InfeasibleError
from autoshard.planner_candidates import (
    RANK_TOLERANCE,
    add_candidate,
    add_restricted,
    add_sync_exposed,
    beatable,
)
from autoshard.planner_dual import tighten
from autoshard.plans import Plan
from autoshard.problem.build import BuiltProblem, edge_matrix
from autoshard.problem.costs import MEMORY_TIE_BREAK, Recompute
from autoshard.problem.unpaid import unpaid, unpaid_edges
from autoshard.search import BoundExceeded, Edge, SearchProblem, Solution, evaluate, solve

__all__ = ["RANK_TOLERANCE", "by_step", "hand_plan_masks", "lower_bound_problem", "rank_plan"]

#: ``RANK_TOLERANCE`` (defined beside the candidates that share it): relative slack between the bound and a
#: step that still counts as equal, float sums in two orders (the solver's objective and the critical path).
#: The objective's memory tie-break (``MEMORY_TIE_BREAK``) is taken out of the lower-bound problem exactly.

HAND_PLANS = ("data parallel", "fsdp")

#: The lower-bound problem's reduction applies the solver optimum's dominance removals that still hold
#: (``solve(dominated=)``) and runs no dominance search of its own (``solve(dominance_search=False)``): the
#: two problems differ only by what the step may leave unpaid, so those removals are most of what a search
#: finds (8B: 2,698 of 3,238; 70B: 2,665 of 3,180), and the search cost more than the larger tables it
#: spares.  CPU of this solve, LLaMA-3-8B 2 x 4 x 8: 0.21 -> 0.13 s (one exact solve); LLaMA-3-70B
#: 16 x 8 x 8: 0.48 -> 0.46 s (budget binding: sweep, min-marginals, Pareto).  Dominance only shrinks the
#: tables: the bound, its plan and the claim are the same.
_HINTED_ONLY = True

_T = TypeVar("_T")


def lower_bound_problem(built: BuiltProblem) -> SearchProblem | None:
    """The search problem whose objective bounds every plan's reported step from below (module docstring);
    None when the builder's edges cannot be matched to their uses (then there is no bound)."""
    problem = _without_tie_break(built)
    records = unpaid_edges(built)
    if records is None:
        return None
    edges = list(problem.edges)
    forward_only = dataclasses.replace(built.options, training=False)
    for record in records:
        tu, tv, which, pos = record.use
        edge = edges[record.edge]
        forward = None
        if record.gathers or record.sync:
            src, dst = built.strategies[tu], built.strategies[tv]
            forward = edge_matrix(built.infos[tu], which, src, dst, pos, forward_only, built.cache)
        hide = unpaid(edge.cost, forward, record)
        edges[record.edge] = Edge(edge.u, edge.v, np.maximum(edge.cost - hide, 0.0))  # inf stays inf
    return dataclasses.replace(problem, edges=tuple(edges))


def _without_tie_break(built: BuiltProblem) -> SearchProblem:
    """The problem less the node costs' memory tie-break (``MEMORY_TIE_BREAK`` x the node's memory, before
    the runtime reserve the builder adds to node 0's memory)."""
    problem = built.problem
    if problem.memory is None:
        return problem
    costs = list(problem.node_costs)
    for i in range(len(built.variables)):
        mem = problem.memory[i] - (built.cluster.profile.memory.runtime_reserve if i == 0 else 0.0)
        less = np.maximum(costs[i] - MEMORY_TIE_BREAK * mem, 0.0)
        costs[i] = np.where(np.isfinite(costs[i]), less, costs[i])
    return dataclasses.replace(problem, node_costs=tuple(costs))


def by_step(
    layout: Callable[..., _T],
    free: BuiltProblem,
    built: BuiltProblem,
    rebuild: Any,
    method: Any,
    time_limit: float,
    ceiling: float,
) -> _T:
    """``layout(free, built, rebuild, method, time_limit, ceiling)`` (the planner's solve over sequence
    layouts) for the mesh search, pruning by the *reported* step.

    The solver prunes (:class:`BoundExceeded`) when, under a binding budget, its unbudgeted optimum reaches
    ``ceiling`` (the best step so far); that optimum bounds the step only where nothing is unpaid.  So a
    prune is confirmed by the lower-bound problem without the budget; when that bound is below the ceiling,
    the problem is solved in full.  What a prune proves: no plan of ``built``'s policy at its share beats the
    ceiling.  Recomputation only adds cost, so under no recomputation that covers every policy and every
    count of recomputed blocks; under selective or full recomputation of every block it does *not* cover
    the plans recomputing ``k`` of ``N`` (fewer blocks re-run: less cost), which the planner hands to the
    per-block search (:mod:`autoshard.planner_policy`)."""
    try:
        return layout(free, built, rebuild, method, time_limit, ceiling)
    except BoundExceeded:
        lower = lower_bound_problem(built)
        if lower is not None:
            bound = solve(dataclasses.replace(lower, memory_limit=None), method=method, time_limit=time_limit)
            if bound.lower_bound >= ceiling:
                raise BoundExceeded(bound.lower_bound, ceiling) from None
    return layout(free, built, rebuild, method, time_limit, math.inf)


def unsound_reason(built: BuiltProblem) -> str | None:
    """Why the lower-bound problem is not a bound here (None when it is)."""
    if not built.options.training:
        return None
    for fan in built.fanouts:  # a fan-out node charges every layer copy of a parameter's gradient sync
        producer = built.infos[fan.group.producer]
        if producer.kind == "parameter" and producer.block is not None and fan.group.weight > 1:
            return f"{producer.fqn or producer.name} is shared inside a repeated layer (sync priced per copy)"
    return None


def hand_plan_masks(built: BuiltProblem, name: str) -> tuple[np.ndarray | None, ...] | None:
    """Allowed masks of a hand plan on ``built``'s mesh, intersected with its pins; None when impossible.

    ``data parallel``: every parameter stored whole, the inputs split by batch on every axis.  ``fsdp``:
    every matrix stored split on every axis, vectors whole, the inputs split by batch.  The solver completes
    the rest (norms, attention, redistributions), so each is the best plan of its kind."""
    axes = len(built.cluster.mesh_shape)
    current = built.problem.allowed or (None,) * built.problem.num_nodes
    masks: list[np.ndarray | None] = list(current)
    for k, var in enumerate(built.variables):
        info = built.infos[var]
        outs = [s.outputs[0] if s.outputs else None for s in built.strategies[var]]
        if info.kind == "parameter":
            meta = info.outputs[0]
            split = name == "fsdp" and meta is not None and len(meta.shape) >= 2
            want = np.array([o is not None and _all_split(o, axes) if split else _whole(o) for o in outs])
        elif info.kind == "user_input" and info.outputs and info.outputs[0] is not None:
            if not info.outputs[0].shape:
                continue
            want = np.array([o is not None and all(str(p) == "S(0)" for p in o.placements) for o in outs])
        else:
            continue
        mask = want if masks[k] is None else want & masks[k]
        if not mask.any():
            return None
        masks[k] = mask
    return tuple(masks)


def _whole(spec: Any) -> bool:
    return spec is not None and all(str(p) == "R" for p in spec.placements)


def _all_split(spec: Any, axes: int) -> bool:
    return len(spec.placements) == axes and all(str(p).startswith("S(") for p in spec.placements)


def _scope(built: BuiltProblem, bound: Solution) -> str:
    """What the bound covers: '' for every plan, else the restriction in words."""
    opts = built.options
    if opts.training and opts.recompute is not Recompute.NONE:
        blocks = (
            "" if opts.recompute_share >= 1.0 else f" of {round(opts.recompute_share * built.num_blocks)}"
        )
        return f"plans with {opts.recompute.value} recomputation{blocks} of the repeated blocks"
    if built.problem.memory_limit is not None and bound.budget_binding is not False:
        return "plans without recomputation"
    return ""


def rank_plan(
    found: Plan,
    built: BuiltProblem,
    solution: Solution,
    read: Callable[[BuiltProblem, Solution], Plan],
    *,
    method: Any = "auto",
    time_limit: float = 60.0,
    others: Sequence[tuple[str, Plan]] = (),
    exhaustive: bool = False,
) -> Plan:
    """The candidate with the lowest reported step, labelled against the proven bound (module docstring).

    ``others``: plans already priced on a problem with fewer strategies (e.g. the pinned plan, for the
    unpinned price); they compete but are not re-checked against the bound.  ``exhaustive``: price the
    lower-bound optimum and the hand plans even once the bound is met (the shortcut's reference in tests)."""
    if method == "propagate":  # no optimality claim to rank
        return found
    start = time.perf_counter()
    lower = lower_bound_problem(built)
    candidates: list[tuple[str, Plan, tuple[int, ...] | None]] = [("solver optimum", found, solution.choice)]
    why = "the builder's edges do not match their uses" if lower is None else unsound_reason(built)
    lower = lower or built.problem
    bound_solution = (  # the same strategies: its reduction re-checks the solve's dominance removals (and
        # searches no further: _HINTED_ONLY), and the solver's optimum (a plan of this problem) starts its
        # Lagrangian sweep nearer the bound's optimum
        solve(
            lower,
            method=method,
            time_limit=time_limit,
            dominated=solution.dominated,
            incumbent=solution.choice,
            dominance_search=not _HINTED_ONLY,
        )
        if why is None
        else solution
    )
    bound, scope = bound_solution.lower_bound, _scope(built, bound_solution)

    def unproven() -> bool:  # then price more candidates (why more are useless once met: module docstring)
        met = min(p.predicted_step_time for _, p, _ in candidates) <= _slack(bound)
        return exhaustive or why is not None or not met

    if unproven() and bound_solution.choice != solution.choice:
        candidates.append(("lower-bound optimum", read(built, bound_solution), bound_solution.choice))
    tight = (
        lower  # the lower-bound problem with the sync the backward cannot hide (autoshard/planner_dual.py)
    )
    if unproven() and why is None:
        bound, tight, bound_solution = tighten(
            candidates, built, lower, bound_solution, solution, read, method, time_limit
        )
    if unproven():  # more candidates short of the bound (autoshard/planner_candidates.py)
        add_sync_exposed(candidates, built, solution, read, method, time_limit)
    if unproven():
        prune, hints = why is None and not exhaustive, (bound_solution, solution)
        add_restricted(candidates, built, tight, prune, hints, read, method, time_limit)
    if unproven():
        floor = tight if why is None and not exhaustive else None
        _add_hand_plans(candidates, built, floor, read, method, time_limit)
    candidates += [(name, plan, None) for name, plan in others]
    for name, plan, choice in candidates:  # the relation the bound rests on, checked on every plan priced
        below = max(evaluate(lower, choice), evaluate(tight, choice)) if choice else 0.0
        if why is None and below > _slack(plan.predicted_step_time):
            why = f"{name}: linear lower bound {below:.6g} s above its reported step"
    order = sorted(range(len(candidates)), key=lambda i: (candidates[i][1].predicted_step_time, i))
    name, best, _ = candidates[order[0]]
    proven = why is None and not scope and best.predicted_step_time <= _slack(bound)
    ranked = tuple(f"{n}: {p.predicted_step_time:.6g} s" for n, p, _ in (candidates[i] for i in order))
    report = dataclasses.replace(
        found.solver,
        step_bound=bound if why is None and math.isfinite(bound) else None,
        step_optimal=proven,
        chosen=name,
        ranked=ranked,
        bound_scope=scope if why is None else f"no bound: {why}",
    )
    timings = {**best.timings, "rank": time.perf_counter() - start}
    return dataclasses.replace(best, solver=report, timings=timings)


def _add_hand_plans(
    candidates: list[tuple[str, Plan, tuple[int, ...] | None]],
    built: BuiltProblem,
    lower: SearchProblem | None,
    read: Callable[[BuiltProblem, Solution], Plan],
    method: Any,
    time_limit: float,
) -> None:
    """Append the hand plans of :data:`HAND_PLANS` that exist, fit and may beat the best candidate (a plan
    already there is renamed).  ``lower``: the lower-bound problem, when it is one (module docstring)."""
    for name in HAND_PLANS:
        masks = hand_plan_masks(built, name)
        if masks is None:
            continue
        best = min(p.predicted_step_time for _, p, _ in candidates)
        if lower is not None and _cannot_beat(
            dataclasses.replace(lower, allowed=masks), best, method, time_limit
        ):
            continue
        try:
            hand = solve(
                dataclasses.replace(built.problem, allowed=masks), method=method, time_limit=time_limit
            )
        except InfeasibleError:
            continue  # the hand plan does not fit (or breaks a pin): not a candidate
        add_candidate(candidates, name, built, hand, read)  # a plan already there: "... = fsdp"


def _cannot_beat(lower: SearchProblem, best: float, method: Any, time_limit: float) -> bool:
    """Whether no plan of ``lower``'s problem (a hand plan's masks on the lower-bound problem) can have a
    reported step below ``best`` (:func:`~autoshard.planner_candidates.beatable`): a hand plan proven so is
    not solved, it could not be chosen."""
    return beatable(lower, best, method, time_limit) is None


def _slack(x: float) -> float:
    return x * (1 + RANK_TOLERANCE) + 1e-12
