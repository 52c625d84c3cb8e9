"""What a plan's optimality claim covers, in one line: the report, ``show`` and ``explain`` print the same.

Input: a :class:`~autoshard.plans.Plan` (its :class:`~autoshard.plans.SolverReport`, filled by the solver and
by :mod:`autoshard.planner_rerank`).  Output: one sentence naming the objective that was proven.

The solver proves its *linear* step model optimal; the plan reports the critical-path step.  "optimal"
alone is printed only when the reported step itself is proven optimal (``step_optimal``); otherwise the line
says the linear model was proven, and how far the reported step can be from the best plan.

Example::

    >>> proof_line(plan)
    'optimal by the reported (critical-path) step: no plan is faster than the bound 78.08 ms (...)'
"""

from __future__ import annotations

from autoshard.planner_rerank import RANK_TOLERANCE
from autoshard.plans import Plan
from autoshard.report.labels import fmt_seconds

__all__ = ["proof_line"]


def proof_line(plan: Plan) -> str:
    """One line: which objective was proven optimal, and what that says of the reported step."""
    s = plan.solver
    linear = "the linear step model" if s.optimal else f"the linear step model to a gap of {s.gap:.2%}"
    if s.step_optimal and s.step_bound is not None:
        return (
            f"optimal by the reported (critical-path) step: no plan is faster than the bound "
            f"{fmt_seconds(s.step_bound)} ({_picked(s.chosen, len(s.ranked))})"
        )
    head = f"optimal under {linear}" if s.optimal else f"solved under {linear}"
    if not s.ranked:  # no ranking ran (pipeline plans, propagate): only the linear certificate holds
        return f"{head}; the reported step is the critical path and was not ranked"
    if s.step_bound is None:
        why = s.bound_scope.removeprefix("no bound: ") or "unknown"
        return f"{head}; the reported step has no proven bound ({why}); {_picked(s.chosen, len(s.ranked))}"
    gap = max(0.0, plan.predicted_step_time / s.step_bound - 1.0) if s.step_bound > 0 else float("inf")
    scope = f" for {s.bound_scope}" if s.bound_scope else ""
    if s.bound_scope and gap <= RANK_TOLERANCE:  # the bound is reached, but holds only inside its scope
        return (
            f"optimal by the reported (critical-path) step among {s.bound_scope} (bound "
            f"{fmt_seconds(s.step_bound)}; {_picked(s.chosen, len(s.ranked))}); not proven across policies"
        )
    return (
        f"{head}; reported step within {gap:.2%} of the proven bound {fmt_seconds(s.step_bound)}{scope} "
        f"({_picked(s.chosen, len(s.ranked))})"
    )


def _picked(chosen: str, count: int) -> str:
    return f"{chosen}, best of {count} plans priced" if count > 1 else chosen or "solver optimum"
