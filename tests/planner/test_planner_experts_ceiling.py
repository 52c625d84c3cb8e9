"""The op-by-op alternative of fused expert MLPs (autoshard/planner_experts.py) is first bounded by its floor,
then planned with the fused plan's step as its ceiling: where it is pruned, planning it to the end gives a
step no better, so the plan returned is the one without the ceiling."""

from __future__ import annotations

import math

import pytest

import autoshard
from autoshard import zoo
from autoshard.capture import Captured, capture
from autoshard.errors import AutoshardError, InfeasibleError
from autoshard.planner_candidates import RANK_TOLERANCE
from autoshard.planner_experts import plan_unfused, proven_slower
from autoshard.planner_steps import Pruned, cheaper
from autoshard.plans import Plan
from autoshard.search import BoundExceeded


def test_the_pruned_alternative_could_not_have_won() -> None:
    case = zoo.build("mixtral-tiny")
    cluster = autoshard.load_cluster("a100x8", mesh=(8,))
    budget = 1.0015e9  # binds (1.0020e9 without it): the op-by-op plan would need a budgeted solve
    plan = autoshard.plan(case.model, cluster, case.args, case.kwargs, memory_limit=budget)
    note = next(n for n in plan.notes if n.startswith("expert MLPs planned"))
    unfused = capture(case.model, case.args, dict(case.kwargs), fuse_experts=False)
    try:  # the alternative planned to the end, no ceiling
        alone = autoshard.plan(
            case.model, cluster, case.args, case.kwargs, memory_limit=budget, captured=unfused
        ).predicted_step_time
    except AutoshardError:
        alone = float("inf")
    assert "not solved further" in note  # pruned at its bound without the budget
    assert alone >= plan.predicted_step_time
    bound = proven_slower(unfused, cluster, {"memory_limit": budget}, plan.predicted_step_time)
    assert bound is not None and plan.predicted_step_time <= bound <= alone * (1 + RANK_TOLERANCE)

    def never(*args: object, **kwargs: object) -> Plan:
        raise AssertionError("an alternative proven slower by its floor is not solved")

    kept = plan_unfused(plan, lambda: unfused, never, cluster, {"memory_limit": budget}, math.inf)
    assert isinstance(kept, Plan) and kept.predicted_step_time == plan.predicted_step_time


def test_a_pruned_alternative_keeps_the_fused_plan_and_says_so() -> None:
    case = zoo.build("mixtral-tiny")
    fused = autoshard.plan(case.model, autoshard.load_cluster("a100x8", mesh=(8,)), case.args, case.kwargs)
    kept = cheaper(fused, Pruned(9.0))
    assert kept.predicted_step_time == fused.predicted_step_time  # type: ignore[union-attr]
    assert any("op by op: at least 9 s per step, not solved further" in n for n in kept.notes)  # type: ignore[union-attr]


def test_an_alternative_the_floor_cannot_prove_slower_is_solved_under_the_ceiling() -> None:
    """No fused plan and no ceiling: nothing to prove, so the op-by-op capture is solved (stubs, no solver)."""
    case = zoo.build("mixtral-tiny")
    cluster = autoshard.load_cluster("a100x8", mesh=(8,))
    unfused = capture(case.model, case.args, dict(case.kwargs), fuse_experts=False)
    planned = autoshard.plan(case.model, cluster, case.args, case.kwargs, captured=unfused)
    asked: list[float] = []

    def solve_one(captured: Captured, timings: dict[str, float], ceiling: float) -> Plan:
        asked.append(ceiling)
        return planned

    kept = plan_unfused(InfeasibleError("no fused plan"), lambda: unfused, solve_one, cluster, {}, math.inf)
    assert asked == [math.inf] and isinstance(kept, Plan)
    assert kept.notes[-1].startswith("expert MLPs planned op by op")
    with pytest.raises(BoundExceeded):  # neither capture beats the caller's ceiling: its floor says so
        plan_unfused(InfeasibleError("no fused plan"), lambda: unfused, solve_one, cluster, {}, 1e-9)
    assert asked == [math.inf]
