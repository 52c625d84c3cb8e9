"""The op-by-op alternative of fused expert MLPs is planned with the fused plan's step as its ceiling: where it
is pruned, planning it to the end gives a step no better, so the plan returned is the one without the ceiling."""

from __future__ import annotations

import autoshard
from autoshard import zoo
from autoshard.capture import capture
from autoshard.errors import AutoshardError
from autoshard.planner_steps import Pruned, cheaper


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


def test_a_pruned_alternative_keeps_the_fused_plan_and_says_so() -> None:
    case = zoo.build("mixtral-tiny")
    fused = autoshard.plan(case.model, autoshard.load_cluster("a100x8", mesh=(8,)), case.args, case.kwargs)
    kept = cheaper(fused, Pruned(9.0))
    assert kept.predicted_step_time == fused.predicted_step_time  # type: ignore[union-attr]
    assert any("op by op: at least 9 s per step, not solved further" in n for n in kept.notes)  # type: ignore[union-attr]
