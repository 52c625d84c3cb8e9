"""The ranking's shortcuts change its cost, not its answer (autoshard/planner_rerank.py, meshsearch.py).

* Once a candidate meets the bound, the ranking prices no more plans: the plan, the bound, the scope and the
  claim are those of the exhaustive ranking (every candidate priced), on two small models.
* The mesh search solves the unpinned price for its winner only: the price equals the one planned in place.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from test_planner_overlap import Stack  # 8 residual MLP blocks (tests/planner)

import autoshard
import autoshard.planner_steps as steps
from autoshard import zoo
from autoshard.meshsearch import search_mesh
from autoshard.planner_rerank import rank_plan
from autoshard.plans import Plan
from autoshard.report.proof import proof_line


def _rank_inputs(monkeypatch: pytest.MonkeyPatch, run: Any) -> list[tuple[tuple, dict]]:
    """The arguments of every ``rank_plan`` call ``run()`` makes."""
    calls: list[tuple[tuple, dict]] = []

    def spy(*args: Any, **kwargs: Any) -> Plan:
        calls.append((args, kwargs))
        return rank_plan(*args, **kwargs)

    monkeypatch.setattr(steps, "rank_plan", spy)
    run()
    return calls


def _claim(plan: Plan) -> str:
    """The proof line less the parenthesis naming the plan picked and how many were priced."""
    line = proof_line(plan)
    return line.split(" (")[0] + line.split(")")[-1]


def _llama_selective() -> None:
    case = zoo.build("llama-tiny", layers=2, batch=8, seq=256, device="meta")
    cluster = autoshard.load_cluster("a100x8", mesh=(8,))
    autoshard.plan(case.model, cluster, case.args, case.kwargs, recompute="selective")


def _stack_fsdp() -> None:
    with torch.device("meta"):
        model, x = Stack(8, 1024).to(torch.bfloat16), torch.randn(16384, 1024, dtype=torch.bfloat16)
    autoshard.plan(model, autoshard.load_cluster("a100x8", mesh=(2, 4)), (x,))


@pytest.mark.parametrize("run", [_llama_selective, _stack_fsdp], ids=["llama-selective", "stack-2x4"])
def test_the_shortcut_ranks_like_the_exhaustive_path(monkeypatch: pytest.MonkeyPatch, run: Any) -> None:
    calls = _rank_inputs(monkeypatch, run)
    assert calls, "the planner ranks its plan"
    skipped, shorts = 0, []
    for args, kwargs in calls:
        short = rank_plan(*args, **kwargs)
        shorts.append(short)
        full = rank_plan(*args, **kwargs, exhaustive=True)
        s, f = short.solver, full.solver
        assert short.nodes == full.nodes and short.predicted_step_time == full.predicted_step_time
        assert (s.step_bound, s.step_optimal, s.bound_scope) == (f.step_bound, f.step_optimal, f.bound_scope)
        assert s.chosen.split(" = ")[0] == f.chosen.split(" = ")[0]  # the full path may add "= fsdp"
        assert _claim(short) == _claim(full)
        assert len(s.ranked) <= len(f.ranked)
        skipped += len(f.ranked) - len(s.ranked)
    if run is _llama_selective:  # one recomputation policy: a scope, inside which the bound is met
        assert shorts and all(p.solver.bound_scope for p in shorts)
        # the bound was met inside the scope (the hand plans then go unpriced) while llama-tiny ran replicated;
        # since ZeRO-1's gathers are priced it syncs gradients and the step shows them: short of the bound the
        # shortcut may still skip the candidates a masked lower bound proves slower (planner_candidates), so
        # only a met bound says how many go unpriced
        met = all(p.solver.step_optimal for p in shorts)
        assert skipped > 0 or not met, "the shortcut skips hand plans once the bound is met"


def test_the_mesh_search_prices_its_winner_unpinned_as_planning_it_alone() -> None:
    case = zoo.build("llama-tiny", batch=8, seq=32)
    meshes = [(8,), (4, 2)]
    found = search_mesh(case.model, "a100x8", case.args, case.kwargs, meshes=meshes, forbid=["tp"])
    alone = autoshard.plan(
        case.model,
        autoshard.load_cluster("a100x8", mesh=found.mesh_shape),
        case.args,
        case.kwargs,
        forbid=["tp"],
    )
    assert found.plan.unpinned_step_time is not None
    assert found.plan.unpinned_step_time == alone.unpinned_step_time
    assert found.plan.predicted_step_time == alone.predicted_step_time
