"""What a plan's optimality claim covers, in one line: the report, ``show`` and ``explain`` print the same.

Input: a :class:`~autoshard.plans.Plan` (its :class:`~autoshard.plans.SolverReport`, filled by the solver and
by :mod:`autoshard.planner_rerank`).  Output: one sentence naming the objective that was proven.

The solver proves its *linear* step model optimal; the plan reports the critical-path step.  "optimal"
alone is printed only when the reported step itself is proven optimal (``step_optimal``); otherwise the line
leads with what is proven of the reported step (how far it can be from a lower bound on every plan's, or
nothing), then says the linear model's optimum holds for that model only.

Example::

    >>> proof_line(plan)
    'optimal by the reported (critical-path) step: no plan is faster than the bound 78.08 ms (...)'
"""

from __future__ import annotations

from autoshard.planner_counts import COUNTS_NOTE
from autoshard.planner_rerank import RANK_TOLERANCE
from autoshard.plans import Plan
from autoshard.report.labels import fmt_seconds

__all__ = ["proof_line"]


def proof_line(plan: Plan) -> str:
    """One line: which objective was proven optimal, what that says of the reported step, and over which
    microbatch counts (:func:`_counts`)."""
    return _claim(plan) + _counts(plan)


def _counts(plan: Plan) -> str:
    """The claim's scope in microbatch counts, for plans without stages: the claim is among plans with the
    plan's count, unless ``microbatches="auto"`` searched them (new-user trial: "proven: optimal" on one
    microbatch at 5.484 s, while 4 microbatches plan at 4.513 s)."""
    if plan.pipeline is not None:
        return ""
    if any(note.startswith(COUNTS_NOTE) for note in plan.notes):
        return "; every other microbatch count planned or proven no faster (see the note)"
    count = plan.microbatches
    return (
        f"; among plans of {count} microbatch{'' if count == 1 else 'es'} per step (--microbatches auto, "
        "microbatches='auto' in Python, searches the counts)"
    )


def _claim(plan: Plan) -> str:
    s = plan.solver
    linear = "the linear step model" if s.optimal else f"the linear step model to a gap of {s.gap:.2%}"
    if s.step_optimal and s.step_bound is not None:
        return (
            f"optimal by the reported (critical-path) step: no plan is faster than the bound "
            f"{fmt_seconds(s.step_bound)} ({_picked(s.chosen, len(s.ranked))})"
        )
    # what is proven of the reported step first: "optimal under the linear step model" alone read as
    # "proven optimal" to a new user, beside a step 48% above its bound
    head = f"optimal under {linear} only" if s.optimal else f"solved under {linear} only"
    if not s.ranked:  # no ranking ran (pipeline plans, propagate): only the linear certificate holds
        return f"nothing of the reported (critical-path) step, which was not ranked; {head}"
    if s.step_bound is None:
        why = s.bound_scope.removeprefix("no bound: ") or "unknown"
        return (
            f"nothing of the reported step, which has no proven bound ({why}); {head} "
            f"({_picked(s.chosen, len(s.ranked))})"
        )
    gap = max(0.0, plan.predicted_step_time / s.step_bound - 1.0) if s.step_bound > 0 else float("inf")
    scope = f" among {s.bound_scope}" if s.bound_scope else ""
    others = _other_policies(plan, s.bound_scope)
    if others and gap <= RANK_TOLERANCE:  # the bound is reached, and every other policy is bounded above it
        return (
            f"optimal across recomputation policies by the reported (critical-path) step: bound "
            f"{fmt_seconds(s.step_bound)} for {s.bound_scope}; {others} ({_picked(s.chosen, len(s.ranked))}; "
            "per-block mixes ruled out under the linear step model)"
        )
    if s.bound_scope and gap <= RANK_TOLERANCE:  # the bound is reached, but holds only inside its scope
        return (
            f"optimal by the reported (critical-path) step among {s.bound_scope} (bound "
            f"{fmt_seconds(s.step_bound)}; {_picked(s.chosen, len(s.ranked))}); not proven across policies"
        )
    return (
        f"reported step within {gap:.2%} of a lower bound (no plan is faster than {fmt_seconds(s.step_bound)}"
        f"{scope}); {head} ({_picked(s.chosen, len(s.ranked))})"
    )


def _other_policies(plan: Plan, scope: str) -> str:
    """The other uniform recomputation policies' proven step bounds (the planner's "not solved, bounded"
    note, :mod:`autoshard.planner_policy`), when the scope is one whole policy and both others are bounded
    above the plan's step; else ''.  The bounds were proven at least the best step found when priced, so
    the plan is the fastest of every policy (new-user trial: "not proven across policies" above a note
    bounding selective at 1.2 s and full at 1.497 s under a 1.157 s plan)."""
    policy = {"plans without recomputation": "none"}.get(scope)
    for name in ("selective", "full"):
        if scope == f"plans with {name} recomputation of the repeated blocks":
            policy = name
    note = next((n for n in plan.notes if n.startswith(_BOUNDED)), "")
    bounds = dict(_bound(item) for item in note.removeprefix(_BOUNDED).split("; ") if note)
    others = {"none", "selective", "full"} - {policy or ""}
    step = plan.predicted_step_time / (1 + RANK_TOLERANCE)
    if policy is None or set(bounds) != others or any(b < step for b in bounds.values()):
        return ""
    return ", ".join(
        f"{p} recomputation at least {fmt_seconds(bounds[p])}" for p in sorted(others, reverse=True)
    )


def _bound(item: str) -> tuple[str, float]:
    """``"selective recomputation: at least 1.2 s per step"`` -> ``("selective", 1.2)``."""
    name, _, rest = item.partition(" recomputation: at least ")
    try:
        return name, float(rest.removesuffix(" s per step"))
    except ValueError:
        return name, 0.0  # not a bound this reader knows: never counted as proven


_BOUNDED = "not solved, bounded: "  # autoshard/planner.py's note of the policies cannot_win ruled out


def _picked(chosen: str, count: int) -> str:
    return f"{chosen}, best of {count} plans priced" if count > 1 else chosen or "solver optimum"
