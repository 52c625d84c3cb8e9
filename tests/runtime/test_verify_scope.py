"""What ``verify`` says it checked: the plan's headline, axes that ran mostly replicated, and what the deployed
plan does that one forward and backward on gloo did not run (``runtime/verify_scope.py``)."""

from __future__ import annotations

import dataclasses
import re

import pytest
from runtime_cases import LLAMA_FSDP, model, plan

import autoshard
from autoshard.runtime.mapping import map_plan
from autoshard.runtime.verdict import VerifyReport
from autoshard.runtime.verify import cluster_for, verify
from autoshard.runtime.verify_scope import also_ran, not_run, replicated_warnings

DP = (("x", "S(0)"),)


def test_an_axis_that_splits_nothing_is_warned_with_its_share() -> None:
    """``verify --model llama-tiny --mesh 2x2`` printed OK over "TP 2 x replicated 2" without a word."""
    dp = plan("mlp", 2, None, DP)
    assert replicated_warnings(dp) == ()
    nodes = tuple(
        dataclasses.replace(n, strategy=re.sub(r"S\(\d\)|P\(\w+\)", "R", n.strategy)) for n in dp.nodes
    )
    (line,) = replicated_warnings(dataclasses.replace(dp, nodes=nodes))  # every device computes the same
    assert line.startswith("WARNING axis 0 (2 wide) splits 0% of the compute: 100% runs replicated")
    counts = {"backward all_reduce": 1}
    report = VerifyReport("m", (2, 2), "float32", (), (), True, counts, counts, 1.0, warnings=(line, line))
    assert str(report).count("verify --plan PLAN.json") == 1  # --model: the advice once, after the warnings


def test_what_one_forward_and_backward_does_not_run_is_listed() -> None:
    """The a8b plans' microbatches, bfloat16 and ZeRO-1 gathers verified without a mention."""
    dp = plan("mlp", 2, None, DP)
    assert not_run(dp, dp, "float64") == ()
    gather = dataclasses.replace(dp.collectives[0], kind="all_gather", phase="optimizer")
    deployed = dataclasses.replace(dp, microbatches=4, optimizer_gathers=(gather,))
    lines = not_run(deployed, dp, "float32", "bfloat16")
    assert lines == (
        "ZeRO-1 optimizer all-gathers: 1; the check runs forward and backward, no optimizer step",
        "4 microbatches per step: the check ran the whole batch as one and accumulated no gradients",
        "bfloat16 weights (the plan's bf16 recipe): the copy ran in float32",
    )
    amp = not_run(dataclasses.replace(dp, precision="amp"), dp, "float32")
    assert amp == ("the amp recipe (bfloat16 autocast and gathers): the model ran in float32",)


@pytest.mark.slow  # two plans, a capture and 2 forked ranks: ~15 s wall at load 8 (2 cores)
def test_recomputation_and_regathers_of_a_mapped_fsdp_plan_run_and_are_counted() -> None:
    """``verify --plan`` of an FSDP plan with recomputation printed its forward all-gathers only: the copy
    kept its activations and its gathered weights.  Now the mapped plan recomputes and reshards after forward,
    and the ranks' re-issued gathers and backward re-gathers are counted against the plan's."""
    m = model("llama")
    cluster = cluster_for("cpu", 2)
    deployed = autoshard.plan(m.model, cluster, m.args, annotations=dict(LLAMA_FSDP), recompute="full")
    assert deployed.recompute == "full"
    mapped = map_plan(deployed, m.model, m.args, {}, cluster)
    assert mapped.plan.recompute == "full"
    regathers = sum(c.phase == "regather" for c in mapped.plan.collectives)
    again = sum(c.recompute for c in mapped.plan.collectives if c.phase == "forward")
    assert regathers and again
    report = verify(m.model, m.args, plan=mapped.plan, cluster=cluster, captured=mapped.captured, name="fsdp")
    assert report.ok, str(report)
    assert report.emitted == report.planned and report.emitted["regather all_gather"] == regathers
    assert report.not_run == () and also_ran(mapped.plan) == report.also_ran
    assert f"{again} forward collectives re-issued in backward" in str(report)
    assert f"{regathers} backward re-gathers" in str(report)


def test_the_small_copy_advice_is_deep_enough_for_interleaved_chunks() -> None:
    """2 stages x 2 chunks of interleaved_zb need 4 layers, llama-tiny has 2: the advice says --layers 4."""
    from types import SimpleNamespace

    from autoshard.runtime.verify_pipeline import small_copy

    pipe = SimpleNamespace(degree=2, stages=(None,) * 4, schedule="interleaved_zb")
    advice = small_copy(SimpleNamespace(pipeline=pipe))  # type: ignore[arg-type]
    assert "--model llama-tiny --layers 4 --mesh 2x2 --pp 2 --schedule interleaved_zb" in advice
    plain = SimpleNamespace(degree=2, stages=(None,) * 2, schedule="gpipe")
    assert "--layers 2 --mesh 2x2 --pp 2 --schedule gpipe" in small_copy(SimpleNamespace(pipeline=plain))  # type: ignore[arg-type]
