"""Mesh-search pruning: a candidate proven unable to beat the best so far is skipped, never the best one."""

from __future__ import annotations

import pytest

import autoshard
from autoshard import zoo
from autoshard.capture import Captured, capture
from autoshard.meshsearch import search_mesh
from autoshard.report.proof import proof_line

#: Per-device budget that binds on the Megatron MLP (16 x 4096 tokens) on one node of 8 A100s: 0.9 x the
#: least memory any mesh needs without a budget (measured), so each mesh's optimum differs from its free one.
_BUDGET = 0.9 * 9053235712.0


@pytest.fixture(scope="module")
def mlp() -> tuple[zoo.ModelCase, Captured]:
    case = zoo.build("mlp", batch=16, seq=4096)
    return case, capture(case.model, case.args, dict(case.kwargs), blocks="auto")


@pytest.mark.parametrize("order", [[(4, 2), (8,), (2, 2, 2)]])
def test_pruning_keeps_the_best_mesh_and_its_plan(mlp: tuple[zoo.ModelCase, Captured], order: list) -> None:
    case, captured = mlp
    runs = {
        prune: search_mesh(
            case.model,
            "a100x8",
            case.args,
            case.kwargs,
            nodes=1,
            meshes=order,
            captured=captured,
            prune=prune,
            memory_limit=_BUDGET,
        )
        for prune in (True, False)
    }
    pruned, full = runs[True], runs[False]
    assert pruned.mesh_shape == full.mesh_shape
    assert pruned.plan.predicted_step_time == full.plan.predicted_step_time
    assert pruned.candidates[0].mesh_shape == full.candidates[0].mesh_shape
    assert {c.mesh_shape for c in pruned.candidates} == {c.mesh_shape for c in full.candidates}
    unpruned = {c.mesh_shape: c for c in full.candidates}
    cut = [c for c in pruned.candidates if c.pruned]
    assert cut, "the 1-D mesh's optimum without the budget is above the best 2-D plan: it must be pruned"
    for c in cut:
        assert c.bound is not None and c.best is not None
        assert c.bound >= c.best >= pruned.plan.predicted_step_time  # it could not beat the best ...
        assert c.bound <= unpruned[c.mesh_shape].step_seconds  # type: ignore[operator]  # ... and is a true bound
        assert "pruned: bound " in str(c) and " s >= best " in str(c)
    assert any("pruned by a lower bound" in note for note in pruned.plan.notes)


@pytest.mark.parametrize("order", [[(4, 2), (8,), (2, 2, 2)], [(2, 2, 2), (8,), (4, 2)]])
def test_mesh_auto_equals_every_fixed_mesh_solved(mlp: tuple[zoo.ModelCase, Captured], order: list) -> None:
    """Each mesh planned on its own (no ceiling, no floor): the search returns the fastest (the earliest given
    on a tie) with the same plan and claim; every floor and bound lies below its own mesh's step."""
    case, captured = mlp
    fixed = {
        mesh: autoshard.plan(
            case.model,
            autoshard.load_cluster("a100x8", mesh=mesh),
            case.args,
            case.kwargs,
            captured=captured,
            memory_limit=_BUDGET,
        )
        for mesh in order
    }
    winner = min(order, key=lambda m: (fixed[m].predicted_step_time, order.index(m)))
    found = search_mesh(
        case.model, "a100x8", case.args, case.kwargs, meshes=order, captured=captured, memory_limit=_BUDGET
    )
    assert found.mesh_shape == winner
    assert found.plan.predicted_step_time == fixed[winner].predicted_step_time
    assert proof_line(found.plan) == proof_line(fixed[winner])
    assert found.plan.solver.step_bound == fixed[winner].solver.step_bound
    before = [c for c in found.candidates if c.proof]
    assert before, "2x2x2 is proven slower by its floor under the budget, before planning"
    for c in found.candidates:
        step = fixed[c.mesh_shape].predicted_step_time
        assert c.floor is not None and c.floor <= step * (1 + 1e-12)
        if c.pruned:
            assert c.bound is not None and c.best == found.plan.predicted_step_time
            assert c.best <= c.bound <= step * (1 + 1e-12)
            assert c.bound > c.best or order.index(c.mesh_shape) > order.index(
                winner
            )  # ties keep the earlier
        else:
            assert c.step_seconds == step
