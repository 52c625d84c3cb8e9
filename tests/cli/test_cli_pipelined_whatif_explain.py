"""``whatif --set`` and ``explain`` on a pipelined plan (LLaMA-tiny, PP 2 across 2 nodes of the cpu profile).

The plan's stage problem is rebuilt as the pipeline search built it (:mod:`autoshard.pipeline_replay`): priced
unchanged it gives the plan's own step; with the network between nodes twice as fast only the hand-offs
between the stages move, by a hand-computed amount; ``explain`` prints the plan's own decisions."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
from cli_support import run_main

from autoshard.codegen.parallelize import plan_cluster
from autoshard.pipeline.layers import boundary_bytes
from autoshard.pipeline_replay import Replay, ReplayError, _check_match, replay
from autoshard.plans import Plan, load_plan
from autoshard.report.explain import explain
from autoshard.search import Solution
from autoshard.whatif_pipeline import pipeline_whatif

pytestmark = pytest.mark.slow  # a search and a few stage rebuilds (~30 s on 2 cores)


@pytest.fixture(scope="module")
def replayed(pipelined_plans: tuple[Path, Path]) -> tuple[Plan, Replay]:
    plan = load_plan(pipelined_plans[0])
    assert plan.pipeline is not None and plan.pipeline.degree == 2
    return plan, replay(plan)


def test_replay_unchanged_is_the_plans_step(replayed: tuple[Plan, Replay]) -> None:
    plan, again = replayed
    assert plan.pipeline is not None and again.plan.pipeline is not None
    assert again.plan.predicted_step_time == pytest.approx(plan.predicted_step_time, rel=1e-9, abs=0)
    assert again.plan.pipeline.bubble_fraction == pytest.approx(plan.pipeline.bubble_fraction, rel=1e-9)
    for s, t in zip(plan.pipeline.stages, again.plan.pipeline.stages, strict=True):
        assert (s.layers, s.ranks) == (t.layers, t.ranks)
        assert t.memory_bytes == pytest.approx(s.memory_bytes, rel=1e-9)
        assert t.compute_seconds == pytest.approx(s.compute_seconds, rel=1e-9)


def test_a_replay_that_does_not_price_the_plan_is_refused(replayed: tuple[Plan, Replay]) -> None:
    plan, again = replayed
    off = dataclasses.replace(plan, predicted_step_time=plan.predicted_step_time * (1 + 1e-6))
    with pytest.raises(ReplayError, match="re-plan it") as e:
        _check_match(off, again.plan)
    assert "\n" not in str(e.value)


def test_twice_the_inter_node_bandwidth_moves_only_the_hand_offs(replayed: tuple[Plan, Replay]) -> None:
    plan, again = replayed
    assert plan.pipeline is not None and plan.pipeline.schedule in ("gpipe", "1f1b")
    w = pipeline_whatif(plan, {"inter_bandwidth": 2.0})
    assert w.before.predicted_step_time == pytest.approx(plan.predicted_step_time, rel=1e-9, abs=0)
    # by hand: the stages sit on different nodes, each device sends one hand-off per microbatch (activations
    # on from stage 0, gradients back from stage 1); GPipe / 1F1B: step = sum_d t_d + (m - 1) max_d t_d + ...,
    # so every t_d loses the same send time and the step loses (p + m - 1) of it
    built = again.built
    solution = Solution(built.full_choice(again.choice), math.nan, math.nan, math.nan, False, "test", 0.0)
    nbytes = boundary_bytes(built, solution)
    profile = plan_cluster(plan).profile
    bandwidth = profile.inter_node.bandwidth_per_device(profile.devices_per_node)
    saved = (plan.pipeline.degree + plan.microbatches - 1) * (nbytes / bandwidth - nbytes / (2 * bandwidth))
    assert nbytes > 0 and saved > 0
    gained = w.before.predicted_step_time - w.after.predicted_step_time
    assert gained == pytest.approx(saved, rel=1e-9)
    # nothing inside a stage moved: the in-node collectives and each stage's memory are as planned
    inside = [(c.tensor, c.seconds) for c in w.before.collectives if c.mesh_axis > 0]
    assert inside == [(c.tensor, c.seconds) for c in w.after.collectives if c.mesh_axis > 0]
    memory = [s.memory_bytes for s in w.after.pipeline.stages]  # type: ignore[union-attr]
    assert memory == [s.memory_bytes for s in w.before.pipeline.stages]  # type: ignore[union-attr]


def test_cli_whatif_set_and_its_refusals(pipelined_plans: tuple[Path, Path]) -> None:
    pp, flat = pipelined_plans
    done = run_main("whatif", str(pp), "--set", "inter_bandwidth=2", "--set", "memory=0.0005")
    assert done.code == 0, done.err
    assert "inter_bandwidth=2x" in done.out and "bubble share" in done.out and "no: " in done.out
    assert "the memory budget (0 of 2 stages fit)" in done.out
    for argv, words in (
        ((str(pp), "--set", "devices=16"), "cannot set devices for a pipelined plan"),
        ((str(pp), "--set", "batch=64"), "cannot set batch for a pipelined plan"),
        ((str(flat), "--set", "bandwidth=2"), "has no stages"),
        ((str(pp), "--against", str(flat), "--vary", "batch=1..64"), "--set inter_bandwidth=2"),
    ):
        done = run_main("whatif", *argv)
        assert done.code == 2 and "Traceback" not in done.err and words in done.err, done.err
        assert len(done.err.strip().splitlines()) == 1


def test_explain_prints_the_plans_decisions(replayed: tuple[Plan, Replay]) -> None:
    plan, again = replayed
    by_name = {n.name: n.strategy for n in plan.nodes}
    found = explain(plan, again.built, "*", top=10_000)
    assert len(found) == len(again.built.variables)
    for e in found:
        assert e.chosen.strategy == by_name[e.name]
        assert e.stages  # every decision is run by some stage
    last = len(plan.pipeline.stages) - 1  # type: ignore[union-attr]
    heads = explain(plan, again.built, "lm_head*", stage=last)
    assert heads and all(e.stages == (last,) for e in heads)


def test_cli_explain_of_a_stage(pipelined_plans: tuple[Path, Path]) -> None:
    pp, _ = pipelined_plans
    plan = load_plan(pp)
    done = run_main("explain", str(pp), "--stage", "1", "--node", "lm_head")
    assert done.code == 0, done.err
    assert "pipelined: PP 2" in done.out and "run by stage 1" in done.out
    head = next(n for n in plan.nodes if n.name == "p_lm_head_weight")
    assert f"chosen {head.strategy}" in done.out
    refused = run_main("explain", str(pp), "--stage", "0", "--node", "lm_head")
    assert refused.code == 2 and "in stage 0" in refused.err and len(refused.err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("model", "profile", "extra"),
    [
        ("gpt2-tiny", "cpu", ("--nodes", "2", "--schedule", "1f1b")),  # a tied embedding summed across stages
        ("mixtral-tiny", "a100x8", ()),  # routed experts (bf16)
    ],
)
def test_other_models_replay_to_their_step(
    tmp_path: Path, model: str, profile: str, extra: tuple[str, ...]
) -> None:
    path = tmp_path / "pp.json"
    argv = ("search", "--profile", profile, "--mesh", "2x4", "--model", model, "--pp", "2", *extra)
    done = run_main(*argv, "--out", str(path))
    assert done.code == 0, done.err
    plan = load_plan(path)
    again = replay(plan)  # refuses unless the step matches to 1e-9
    assert again.plan.predicted_step_time == pytest.approx(plan.predicted_step_time, rel=1e-9, abs=0)
    by_name = {n.name: n.strategy for n in plan.nodes}
    assert all(e.chosen.strategy == by_name[e.name] for e in explain(plan, again.built, "*", top=10_000))
    if model == "gpt2-tiny":
        assert any(c.mesh_axis == 0 and c.kind == "all_reduce" for c in plan.collectives)  # the tied sum
