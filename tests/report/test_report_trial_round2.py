"""Report lines of the second new-user trial, one test each: a collective row of the model's return value
read "output of" with nothing after it; ``plan.summary()`` had no data-parallel comparison; PP on one device
per stage "sharded" Adam state "over the 1 devices"; a recomputing baseline did not say so."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

import autoshard
from autoshard import zoo
from autoshard.report.table import Baseline, render, report_data

sys.path.insert(0, str(Path(__file__).parents[1] / "cli"))  # the hand-written plans of the report tests
import report_cases as cases


def test_a_collective_on_the_model_output_is_named() -> None:
    """``train.py plan ... --layout fsdp`` listed "fwd all_reduce 0 1 4 B 501.5 us output of": the loss,
    summed over the batch axis at the root module, whose path is empty."""
    ops = [("linear", "fc", cases.LINEAR, "S(0), R -> S(0)")]
    comms = [cases.collective("all_reduce", "forward", "linear", "output", "", nbytes=4)]
    report = render(cases.make_plan((8,), {"fc.weight": ("R",)}, ops, comms, inputs={"x": ("S(0)",)}))
    row = next(line for line in report.splitlines() if "all_reduce" in line and "4 B" in line)
    assert row.rstrip().endswith("the model's output (its return value)")


def test_summary_from_python_compares_data_parallel_or_says_why_not() -> None:
    """``plan.summary()`` had no data-parallel line while ``autoshard search`` printed one and the README said
    the report does: without a baseline it says it was not compared and how; with one it prints the column."""
    case = zoo.build("gpt2-tiny", batch=8, seq=32)
    cluster = autoshard.load_cluster("a100x8")
    plan = autoshard.plan(case.model, cluster, case.args)
    alone = " ".join(plan.summary().split())
    assert "data parallel: not compared (summary() sees only this plan)" in alone
    replicated = {name: ("R",) for name, _ in case.model.named_parameters()}
    dp = autoshard.plan(case.model, cluster, case.args, annotations=replicated | {"input_ids": ("S(0)",)})
    both = plan.summary(baseline=dp)
    assert "data parallel" in both.split("predicted step time, memory")[1].splitlines()[0]
    assert "not compared" not in both and "than data parallel" in both


def test_adam_state_on_one_device_per_stage_is_not_sharded() -> None:
    """PP 8 on 8 devices read "Adam state sharded over the 1 devices of each pipeline stage"."""
    case = zoo.build("llama-tiny", layers=4)
    plan = autoshard.plan(case.model, autoshard.load_cluster("cpu"), case.args, pipeline=4)
    assert plan.pipeline is not None and plan.num_devices == plan.mesh_shape[plan.pipeline.mesh_axis] == 4
    # the node table is the busiest device's as the stage search counts it: with the reserve, its memory
    held = sum(n.memory_bytes for n in plan.nodes) + sum(plan.memory_breakdown.values())
    assert held == pytest.approx(plan.memory_per_device, rel=1e-12)
    text = " ".join(plan.summary().split())
    assert "optimizer: Adam state not sharded (each pipeline stage runs on 1 device)" in text
    assert "over the 1 devices" not in text


def test_a_baseline_that_recomputes_says_so_beside_the_plan() -> None:
    """LLaMA-3-8B ``--forbid tp``: 41.4 GiB of activations beside data parallel's 36.3 GiB and 1.152 s of
    compute beside 1.164 s; nothing said that data parallel only fits with selective recomputation on 8 of
    its 32 blocks (its extra compute, its smaller activations) while the plan recomputes nothing."""
    case = zoo.build("gpt2-tiny", batch=8, seq=32)
    plan = autoshard.plan(case.model, autoshard.load_cluster("a100x8"), case.args)
    recomputing = dataclasses.replace(plan, recompute="selective", recompute_blocks=1)
    text = " ".join(render(plan, baseline=Baseline.of(recomputing)).split())
    assert (
        "data parallel recomputes selective on 1 block, none on the rest (this plan: none): its compute "
        "includes the recomputed forward" in text
    )
    assert "data parallel recomputes" not in render(plan, baseline=Baseline.of(plan))
    data = report_data(plan, Baseline.of(recomputing))
    assert Baseline.from_report(data) == Baseline.of(recomputing)  # saved with the report, read back
