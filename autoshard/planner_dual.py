"""The ranking's bound raised by the sync the backward cannot hide: a one-dimensional concave dual.

Input: the :class:`~autoshard.problem.build.BuiltProblem`, its lower-bound problem ``L``
(:func:`~autoshard.planner_rerank.lower_bound_problem`) and that problem's optimum.  Output: a bound at least
``L``'s optimum on every plan's reported step, the problem that gives it, its optimum, and more candidates
for :func:`~autoshard.planner_rerank.rank_plan`.

Why.  ``L`` lets every gradient sync ready before the final unit hide, however long it runs: a plan whose
syncs outlast the backward behind them ties with one that syncs nothing.  :mod:`autoshard.problem.exposure`
proves ``L(p) + lam D_j(p) <= step(p)`` for ``lam`` in [0, 1] (``D_j``: the syncs from unit ``j`` on less the
backward after it).  So ``g(lam) = min_p L(p) + lam D_j(p)`` is a bound for every ``lam``, concave and
piecewise linear (a minimum of lines, one per plan, slope ``D_j(p)``).  It is maximised by cutting planes
(Kelley's method in one dimension): the optimum at ``lam = 0`` (already solved) gives a line; when its slope
is positive, ``lam = 1``; then, while the lines' crossing lies above ``g`` there, the crossing.  Each probe
is one solve of ``L`` with more terms; at most :data:`MAX_PROBES`.

Only where ``L`` was solved to optimality: the lines are exact optima there, and each probe costs about
what that solve did.  A wide budgeted problem that the Lagrangian path leaves with a gap (the 405B-shaped
LLaMA on 128 x 16 x 8, ``benchmarks/plan_scale.py``: tens of seconds a solve) keeps ``L``'s bound.

The probes' optima are candidates too: they are the plans the bound says may be fastest when the sync that
shows is paid, and one of them is often what a user would pin by hand.  The Megatron MLP (64 -> 256 -> 64,
batch 512 on one a100x8 node): ``L``'s optimum (fc2's weight replicated, its sync taken as hidden under fc1's
backward, 18 us of it, which hides 18 of 33.5 us) ties at 107.50 us with Megatron's column -> row and steps
123.00 us; the solver's optimum steps 116.49 us.  ``D_j`` (j = fc2) is 15.5 us for the first, -1.5 us for
Megatron, so the crossing (``lam`` ~0.27) has Megatron as its optimum: it is priced, steps 107.50 us, meets
the bound and is proven optimal, where the pins used to beat the search by 8 %.

Example::

    bound, problem, optimum = tighten(candidates, built, lower, optimum, solution, read, "auto", 60.0)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from autoshard.errors import InfeasibleError
from autoshard.planner_candidates import RANK_TOLERANCE, Candidate, add_candidate
from autoshard.plans import Plan
from autoshard.problem.build import BuiltProblem
from autoshard.problem.exposure import ExposureTerms, exposure, exposure_terms, tightened
from autoshard.search import SearchProblem, Solution, evaluate, solve

__all__ = ["MAX_PROBES", "tighten"]

#: Solves (``lam = 1`` and the crossings after it); the bound holds whenever the search stops.
MAX_PROBES = 3

Line = tuple[float, float]
"""(``L(p)``, ``D_j(p)``): plan ``p``'s bound as a function of ``lam``."""


def tighten(
    candidates: list[Candidate],
    built: BuiltProblem,
    lower: SearchProblem,
    optimum: Solution,
    solution: Solution,
    read: Callable[[BuiltProblem, Solution], Plan],
    method: Any,
    time_limit: float,
) -> tuple[float, SearchProblem, Solution]:
    """(the best bound found, the problem whose optimum it is, that optimum): ``lower`` and ``optimum``
    (its optimum) when no ``lam`` raises it.  Each probe's optimum is appended to ``candidates``; the search
    stops once the fastest candidate meets the bound (module docstring).  ``solution``: the solver's, whose
    dominance removals each probe re-checks (only the speed)."""
    best = (optimum.lower_bound, lower, optimum)
    terms = exposure_terms(built)
    if terms is None or not optimum.optimal or not math.isfinite(optimum.lower_bound):
        return best  # nothing may hide, or ``lower`` was not solved to optimality (module docstring)

    def probe(lam: float) -> Solution | None:
        nonlocal best
        problem = tightened(lower, terms, lam)
        try:
            found = solve(
                problem,
                method=method,
                time_limit=time_limit,
                dominated=solution.dominated,
                incumbent=optimum.choice,
                dominance_search=False,
            )
        except InfeasibleError:  # the same strategies and budget as ``lower``, which has a plan
            return None
        if found.lower_bound > best[0]:
            best = (found.lower_bound, problem, found)
        add_candidate(
            candidates, f"lower-bound optimum at lam {lam:.3g} from {terms.direction}", built, found, read
        )
        return found

    def met() -> bool:
        return min(plan.predicted_step_time for _, plan, _ in candidates) <= _slack(best[0])

    if not met():
        _maximise(terms, lower, optimum, probe, met)
    return best


def _maximise(
    terms: ExposureTerms,
    lower: SearchProblem,
    optimum: Solution,
    probe: Callable[[float], Solution | None],
    met: Callable[[], bool],
) -> None:
    """Kelley's cutting planes on ``g(lam)`` (module docstring)."""

    def line(found: Solution) -> Line:
        return evaluate(lower, found.choice), exposure(terms, found.choice)

    left = line(optimum)
    if left[1] <= 0:  # g falls from lam = 0 on: no lam > 0 raises the bound
        return
    found = probe(1.0)
    if found is None or met():
        return
    right = line(found)
    for _ in range(MAX_PROBES - 1):
        if right[1] >= 0:  # g still rises at lam = 1: its maximum is there
            return
        lam = min(max((right[0] - left[0]) / (left[1] - right[1]), 0.0), 1.0)  # where the two lines cross
        model = left[0] + left[1] * lam
        found = probe(lam)
        if found is None or met() or found.lower_bound >= model - abs(model) * RANK_TOLERANCE - 1e-12:
            return  # the crossing is g's maximum (to the tolerance), or a candidate met the bound
        cut = line(found)
        if cut[1] > 0:
            left = cut
        else:
            right = cut


def _slack(x: float) -> float:
    return x * (1 + RANK_TOLERANCE) + 1e-12
