"""Mesh-search pruning: a candidate proven unable to beat the best so far is skipped, never the best one."""

from __future__ import annotations

import pytest

from autoshard import zoo
from autoshard.capture import Captured, capture
from autoshard.meshsearch import search_mesh

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
    assert [c.mesh_shape for c in pruned.candidates] == [c.mesh_shape for c in full.candidates]
    unpruned = {c.mesh_shape: c for c in full.candidates}
    cut = [c for c in pruned.candidates if c.pruned]
    assert cut, "the 1-D mesh's optimum without the budget is above the best 2-D plan: it must be pruned"
    for c in cut:
        assert c.bound is not None and c.best is not None
        assert c.bound >= c.best >= pruned.plan.predicted_step_time  # it could not beat the best ...
        assert c.bound <= unpruned[c.mesh_shape].step_seconds  # type: ignore[operator]  # ... and is a true bound
        assert "pruned: bound " in str(c) and " s >= best " in str(c)
    assert any("pruned by a lower bound" in note for note in pruned.plan.notes)
