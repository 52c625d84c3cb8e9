"""The sequence layout of context parallelism, searched with the plan instead of chosen after it.

Input: a problem built with ``CostOptions.cp_layout`` ``"auto"`` (rings priced balanced, no reordering: a lower
bound on every layout, :mod:`autoshard.problem.context`) or ``"zigzag"``, its solution, and a way to rebuild
and solve the same problem on another cluster and options.  Output: the problem, the solution and a note for
the best (plan, layout) pair.

Why it is exact.  Every plan with a given layout is priced exactly by one problem: ``cp_layout="contiguous"``
(every ring contiguous, with its causal imbalance) or the problem on a
:class:`~autoshard.problem.context.ZigzagCluster` for axis ``a`` (zigzag on ``a``: balanced rings, every
collective on ``a`` with its reordering copy, one-run ops refused there; contiguous elsewhere).  The optimum over
both is the best of those problems' optima.  The balanced bound is below all of them, so:

1. when its optimum rings on no axis, it is priced the same by the contiguous problem and is the optimum
   (layout contiguous): nothing more is solved (the common case: most plans have no ring).  This holds for
   ``"zigzag"`` asked too: a plan without a ring has no context axis, so nothing is reordered at run time
   (:attr:`~autoshard.plans.Plan.zigzag_axis` is None) and the zigzag problems, which could only refuse
   its one-run ops or price it the same, have nothing to add;
2. otherwise the bound's own plan is priced (no solve) in each layout's problem, in tie order, where that
   problem has all its strategies: a price reaching the bound makes that layout optimal, and only the layouts
   that would win a tie against it are solved, with the bound as their ceiling (LLaMA-3-70B: contiguous
   reaches it; zigzag on the ring axis is only proven not to tie).  Else the zigzag problem on the bound's
   ring axis is solved first, then the contiguous one and the zigzag problems of the other axes, each with
   the best so far as its ceiling (over it: "above <best>" in the note), stopping once one reaches the bound.

A tie goes to zigzag on the plan's own ring axis (at run time it never computes more), then to contiguous.
``"zigzag"`` asked solves only the zigzag problems.  The cost: nothing without a ring, else one to ``1 + axes``
more solves.  Pipelined plans are not searched so: the stage search prices rings balanced and
:func:`~autoshard.problem.context.choose_layout` picks the layout on its plan (imbalance against reordering),
because re-pricing a 405B stage under each layout cost minutes; every stage then runs that layout.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from autoshard.cluster import Cluster
from autoshard.errors import AutoshardError, ShardingError
from autoshard.planner_steps import SearchMethod
from autoshard.problem.build import BuiltProblem
from autoshard.problem.context import one_run_ops, ring_axis_of_plan, zigzag_axis_of, zigzag_cluster
from autoshard.problem.costs import CostOptions
from autoshard.search import BoundExceeded, SearchProblem, Solution, solve
from autoshard.search.problem import evaluate, memory_of, relative_gap
from autoshard.strategies import OpStrategy

__all__ = ["search_layout"]

Rebuild = Callable[[Cluster, CostOptions], tuple[BuiltProblem, BuiltProblem]]
"""(cluster, options) -> (the problem as priced, the same with the user's pins)."""


def search_layout(
    free: BuiltProblem,
    built: BuiltProblem,
    rebuild: Rebuild,
    method: SearchMethod,
    time_limit: float,
    ceiling: float = math.inf,
) -> tuple[BuiltProblem, BuiltProblem, Solution]:
    """The best (problem, solution) over the sequence layouts (module doc), each solved by
    :func:`~autoshard.search.solve` with ``method``, ``time_limit`` and ``ceiling``; the pinned problem
    carries a note with every layout's price."""

    def run(problem: SearchProblem) -> Solution:
        return solve(problem, method=method, time_limit=time_limit, ceiling=ceiling)

    solution = run(built.problem)
    asked = built.options.cp_layout
    mesh = tuple(built.cluster.mesh_shape)
    axis = _ring_axis(built, solution)
    if asked == "contiguous" or zigzag_axis_of(built.cluster) is not None or axis is None:
        return free, built, solution  # the layout was priced already, or the bound is attained without a ring
    options = dataclasses.replace(built.options, cp_layout="contiguous")
    order = [axis] if axis is not None else []
    order += [a for a in range(len(mesh)) if mesh[a] > 1 and a != axis]
    candidates: list[tuple[str, Cluster]] = [
        (f"zigzag on axis {a}", zigzag_cluster(built.cluster, a)) for a in order
    ]
    if asked == "auto":
        candidates.insert(min(1, len(candidates)), ("contiguous", built.cluster))
    bound = solution.objective
    reach = bound * (1 + 1e-12)
    built_of: dict[str, tuple[BuiltProblem, BuiltProblem] | AutoshardError] = {}

    def rebuilt(label: str, cluster: Cluster) -> tuple[BuiltProblem, BuiltProblem]:
        if label not in built_of:
            try:
                built_of[label] = rebuild(cluster, options)
            except AutoshardError as e:
                built_of[label] = e
        got = built_of[label]
        if isinstance(got, AutoshardError):
            raise got
        return got

    # the bound's own plan priced under each layout (no solve): reaching the bound there makes it optimal
    hit: tuple[int, Solution] | None = None
    for i, (label, cluster) in enumerate(candidates):
        try:
            cand = rebuilt(label, cluster)[1]
        except AutoshardError:
            continue
        priced = _bound_plan(built, solution, cand)
        if priced is not None and priced.objective <= reach:
            hit = (i, priced)
            break
    best: tuple[float, int, BuiltProblem, BuiltProblem, Solution] | None = None
    prices: list[str] = []
    error: AutoshardError | BoundExceeded | None = None
    for i, (label, cluster) in enumerate(candidates):
        if hit is not None and i == hit[0]:
            found = hit[1]
            cand_free, cand = rebuilt(label, cluster)
        else:
            if hit is not None and i > hit[0]:
                continue  # the bound is reached: only a better-ranked layout could tie (solved above)
            # after the first, a layout has only to beat the best so far (a bound-reaching hit: only tie it)
            top = reach if hit is not None else (best[0] if best is not None else math.inf)
            try:
                cand_free, cand = rebuilt(label, cluster)
                found = solve(cand.problem, method=method, time_limit=time_limit, ceiling=min(ceiling, top))
            except BoundExceeded as e:
                if not math.isfinite(top) or top >= ceiling:
                    error = e
                    prices.append(f"{label}: {_why_not(built, solution, cluster, e)}")
                else:
                    prices.append(f"{label} above {top:.4g} s")
                continue
            except AutoshardError as e:
                error = e  # infeasible under this layout (a pin on a one-run op)
                prices.append(f"{label}: {_why_not(built, solution, cluster, e)}")
                continue
        prices.append(f"{label} {found.objective:.4g} s")
        rank = _tie_rank(cand, found, cluster)
        cost = found.objective
        if best is None or cost < best[0] * (1 - 1e-12) or (cost <= best[0] * (1 + 1e-12) and rank > best[1]):
            best = (cost, rank, cand_free, cand, found)
        if hit is None and best[0] <= reach:
            break  # nothing is below the balanced bound
    if best is None:
        assert error is not None
        if asked == "zigzag" and axis is not None and _blockers(built, solution, axis):
            raise ShardingError(f"cp_layout='zigzag' cannot be emitted: {_why_not(built, solution, cluster, error)}"
                                "; use cp_layout='auto' or 'contiguous'")  # fmt: skip
        raise error
    _, _, cand_free, cand, found = best
    note = f"context-parallel layout searched: {'; '.join(prices)} (balanced bound {bound:.4g} s)"
    noted = dataclasses.replace(cand, notes=(*cand.notes, note))
    # without pins the unpinned problem stays the same object: ranked() then re-solves nothing for its price
    return noted if cand_free is cand else cand_free, noted, found


def _bound_plan(built: BuiltProblem, bound: Solution, cand: BuiltProblem) -> Solution | None:
    """The bound's plan as a solution of ``cand`` (its price there, no solve), or None where ``cand`` lacks one
    of its strategies or its memory budget refuses it."""
    if cand.variables != built.variables:
        return None
    choice = []
    for name, strategy in _chosen(built, bound).items():
        options = cand.strategies[name]
        if strategy not in options:
            return None
        choice.append(options.index(strategy))
    full = cand.full_choice(choice)
    if len(full) != cand.problem.num_nodes:
        return None
    cost = evaluate(cand.problem, full)
    limit = cand.problem.memory_limit
    if not math.isfinite(cost) or (limit is not None and memory_of(cand.problem, full) > limit):
        return None
    gap = relative_gap(cost, bound.lower_bound)
    return dataclasses.replace(bound, choice=full, objective=cost, gap=gap, log=(), dominated=())


def _tie_rank(built: BuiltProblem, solution: Solution, cluster: Cluster) -> int:
    """On a tie: zigzag where the plan rings (2), then contiguous (1), then zigzag on another axis (0)."""
    zigzag = zigzag_axis_of(cluster)
    if zigzag is None:
        return 1
    return 2 if _ring_axis(built, solution) == zigzag else 0


def _chosen(built: BuiltProblem, solution: Solution) -> dict[str, OpStrategy]:
    return {
        name: built.strategies[name][k]
        for name, k in zip(built.variables, solution.choice[: len(built.variables)], strict=True)
    }


def _ring_axis(built: BuiltProblem, solution: Solution) -> int | None:
    return ring_axis_of_plan(built.infos, _chosen(built, solution), tuple(built.cluster.mesh_shape))


def _blockers(built: BuiltProblem, solution: Solution, axis: int) -> str:
    return ", ".join(one_run_ops(built.infos, _chosen(built, solution), axis)[:3])


def _why_not(built: BuiltProblem, bound: Solution, cluster: Cluster, error: Exception) -> str:
    """Why a layout's problem has no plan: the bound's ops that need one run of the sequence, or the error."""
    axis = zigzag_axis_of(cluster)
    blockers = _blockers(built, bound, axis) if axis is not None else ""
    if blockers:
        return (
            f"{blockers} split on mesh axis {axis} need one run of the sequence per device, zigzag holds two"
        )
    return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
