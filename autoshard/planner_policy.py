"""Skip a recomputation policy that cannot beat the plan already found under another one.

Input: the :class:`~autoshard.problem.build.BuiltProblem` of one policy (pins folded in, memory budget
attached) and the reported step of the best plan found so far under another policy.
Output: a :class:`~autoshard.search.BoundExceeded` carrying a proven lower bound on the reported step of
*every* plan of that policy that fits the budget, when that bound reaches the best step; else None (solve
the policy in full).

Why it is sound.  The planner keeps, across policies, the plan with the lowest reported (critical-path)
step.  The lower-bound problem (:func:`~autoshard.planner_rerank.lower_bound_problem`: the objective less
what the step may leave unpaid) bounds every plan's reported step from below, and it keeps the policy's
memory terms and budget, so its budgeted optimum bounds the step of every plan of the policy that fits.  A
Lagrangian bound on that optimum (or its optimum without the budget) that reaches the best step proves no
plan of the policy would have been chosen.  The solver stops as soon as one does (``solve(ceiling=)``).

Where it pays: LLaMA-3-70B on 16 x 8 x 8 (1,024 A100), where nothing fits without recomputation and
selective recomputation's plan steps 9.67 s: full recomputation's lower-bound problem has no plan under
12.56 s even without the budget (one reduction and one exact solve, ~0.4 s), where solving full
recomputation under the budget took 6.5 s, most of it CP-SAT proving a plan of 13.5 s optimal.

Also here: the per-block search's call (:func:`search_counts`).  Only the uniform policy is bounded by
:func:`cannot_win`: ``k`` of ``N`` blocks recomputed costs less than all ``N``, so the
per-block search (:mod:`autoshard.problem.mix`) still runs for a policy skipped here.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping

from autoshard.cluster import Cluster
from autoshard.planner_rerank import lower_bound_problem, unsound_reason
from autoshard.planner_steps import SearchMethod
from autoshard.problem.build import BuiltProblem
from autoshard.problem.costs import CostOptions, Recompute
from autoshard.problem.mix import mix_policies
from autoshard.search import BoundExceeded, SearchProblem, Solution, solve
from autoshard.search.reduce import Certificates

__all__ = ["cannot_win", "search_counts"]


def cannot_win(built: BuiltProblem, best_step: float, method: str, time_limit: float) -> BoundExceeded | None:
    """A proven lower bound on the reported step of every fitting plan of ``built``, when it is at least
    ``best_step`` (module docstring); None when none is proven (or no sound bound exists).

    Raises InfeasibleError when no plan of ``built`` fits (the same refusal the full solve would give)."""
    if not math.isfinite(best_step) or method == "propagate" or built.problem.memory_limit is None:
        return None
    lower = lower_bound_problem(built)
    if lower is None or unsound_reason(built) is not None:
        return None
    try:
        found = solve(lower, method="exact", time_limit=time_limit, ceiling=best_step)
    except BoundExceeded as e:
        return e
    # the optimum without the budget fitted (no ceiling check on that path), or a plan below the best step
    return BoundExceeded(found.lower_bound, best_step) if found.lower_bound >= best_step else None


def search_counts(
    uniform: Mapping[Recompute, tuple[BuiltProblem, BuiltProblem, float]],
    rebuild: Callable[[Cluster, CostOptions], tuple[BuiltProblem, BuiltProblem]],
    method: SearchMethod,
    time_limit: float,
    multiplier: float | None = None,
    dominated: Certificates = (),
) -> tuple[Solution, BuiltProblem, BuiltProblem, int] | None:
    """The per-block recomputation search (:func:`~autoshard.problem.mix.mix_policies`) over the uniform
    policies' problems; ``rebuild(cluster, options)`` builds a policy at
    share 0 (no block recomputed) as the planner built it.  ``multiplier``: the budget's Lagrange multiplier
    in the best uniform policy's solve, probed first in each interval's (LLaMA-3-70B on 16 x 8 x 8: one
    probe proves both policies' intervals cannot win, where the cutting planes took five to seven);
    ``dominated``: that solve's dominance removals, checked and reused by each interval's reduction.  The
    search stops by its interval count (:data:`~autoshard.problem.mix.MAX_INTERVALS`), never by the clock;
    ``time_limit`` reaches only CP-SAT, where an interval's exact solves leave a gap."""

    def zero(policy: Recompute) -> tuple[BuiltProblem, BuiltProblem]:
        pinned = uniform[policy][1]
        return rebuild(
            pinned.cluster, dataclasses.replace(pinned.options, recompute=policy, recompute_share=0.0)
        )

    def run(
        p: SearchProblem,
        method: SearchMethod = method,
        ceiling: float = math.inf,
        dominance_search: bool = True,
    ) -> Solution:
        return solve(
            p,
            method=method,
            time_limit=time_limit,
            ceiling=ceiling,
            multiplier=multiplier,
            dominated=dominated,
            dominance_search=dominance_search,
        )

    return mix_policies(uniform, zero, run)
