"""FSDP gathers that backward runs again to recompute a block are recomputation's, not the forward's: the plan
marks them (``Collective.recompute``), the report lists them as backward re-gathers and counts them in the
``regather`` total, and a plan file that marks anything else is refused in one line (plan_check)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

import autoshard
from autoshard import zoo
from autoshard.errors import PlanFileError
from autoshard.plans import Plan
from autoshard.report.dot import to_dot
from autoshard.report.table import render

FSDP = {"input_ids": ("S(0)",), "*_proj.weight": ("S(0)",)}  # 7 weights per layer stored split


@pytest.fixture(scope="module")
def full() -> Plan:
    case = zoo.build("llama-tiny", layers=2, batch=8, seq=64, device="meta")
    cluster = autoshard.load_cluster("a100x8", mesh=(8,))
    return autoshard.plan(case.model, cluster, case.args, case.kwargs, annotations=FSDP, recompute="full")


def test_recomputed_gathers_are_marked_and_are_the_forward_ones_again(full: Plan) -> None:
    gathers = [c for c in full.collectives if c.kind == "all_gather" and c.node != "output"]
    weights = Counter((c.tensor, c.layer) for c in gathers if c.tensor.endswith("weight") and not c.recompute)
    again = Counter((c.tensor, c.layer) for c in gathers if c.recompute)
    assert len(again) == 2 * 7  # every split weight of both layers, re-gathered once
    assert again == Counter({k: 1 for k in again}) and set(again) <= set(weights)
    assert all(c.phase == "forward" for c in full.collectives if c.recompute)  # the runtime logs them so


def test_the_report_lists_them_as_recomputation_regathers(full: Plan) -> None:
    report = " ".join(render(full).split())
    assert "bwd all_gather 0 14 288.0 KiB" in report and "weight re-gather (recompute)" in report
    assert "regather 14 (288.0 KiB, 158.6 us; 14 for recomputation)" in report
    assert "total: forward 15 " in report  # 14 weights + the embedding's output, not 29
    assert "(288.0 KiB per step, 288.0 KiB more re-gathered to recompute)" in report
    dot = to_dot(full)
    assert "bwd recompute all_gather axis 0" in dot and "fwd all_gather axis 0" in dot


def test_the_mark_survives_json_and_plan_check_refuses_it_elsewhere(full: Plan, tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    full.save(path)
    assert autoshard.load_plan(path).collectives == full.collectives
    data = json.loads(path.read_text())
    i = next(i for i, c in enumerate(data["collectives"]) if c["recompute"])
    for change, said in (
        ({"phase": "backward"}, "only forward moves are recomputed"),
        ({"recompute": "yes"}, "must be true or false"),
    ):
        bad = json.loads(path.read_text())
        bad["collectives"][i].update(change)
        path.write_text(json.dumps(bad))
        with pytest.raises(PlanFileError, match=said) as e:
            autoshard.load_plan(path)
        assert f"collectives[{i}].recompute" in str(e.value) and "\n" not in str(e.value)
    data["recompute"] = "none"
    path.write_text(json.dumps(data))
    with pytest.raises(PlanFileError, match="the plan's recompute is none"):
        autoshard.load_plan(path)
