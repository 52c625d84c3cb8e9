"""Pipeline pins the planner used to accept and then ignore or run wrong (new-user trial).

- ``--schedule X`` without ``--pp``: one line, exit 2 (it was silently ignored);
- microbatches that leave a data-parallel replica a fraction of a sample (batch 8, DP 4, 8 microbatches):
  a pinned count is refused with the counts that fit, ``"auto"`` / the default is planned again with the
  most microbatches that give every replica whole samples (:func:`autoshard.pipeline.options.whole_samples`);
- a weight tied across the first and last stage (GPT-2) is priced once per step on the pipeline axis, and
  only when the two ends sit on different devices (not under ZB-V, which puts both on pipeline rank 0);
- stages of one device each (2 devices, 2 stages) plan.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io

import pytest
import torch

import autoshard
from autoshard import zoo
from autoshard.cli import main
from autoshard.errors import PipelineError
from autoshard.pipeline.options import whole_samples
from autoshard.pipeline.schedules import Schedule, tied_sync_time
from autoshard.pipeline.stages import Part, StageCosts, price_split
from autoshard.plans import Plan
from autoshard.runtime.verify import cluster_for


def test_schedule_without_stages_is_one_line_exit_2() -> None:
    out, err = io.StringIO(), io.StringIO()
    argv = ["search", "--profile", "cpu", "--model", "gpt2-tiny", "--mesh", "4", "--schedule", "1f1b"]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([*argv, "--no-baseline"])
    assert code == 2 and not out.getvalue()
    lines = err.getvalue().strip().splitlines()
    assert len(lines) == 1 and "--schedule 1f1b orders" in lines[0] and "pass --pp N or --pp auto" in lines[0]


def test_schedule_without_stages_api() -> None:
    case = zoo.build("gpt2-tiny", batch=2, seq=8)
    with pytest.raises(PipelineError, match="orders pipeline stages"):
        autoshard.plan(case.model, cluster_for("cpu", 2), case.args, schedule="gpipe")


@functools.cache
def _base() -> Plan:
    case = zoo.build("gpt2-tiny", batch=2, seq=8)
    return autoshard.plan(case.model, cluster_for("cpu", 2), case.args)


def _planner(replicas: dict[int, int], calls: list[object]):
    """A stand-in for the pipelined planner: batch 8, and the DP degree it would pick for each count."""

    def planned(microbatches: int | str | None) -> Plan:
        calls.append(microbatches)
        count = 8 if microbatches in ("auto", None) else int(microbatches)
        degrees = {"pp": 4, "dp": replicas[count]}
        shapes = {"input_ids": ((8, 128), "torch.int64")}
        return dataclasses.replace(_base(), microbatches=count, degrees=degrees, input_shapes=shapes)

    return planned


def test_pinned_microbatches_must_divide_the_samples_of_a_replica() -> None:
    calls: list[object] = []
    with pytest.raises(PipelineError) as err:
        whole_samples(_planner({8: 4}, calls), 8)
    text = str(err.value)
    assert (
        "\n" not in text and "microbatches=8" in text and "4 data-parallel replicas, 2 samples each" in text
    )
    assert "use one of [1, 2]" in text and calls == [8]


@pytest.mark.parametrize("asked", ["auto", None])
def test_searched_microbatches_are_planned_again_to_fit_the_replicas(asked) -> None:
    calls: list[object] = []
    plan = whole_samples(_planner({8: 4, 2: 4}, calls), asked)
    assert calls == [asked, 2] and plan.microbatches == 2
    assert "the most that give each of the 4 data-parallel replicas whole samples" in plan.notes[-1]
    fine: list[object] = []
    assert whole_samples(_planner({8: 1}, fine), asked).microbatches == 8 and fine == [asked]


def _costs(tied: float) -> StageCosts:
    layer = Part(forward=1.0, backward=2.0, static=1.0)
    return StageCosts(layer, Part(once=0.1), Part(once=0.1), 4, p2p_seconds=0.0, tied_sync=tied)


def test_tied_weight_sync_is_priced_on_the_two_end_devices_only() -> None:
    without = price_split(_costs(0.0), (0, 2, 4), Schedule.GPIPE, 2, 1, 4)
    tied = price_split(_costs(0.5), (0, 2, 4), Schedule.GPIPE, 2, 1, 4)
    assert tied.once == pytest.approx(tuple(o + 0.5 for o in without.once))
    assert tied.step_seconds == pytest.approx(without.step_seconds + 0.5)
    # ZB-V: chunks 0 and 3 on pipeline rank 0, the copies are summed there (no all-reduce, no price)
    v_without = price_split(_costs(0.0), (0, 1, 2, 3, 4), Schedule.ZB_V, 2, 2, 4)
    v_tied = price_split(_costs(0.5), (0, 1, 2, 3, 4), Schedule.ZB_V, 2, 2, 4)
    assert v_tied.step_seconds == v_without.step_seconds
    assert tied_sync_time(0, 1e9, 1e-5) == 0.0
    assert tied_sync_time(1e6, 1e9, 1e-5) == pytest.approx(1e-3 + 2e-5)


def test_tied_gpt2_plan_names_the_head_on_the_last_stage_and_prices_its_sync() -> None:
    torch.manual_seed(0)
    case = zoo.build("gpt2-tiny", batch=4, seq=8)
    plan = autoshard.plan(case.model, cluster_for("cpu", 4, (2, 2)), case.args, pipeline=2, schedule="gpipe")
    assert plan.pipeline is not None
    first, last = plan.pipeline.stages[0].modules, plan.pipeline.stages[-1].modules
    assert "transformer.wte" in first and "lm_head" in last and "transformer.wte" not in last
    tied = [c for c in plan.collectives if c.mesh_axis == 0]
    assert [(c.kind, c.phase, c.node) for c in tied] == [("all_reduce", "backward", "transformer.wte.weight")]
    placement = plan.param_placements["transformer.wte.weight"]  # (R on the pipeline axis, the stage's)
    shards = 2 if placement[1].startswith("S") else 1
    assert tied[0].nbytes == 512 * 64 * 4 // shards and tied[0].seconds > 0


def test_stages_of_one_device_plan() -> None:
    """2 devices, 2 stages: each stage's sub-mesh is one device (pricing used to fail on its empty move graph)."""
    case = zoo.build("gpt2-tiny", batch=4, seq=8)
    plan = autoshard.plan(case.model, cluster_for("cpu", 2), case.args, pipeline=2)
    assert plan.pipeline is not None and [s.ranks for s in plan.pipeline.stages] == [(0,), (1,)]
    assert [c.kind for c in plan.collectives] == ["all_reduce"]  # only the tied weights' sum, on the pp axis
