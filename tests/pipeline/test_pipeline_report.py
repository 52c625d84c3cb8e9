"""A pipelined plan's report speaks of what the stages run (new-user trial, 70B PP 8 on 16 x 8):

- one axis naming everywhere: the cluster line's names follow the whole mesh's positions (``pp=2, axis1=2,
  axis2=8``, not ``axis0=2`` beside a body saying "axis 1 (2)"), and notes from the stage search number
  their axes behind the pipeline's;
- no "over the budget of the whole model" note: the budget holds the stages, not the whole model's extract;
- the communication line is what the busiest pipeline rank waits for, and its note reconciles it with the
  collectives table (total listed, this rank's share, how much of it overlaps compute).
"""

from __future__ import annotations

import functools
import math

import autoshard
from autoshard import zoo
from autoshard.cluster import load_cluster
from autoshard.pipeline.assemble import _whole_axes
from autoshard.plans import Plan
from autoshard.report.labels import fmt_seconds


@functools.cache
def _plan() -> Plan:
    case = zoo.build("llama-tiny", batch=8, seq=16, layers=4)
    cluster = load_cluster("a100x8", nodes=4, mesh=(4, 8))
    return autoshard.plan(case.model, cluster, case.args, pipeline=2, microbatches=4, memory_limit=2**30)


def test_axes_are_named_by_their_place_in_the_whole_mesh() -> None:
    plan = _plan()
    assert plan.mesh_shape == (2, 2, 8) and plan.cluster["axis_names"] == ["pp", "axis1", "axis2"]
    text = plan.summary()
    assert "pp=2 (" in text and "axis1=2 (" in text and "axis2=8 (" in text and "axis0" not in text
    assert "axis 0 (2): PP" in text


def test_stage_notes_number_axes_on_the_whole_mesh() -> None:
    assert _whole_axes("ring attention on axis 0: zigzag layout") == "ring attention on axis 1: zigzag layout"
    assert _whole_axes("split on mesh axes 0, 1 and 2") == "split on mesh axes 1, 2 and 3"
    assert _whole_axes("3 consumers, 256 states") == "3 consumers, 256 states"


def test_no_whole_model_budget_note_and_the_budget_is_recorded() -> None:
    plan = _plan()
    assert not [n for n in plan.notes if "over the budget of the whole model" in n]
    assert plan.memory_limit == 2**30 and plan.memory_per_device <= 2**30


def test_communication_line_reconciles_with_the_collectives_table() -> None:
    plan = _synced()  # _plan()'s table takes no measurable time: its note says so (test below)
    assert math.isclose(plan.compute_time + plan.communication_time, plan.predicted_step_time, rel_tol=1e-9)
    note = next(n for n in plan.notes if n.startswith("communication "))
    assert note.startswith(f"communication {fmt_seconds(plan.communication_time)}: what pipeline rank")
    listed = math.fsum(c.seconds for c in plan.collectives)
    assert f"the collectives table lists {fmt_seconds(listed)} for every stage and microbatch" in note
    assert "overlapped with compute" in note


@functools.cache
def _synced() -> Plan:
    """A plan whose stages reduce gradients (data parallel inside each stage of 4 devices)."""
    case = zoo.build("llama-tiny", batch=32, seq=256, layers=4)
    cluster = load_cluster("a100x8", nodes=1, mesh=(2, 4))
    return autoshard.plan(case.model, cluster, case.args, pipeline=2, microbatches=2, allow=("pp", "dp"))


def test_grad_sync_is_the_busiest_ranks_inside_the_steps_communication() -> None:
    """New-user trial (70B, PP): "grad sync 1.816 s, 1.033 s exposed" beside 328.65 ms of exposed
    communication: the line was the whole model's sync on one stage's sub-mesh."""
    plan = _synced()
    sync = plan.grad_sync
    assert sync is not None and sync.exposed > 0
    assert sync.exposed <= plan.communication_time * (1 + 1e-9)
    every = math.fsum(c.seconds for c in plan.collectives if c.phase == "backward" and c.layer is not None)
    assert sync.seconds < every  # the busiest rank holds 2 of the 4 layers, not all of them
    text = " ".join(plan.summary().split())
    line = f"grad sync (the busiest pipeline rank's stages, once per step) {fmt_seconds(sync.seconds)}, "
    assert line + f"{fmt_seconds(sync.exposed)} exposed" in text
    assert f"(part of the {fmt_seconds(plan.communication_time)} comm above)" in text


def test_adam_state_is_sharded_over_one_stages_devices() -> None:
    """New-user trial: "Adam state sharded over 128 devices" where a stage's weights live on 16."""
    text = " ".join(_synced().summary().split())
    assert "Adam state sharded over the 4 devices of each pipeline stage (ZeRO-1)" in text
    assert "sharded over 8 devices" not in text


def test_a_table_of_no_measurable_time_claims_no_share() -> None:
    """New-user trial (llama-tiny --pp 2 on cpu): "of which this rank runs about 0.0 us (51.7%)".  Every split
    inside a stage is forbidden: since ZeRO-1's gathers are priced the free optimum splits the vocabulary on
    the stage's 2 devices (its embedding's gather saved), and its table then lists measurable time."""
    case = zoo.build("llama-tiny")
    forbid = ["dp", "tp", "sp", "cp", "ep", "fsdp"]
    plan = autoshard.plan(case.model, load_cluster("cpu"), case.args, pipeline=2, forbid=forbid)
    note = next(n for n in plan.notes if n.startswith("communication "))
    assert note.endswith("the collectives table lists none that takes measurable time")
    assert "0.0 us (" not in note and "%" not in note
