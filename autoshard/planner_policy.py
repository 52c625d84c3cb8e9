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
per-block search (:mod:`autoshard.problem.mix`) still runs for a policy skipped here, unless
:func:`mix_cannot_win` bounds its every count the same way (the lower-bound problem's floor over the
counts that may fit: :func:`mix_step_floor`).

The same holds for a policy the mesh search's ceiling prunes (:func:`~autoshard.planner_rerank.by_step`):
its bound is the lower-bound optimum at share 1, which is no bound on its counts.  On LLaMA-tiny of 8
layers, data parallel pinned, under a budget halfway between keeping every activation and recomputing
every block, full recomputation's unbudgeted bound is 7.21 ms and the lower-bound optimum of its first
count that fits (4 of 8) 6.40 ms: a ceiling between them pruned full recomputation and, with it, counts that
might beat it.  So the planner hands a pruned policy to the per-block search like a skipped one, and
:func:`mix_cannot_win` bounds its counts against the lesser of the best step and the ceiling
(``tests/planner/test_planner_policy_mix.py``).  No recomputation pruned (the first policy) proves every
policy and count slower: recomputation only adds cost.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping

import numpy as np

from autoshard.cluster import Cluster
from autoshard.planner_rerank import RANK_TOLERANCE, lower_bound_problem, unsound_reason
from autoshard.planner_steps import SearchMethod
from autoshard.problem.build import BuiltProblem
from autoshard.problem.costs import CostOptions, Recompute
from autoshard.problem.mix import least_fitting, mix_policies, share_problem
from autoshard.search import BoundExceeded, Edge, SearchProblem, Solution, solve
from autoshard.search.reduce import Certificates
from autoshard.search.wide import trivial_lower_bound

__all__ = ["cannot_win", "mix_cannot_win", "mix_step_floor", "search_counts"]


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
    best_step: float = math.inf,
) -> tuple[Solution, BuiltProblem, BuiltProblem, int] | None:
    """The per-block recomputation search (:func:`~autoshard.problem.mix.mix_policies`) over the uniform
    policies' problems; ``rebuild(cluster, options)`` builds a policy at
    share 0 (no block recomputed) as the planner built it.  ``multiplier``: the budget's Lagrange multiplier
    in the best uniform policy's solve, probed first in each interval's (LLaMA-3-70B on 16 x 8 x 8: one
    probe proves both policies' intervals cannot win, where the cutting planes took five to seven);
    ``dominated``: that solve's dominance removals, checked and reused by each interval's reduction.  The
    search stops by its interval count (:data:`~autoshard.problem.mix.MAX_INTERVALS`), never by the clock;
    ``time_limit`` reaches only CP-SAT, where an interval's exact solves leave a gap.  ``best_step``: the
    reported step of the best plan found so far (the planner keeps a mixed plan only below it): the last
    policy's search is skipped when :func:`mix_cannot_win` proves its every plan slower
    (:func:`~autoshard.problem.mix.mix_policies` says when that leaves the answer unchanged)."""

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

    def unwanted(zero: BuiltProblem, whole: BuiltProblem) -> bool:
        return mix_cannot_win(zero, whole, best_step)

    return mix_policies(uniform, zero, run, unwanted=unwanted)


def mix_cannot_win(zero: BuiltProblem, whole: BuiltProblem, best_step: float) -> bool:
    """Whether every plan with ``k`` of ``N`` blocks recomputed under ``whole``'s policy that may fit steps
    at least ``best_step`` (``zero``, ``whole``: that policy's builds at share 0 and 1), by
    :func:`mix_step_floor` and the ranking's tolerance on ``L <= step``.  LLaMA-3-70B on 16 x 8 x 8: full
    recomputation of 50..80 of 80 blocks steps at least 11.10 s where selective's plan steps 9.56 s, and
    the interval solves that showed its linear objective could not win (0.18 s CPU) are spared."""
    if not math.isfinite(best_step):
        return False
    return mix_step_floor(zero, whole) >= best_step * (1 + RANK_TOLERANCE) + 1e-12


def mix_step_floor(zero: BuiltProblem, whole: BuiltProblem) -> float:
    """A lower bound on the reported step of every plan with ``k`` of ``N`` blocks recomputed that may fit
    (``-inf`` where the lower-bound problem is not a bound: :func:`~autoshard.planner_rerank.unsound_reason`).

    Every plan's reported step is at least its lower-bound objective (:mod:`autoshard.planner_rerank`).
    Below ``a`` = :func:`~autoshard.problem.mix.least_fitting` nothing fits; from ``a`` to ``N`` each term
    of the lower-bound problem at share ``k / N`` is ``max(affine, 0)`` or ``max(concave, 0)`` in ``k``
    (the least of two affine terms: a sync that may hide, :mod:`autoshard.problem.unpaid`), so its least
    value over the range is at an end: the termwise minimum of the two ends bounds every such ``k`` (as
    :mod:`autoshard.meshbound`'s parts do), and every term at its cheapest bounds that (no solve)."""
    if unsound_reason(whole) is not None:
        return -math.inf
    ends = _ends(zero, whole)
    return -math.inf if ends is None else trivial_lower_bound(ends)


def _ends(zero: BuiltProblem, whole: BuiltProblem) -> SearchProblem | None:
    """The termwise minimum of the lower-bound problems at shares ``a / N`` and 1 (costs only)."""
    n = whole.num_blocks
    low = lower_bound_problem(share_problem(zero, whole, least_fitting(zero.problem, whole.problem, n)))
    high = lower_bound_problem(whole)
    if low is None or high is None:
        return None
    return dataclasses.replace(
        high,
        node_costs=tuple(np.minimum(a, b) for a, b in zip(low.node_costs, high.node_costs, strict=True)),
        edges=tuple(
            Edge(a.u, a.v, np.minimum(a.cost, b.cost)) for a, b in zip(low.edges, high.edges, strict=True)
        ),
    )
