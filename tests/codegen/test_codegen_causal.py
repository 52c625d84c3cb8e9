"""A Hugging Face mask proven causal runs as ``is_causal`` without the mask (its construction dropped) where the
plan leaves the query rows whole, and the emitted program still equals eager; an unproven mask, or split query
rows, keep the explicit mask."""

from __future__ import annotations

import functools

import pytest
import torch

import autoshard
from autoshard import zoo
from autoshard.capture import Captured, capture
from autoshard.codegen import assign_strategies, lower_graph, plan_cluster
from autoshard.placement import ShardingSpec
from autoshard.plans import Plan
from autoshard.problem.attention import runs_causal
from autoshard.runtime.verify import cluster_for

COLUMN, ROW = ((1, 1, 1), (2, 1)), ((1, 1, 2), (1, 2))
HEADS = {  # Megatron attention and MLP: q/k/v by heads, the output projection by rows
    **{f"*.{m}": COLUMN for m in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")},
    **{f"*.{m}": ROW for m in ("o_proj", "down_proj")},
}
MASK_OPS = ("aten.le.Tensor", "aten.cumsum", "aten.__and__", "aten.new_ones")  # HF's mask construction


@functools.cache
def _case(name: str) -> tuple[zoo.ModelCase, Captured]:
    case = zoo.build(name, layers=2)
    case.model.double()
    return case, capture(case.model, case.args, case.kwargs, blocks="full")


def _sdpa_lines(cap: Captured, plan: Plan, coord: tuple[int, ...]) -> tuple[list[str], str]:
    lowered = lower_graph(cap, assign_strategies(cap, plan), plan_cluster(plan), coord)
    code = lowered.graph.python_code("self").src
    return [line for line in code.splitlines() if "scaled_dot_product_attention.default(" in line], code


@pytest.mark.parametrize("name", ["llama-tiny", "gpt2-tiny"])
def test_a_proven_mask_runs_is_causal_and_the_emitted_program_equals_eager(name: str) -> None:
    case, cap = _case(name)
    plan = autoshard.plan(case.model, cluster_for("cpu", 1), case.args, case.kwargs)
    lines, code = _sdpa_lines(cap, plan, (0,))
    assert len(lines) == 2 and all("is_causal = True" in line for line in lines)
    assert not any(op in code for op in MASK_OPS)  # the mask is no longer built
    # one gloo rank against the eager model, float64: outputs and every parameter's gradient
    report = autoshard.verify(case.model, case.args, case.kwargs, plan=plan, allow_replicated=True)
    assert report.ok, str(report)
    assert report.grads and all(d.ok for d in report.grads)


@pytest.mark.slow
def test_a_head_split_runs_is_causal_on_two_gloo_ranks_and_its_collectives_run() -> None:
    case, cap = _case("llama-tiny")
    plan = autoshard.plan(case.model, cluster_for("cpu", 2), case.args, case.kwargs, annotations=HEADS)
    assert plan.degrees == {"tp": 2}
    for coord in ((0,), (1,)):
        lines, code = _sdpa_lines(cap, plan, coord)
        assert len(lines) == 2 and all("is_causal = True" in line for line in lines)
        assert "[2, 2, 16, 16]" in code  # each rank attends with its 2 of the 4 query heads
    report = autoshard.verify(case.model, case.args, case.kwargs, plan=plan)
    assert report.ok, str(report)
    # Megatron: one all-reduce forward and one backward per attention and per MLP, as planned and as run
    assert report.emitted == report.planned and report.emitted.get("forward all_reduce", 0) >= 4
    assert report.emitted.get("backward all_reduce", 0) >= 4


def test_a_padding_mask_from_the_inputs_keeps_the_explicit_mask() -> None:
    case = zoo.build("llama-tiny", layers=2)
    mask = {"attention_mask": torch.ones(2, 16, dtype=torch.long)}
    cap = capture(case.model, case.args, mask, blocks="full")
    plan = autoshard.plan(case.model, cluster_for("cpu", 1), case.args, mask)
    lines, _ = _sdpa_lines(cap, plan, (0,))
    assert len(lines) == 2 and not any("is_causal = True" in line for line in lines)
    assert all(line.count(",") >= 3 for line in lines)  # q, k, v and the mask


def test_split_query_rows_keep_the_mask_and_a_ring_or_whole_rows_run_causal() -> None:
    def spec(text: str) -> ShardingSpec:
        return ShardingSpec.parse(text)

    whole, rows, heads = spec("(R, R)"), spec("(S(2), R)"), spec("(S(1), R)")
    # q, k, v of rank 4 (B, H, S, E): heads split, rows of q only (the query-length split), all rows (a ring)
    assert runs_causal(True, heads, 4, [(heads, 4)] * 3)
    assert runs_causal(True, whole, 4, [(whole, 4)] * 3)
    assert not runs_causal(True, rows, 4, [(rows, 4), (whole, 4), (whole, 4)])
    assert runs_causal(True, rows, 4, [(rows, 4)] * 3)
    assert not runs_causal(False, heads, 4, [(heads, 4)] * 3)  # nothing proven: the mask as given
