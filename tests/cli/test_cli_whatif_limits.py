"""``autoshard whatif`` plans each point under the rules ``search`` plans under (autoshard/whatif_limits.py):
a batch below the plan's batch split and memory over its budget are shown as such, and crossovers are
found only where both plans can run.  New-user trial: "dp faster than tp throughout batch 1..1024" where
DP cannot split a batch under 8 and TP at 1024 does not fit."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import sympy
from cli_support import run_main

import autoshard
from autoshard import zoo
from autoshard.whatif import crossovers, plan_cost

B0 = 64


@functools.cache
def mlp_plans() -> tuple[autoshard.Plan, autoshard.Plan]:
    """The Megatron MLP at batch 64 on one 8-device axis: data parallel only, tensor parallel only."""
    case = zoo.build("mlp", batch=B0)
    cluster = autoshard.load_cluster("a100x8", mesh=(8,))
    dp, tp = (autoshard.plan(case.model, cluster, case.args, allow=[kind]) for kind in ("dp", "tp"))
    assert dp.degrees == {"dp": 8} and tp.degrees == {"tp": 8}
    return dp, tp


def test_each_point_is_checked_as_search_would() -> None:
    dp, tp = (plan_cost(p, n) for p, n in zip(mlp_plans(), ("dp", "tp"), strict=True))
    assert dp.why_not(batch=4) == "batch 4 < DP 8" and dp.why_not(batch=8) is None
    assert tp.why_not(batch=4) is None  # TP splits no batch
    # memory by hand: what grows with the batch (nodes fed by the input, and the largest temporary) x 16
    plan = mlp_plans()[1]
    act = {"x"}
    for node in plan.nodes:
        if set(node.inputs) & act:
            act.add(node.name)
    grows = sum(n.memory_bytes for n in plan.nodes if n.name in act)
    grows += plan.memory_breakdown.get("largest temporary", 0.0)
    at_1024 = plan.memory_per_device + grows * (1024 / B0 - 1)
    assert plan.memory_limit is not None and at_1024 > plan.memory_limit
    assert tp.why_not(batch=1024) == f"does not fit: {(at_1024 - plan.memory_limit) / 2**30:.3g} GiB over"
    (span,) = tp.spans("batch", 1, 1024)
    edge = B0 * (1 + (plan.memory_limit - plan.memory_per_device) / grows)
    assert span == (1, pytest.approx(edge, rel=1e-9))


def test_a_crossover_where_one_plan_cannot_run_is_dropped(tmp_path) -> None:
    dp, tp = mlp_plans()
    found = crossovers(plan_cost(dp, "dp"), [plan_cost(tp, "tp")], "batch", 1, 1024)
    assert len(found) == 1 and 8 < found[0].value < 64  # both can run there
    # the same TP plan under a budget it outgrows at a batch below that crossover: no crossover is left
    cost = plan_cost(tp, "tp")
    point = {**cost.reference, "batch": found[0].value / 2}
    budget = float(cost.limits[-1].need.subs({sympy.Symbol(k, positive=True): v for k, v in point.items()}))
    small = dataclasses.replace(tp, memory_limit=budget)
    assert crossovers(plan_cost(dp, "dp"), [plan_cost(small, "tp")], "batch", 1, 1024) == []
    dp.save(tmp_path / "dp.json")
    small.save(tmp_path / "tp.json")
    result = run_main(
        "whatif", str(tmp_path / "dp.json"), "--against", str(tmp_path / "tp.json"), "--vary", "batch=1..1024"
    )
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    # integer bounds: the gap ends before batch 8, which DP 8 runs (new-user trial: "batch 1..8")
    assert "  dp cannot run at batch 1..7 (at batch 1: batch 1 < DP 8)" in lines
    (over,) = [x for x in lines if x.startswith("  tp cannot run at batch ")]
    assert over.endswith("GiB over)") and "(at batch 1024: does not fit: " in over
    # the memory edge is fractional (trial: "batch 499.639..1024"): the gap starts at the first whole batch
    # over it, and the batch just below runs
    (edge,) = [b for a, b in plan_cost(small, "tp").spans("batch", 1, 1024)]
    assert edge != int(edge)
    assert over.startswith(f"  tp cannot run at batch {int(edge) + 1}..1024 (")
    assert plan_cost(small, "tp").why_not(batch=int(edge)) is None
    assert "batch = " not in result.out
    (both,) = [x for x in lines if "throughout" in x]  # the lead is read where both run only
    assert both.startswith("  tp is faster than dp throughout batch 8..")  # below the crossover: tp
