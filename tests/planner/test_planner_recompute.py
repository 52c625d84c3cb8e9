"""Recomputation is a searched choice for the repeated blocks: none / selective / full, priced in compute,
re-issued forward collectives and memory; the fastest plan that fits the memory wins."""

from __future__ import annotations

import functools
from collections import Counter

import pytest

import autoshard
from autoshard import zoo
from autoshard.capture import Captured, capture
from autoshard.plans import Plan

# data parallel pinned, so that only recomputation (not more sharding) can save activation memory
DATA_PARALLEL = {
    "input_ids": ("S(0)",),
    "*_proj": "replicate",
    "lm_head": "replicate",
    "model.embed_tokens": "replicate",
}


@functools.cache
def forced(policy: str, megatron: bool = False, limit: float | None = None) -> Plan | None:
    """The plan under ``policy`` ("auto": searched), or None when none fits ``limit``."""
    return _plan_on_8(256, policy, limit, MEGATRON if megatron else DATA_PARALLEL)


def _plan_on_8(seq: int, policy: str, limit: float | None, annotations: dict | None = None) -> Plan | None:
    """llama-tiny (2 layers, batch 8 x ``seq``) on 8 A100 under ``policy``; None when no plan fits ``limit``."""
    case, captured = _captured(seq)
    try:
        return autoshard.plan(
            case.model,
            autoshard.load_cluster("a100x8", mesh=(8,)),
            case.args,
            case.kwargs,
            annotations=annotations,
            recompute=policy,  # type: ignore[arg-type]
            memory_limit=limit,
            captured=captured,
        )
    except autoshard.InfeasibleError:
        return None


@functools.cache
def _captured(seq: int) -> tuple[zoo.ModelCase, Captured]:
    """llama-tiny at ``seq``, captured once for every plan of it (planning leaves a capture unchanged)."""
    case = zoo.build("llama-tiny", layers=2, batch=8, seq=seq, device="meta")
    return case, capture(case.model, case.args, case.kwargs)


COLUMN, ROW = ((1, 1, 1), (8, 1)), ((1, 1, 8), (1, 8))  # linear on (B, S, H): input R / input split
MEGATRON = {
    **{f"*.{m}": COLUMN for m in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")},
    **{f"*.{m}": ROW for m in ("o_proj", "down_proj")},
}


@pytest.mark.slow
def test_each_policy_trades_time_for_memory() -> None:
    none, selective, full = (forced(p) for p in ("none", "selective", "full"))
    assert none is not None and selective is not None and full is not None
    assert [p.recompute for p in (none, selective, full)] == ["none", "selective", "full"]
    assert none.predicted_step_time < selective.predicted_step_time < full.predicted_step_time
    assert none.memory_per_device > selective.memory_per_device > full.memory_per_device


@pytest.mark.slow
def test_the_search_picks_the_fastest_policy_that_fits() -> None:
    """Under a budget just above what selective recomputation needs, the searched plan is the fastest of the
    three policies solved one by one under the same budget (none may still fit by sharding more)."""
    selective = forced("selective")
    assert selective is not None
    limit = selective.memory_per_device * 1.01
    each = {p: forced(p, limit=limit) for p in ("none", "selective", "full")}
    fitting = {p: plan for p, plan in each.items() if plan is not None}
    assert "selective" in fitting and "full" in fitting
    searched = forced("auto", limit=limit)
    assert searched is not None
    best = min(fitting, key=lambda p: fitting[p].predicted_step_time)
    assert searched.recompute == best
    assert searched.predicted_step_time == pytest.approx(fitting[best].predicted_step_time, rel=1e-9)
    assert searched.memory_per_device <= limit
    if best != "none":
        assert any("recomputation" in n for n in searched.notes)


def test_full_recompute_reissues_the_forward_collectives_inside_blocks() -> None:
    none, full = forced("none", megatron=True), forced("full", megatron=True)
    assert none is not None and full is not None
    # every forward move between two block nodes runs again when backward recomputes the block (listed
    # twice); moves out of a block (to the final norm) or into it from outside (the embedding) run once
    in_block = {n.name for n in full.nodes if n.key.startswith("block:")}
    runs = Counter((c.kind, c.tensor, c.node, c.layer) for c in full.collectives if c.phase == "forward")
    inside = {k for k in runs if k[1] in in_block and k[2] in in_block}
    assert inside, "Megatron moves inside the layers"
    assert all(runs[k] == (2 if k in inside else 1) for k in runs)
    assert full.collective_counts("backward") == none.collective_counts("backward")
    # after o_proj and down_proj, per layer; the last may reduce-scatter into a sequence split of the final
    # norm and head instead (their gradient syncs hide under the layers' backward: problem/step.py)
    forward = none.collective_counts("forward")
    assert forward["all_reduce"] + forward.get("reduce_scatter", 0) == 4


def test_plan_records_the_choice_through_json(tmp_path) -> None:
    plan = forced("selective")
    assert plan is not None
    plan.save(tmp_path / "plan.json")
    assert autoshard.load_plan(tmp_path / "plan.json").recompute == "selective"


@functools.cache
def unpinned(policy: str, limit: float | None = None) -> Plan | None:
    """llama-tiny planned freely at a long sequence (2 layers, batch 8 x 2048 on 8 A100), where activations
    are a large part of what a device keeps; None when no plan of ``policy`` fits ``limit``."""
    return _plan_on_8(2048, policy, limit)


@pytest.mark.slow  # a capture and five plans: 5.3 CPU s on this machine (2026-11, load 4)
def test_a_bounded_policy_cannot_have_won() -> None:
    """A quarter MiB under what the unbudgeted optimum keeps, keeping every activation still fits (by
    sharding differently, at a slower step) and wins; selective and full recomputation are bounded, not
    solved (planner_policy.py).  Solved one by one under the same budget, each is at least its stated bound,
    and the bound is at least the chosen plan's step."""
    free = unpinned("none", float("inf"))
    assert free is not None
    limit = free.memory_per_device - 2**18
    searched = unpinned("auto", limit)
    assert searched is not None and searched.recompute == "none"
    assert searched.memory_per_device <= limit
    assert searched.predicted_step_time > free.predicted_step_time, "the budget binds: no early stop"
    notes = [n for n in searched.notes if n.startswith("not solved, bounded: ")]
    assert len(notes) == 1
    bounds = {
        part.split(" recomputation: at least ")[0]: float(part.split(" at least ")[1].split(" s ")[0])
        for part in notes[0].removeprefix("not solved, bounded: ").split("; ")
    }
    assert set(bounds) == {"selective", "full"}
    for policy, bound in bounds.items():
        assert bound >= searched.predicted_step_time
        alone = unpinned(policy, limit)  # both fit: each is a real alternative that lost
        assert alone is not None and alone.recompute == policy
        assert alone.predicted_step_time >= bound * (1 - 1e-3)  # the note rounds to 4 digits
