"""The headline never says less than the body: one test per defect of the last new-user trial.

1. an axis splitting experts was named TP; 2. a replicated plan had no headline; 3. LLaMA-3-8B ``--batch 16``
was headed ``DP 16`` above a vocabulary-split LM head; 4. a replicated plan claimed sharded optimizer state
with no collective; 5. a DP or CP axis storing parameters split and gathering them (through a view: Mixtral's
routed experts) did not say so; 6. a plan storing pinned expert weights split and gathering them was headed
"replicated"; 7. a PP 2 plan hid its replicated axis, and its patterns said "every device runs the whole
model".  Hand-written plans (``tests/cli/report_cases.py``) for 1-3, a tiny planned MLP for 4.
``autoshard search`` and ``autoshard show`` print :func:`autoshard.pipeline.summary.headline` first (through
:func:`autoshard.report.table.render`), so asserting ``render``'s first line covers both.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import autoshard
from autoshard.errors import AutoshardError
from autoshard.pipeline.summary import degrees_of, headline
from autoshard.plans import Collective, NodePlan, PipelinePlan, PipelineStage, Plan
from autoshard.report.table import render

sys.path.insert(0, str(Path(__file__).parents[1] / "cli"))  # the hand-written plans of the report tests
import report_cases as cases

LINEAR, SDPA, GROUPED_MM = cases.LINEAR, cases.SDPA, cases.GROUPED_MM


def _moe_layer(heads_split: bool) -> Plan:
    """One MoE layer on 8 devices: the grouped expert matmul split by expert on axis 0, and the attention's
    projections and heads split on the same axis (``heads_split``) or replicated."""
    qkv = "S(1)" if heads_split else "R"
    ops = [
        ("linear", "attn.q", LINEAR, f"R, {'S(0)' if heads_split else 'R'} -> {'S(2)' if heads_split else 'R'}"),
        ("sdpa", "attn", SDPA, f"{qkv}, {qkv}, {qkv} -> {qkv}"),
        ("linear_1", "attn.o", LINEAR, f"{'S(2)' if heads_split else 'R'}, {'S(1)' if heads_split else 'R'} -> "
         f"{'P' if heads_split else 'R'}"),
        ("router", "moe.gate", LINEAR, "R, S(1) -> P"),
        ("_grouped_mm", "moe.experts", GROUPED_MM, "R, S(0), R -> P"),
    ]  # fmt: skip
    w = "S(0)" if heads_split else "R"
    params = {"attn.q.weight": (w,), "attn.o.weight": (w,), "moe.gate.weight": ("S(1)",)}
    plan = cases.make_plan((8,), params | {"moe.experts.w": ("S(0)",)}, ops)
    # Mixtral's shares: experts ~80 % of a layer's weighted compute, attention ~20 %, the router ~0.1 %
    return cases.timed(
        plan, {"linear": 0.05, "sdpa": 0.1, "linear_1": 0.05, "router": 0.001, "_grouped_mm": 0.8}
    )


def test_an_axis_splitting_experts_and_heads_is_named_tp_ep() -> None:
    plan = _moe_layer(heads_split=True)
    report = render(plan)
    assert report.splitlines()[0] == headline(plan) == "TP/EP 8, 1 microbatch"
    assert "axis 0 (8): TP/EP: experts split (80%; weights used split: 20% of the weighted compute)" in report
    assert degrees_of(plan) == {"ep": 8}  # Plan.degrees keeps one kind per axis: the larger share
    # experts below the attention's share (a small MoE): still both, never "TP" alone
    small = cases.timed(plan, {"linear": 0.3, "sdpa": 0.3, "linear_1": 0.3, "_grouped_mm": 0.1})
    assert headline(small) == "TP/EP 8, 1 microbatch"
    # a router split beside the experts (0.1 % of the compute) does not make the axis TP/EP
    assert headline(_moe_layer(heads_split=False)) == "EP 8, 1 microbatch"


def _replicated_mlp() -> Plan:
    ops = [("linear", "fc1", LINEAR, "R, R -> R"), ("linear_1", "fc2", LINEAR, "R, R -> R")]
    return cases.make_plan((8,), {"fc1.weight": ("R",), "fc2.weight": ("R",)}, ops)


def test_a_replicated_plan_opens_with_a_headline() -> None:
    plan = _replicated_mlp()
    first = "replicated on 8 devices: no collective, 1 microbatch"
    assert render(plan).splitlines()[0] == headline(plan) == first
    assert plan.summary().splitlines()[0].startswith(first)
    gathers = tuple(
        Collective("all_gather", 2**20, "optimizer", 0, p, p, f, 1e-5)
        for p, f in (
            (cases.param_node("fc1.weight"), "fc1.weight"),
            (cases.param_node("fc2.weight"), "fc2.weight"),
        )
    )
    zero = dataclasses.replace(plan, optimizer_gathers=gathers)
    assert (
        headline(zero)
        == "replicated on 8 devices: no collective but ZeRO-1's 2 optimizer all-gathers, 1 microbatch"
    )


def _dp_with_vocab_head(head_seconds: float) -> Plan:
    """LLaMA-3-8B --batch 16 on 2 x 8 in miniature: a 4-layer stack batch-split on both axes, weights
    replicated; the LM head used split over its output features (the vocabulary) on axis 0, by sequence on
    axis 1 (the plan the trial saw)."""
    act = "(S(0), S(0))"
    ops = [
        ("linear", "layers.0.mlp.up", LINEAR, f"{act}, (R, R) -> {act}"),
        ("linear_1", "layers.0.mlp.down", LINEAR, f"{act}, (R, R) -> {act}"),
        ("linear_2", "lm_head", LINEAR, "(R, S(1)), (S(0), R) -> (S(2), S(1))"),
    ]
    params = {"layers.0.mlp.up.weight": ("R", "R"), "layers.0.mlp.down.weight": ("R", "R")}
    plan = cases.make_plan((2, 8), params | {"lm_head.weight": ("S(0)", "R")}, ops, layers=4,
                           inputs={"x": ("S(0)", "S(0)")})  # fmt: skip
    return cases.timed(plan, {"linear": 0.4, "linear_1": 0.4, "linear_2": head_seconds})


def test_a_dp_headline_names_a_vocab_split_lm_head() -> None:
    plan = _dp_with_vocab_head(0.06)  # LLaMA-3-8B's head: ~7 % of the weighted compute
    report = render(plan)
    assert report.splitlines()[0] == "DP 16 (lm_head vocab-split on axis 0), 1 microbatch"
    assert "output layer column-split on axis 0" in report  # the body says the same
    assert degrees_of(plan) == {"dp": 16}
    # a module below 1 % of the weighted compute is left to the body
    assert headline(_dp_with_vocab_head(0.005)) == "DP 16, 1 microbatch"


class _Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(64, 256, bias=False), nn.Linear(256, 64, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


@pytest.fixture(scope="module")
def replicated_plan() -> Plan:
    """The MLP with its input and weights pinned replicated on one a100x8 node: every device computes
    everything.  (Its weights are pinned since ZeRO-1's gathers are priced: with the input alone pinned,
    Megatron's column/row split -- one 2 KiB all-reduce -- now beats gathering two 64 KiB weights.)"""
    x = torch.randn(8, 64)
    pins = {"x": ("R",), "fc1.weight": ("R",), "fc2.weight": ("R",)}
    return autoshard.plan(_Mlp(), autoshard.load_cluster("a100x8"), (x,), annotations=pins)


def test_a_replicated_plan_names_the_sharded_optimizer_state_all_gathers(
    replicated_plan: Plan, tmp_path: Path
) -> None:
    plan = replicated_plan
    assert set(plan.param_placements.values()) == {("R",)} and not plan.collectives
    # ZeRO-1 splits each parameter's Adam state over the 8 devices; the gradient is never reduced, so the
    # updated chunks' all-gather is the only collective: one per parameter, the whole fp32 weight gathered
    gathered = {c.module: c.nbytes for c in plan.optimizer_gathers}
    assert gathered == {"fc1.weight": 64 * 256 * 4, "fc2.weight": 256 * 64 * 4}
    assert all(
        c.phase == "optimizer" and c.kind == "all_gather" and c.seconds > 0 for c in plan.optimizer_gathers
    )
    # priced: the step is compute plus the gathers (nothing else communicates), and equals the objective
    gathers = sum(c.seconds for c in plan.optimizer_gathers)
    assert plan.predicted_step_time == pytest.approx(plan.compute_time + gathers, rel=1e-12)
    assert plan.communication_time == pytest.approx(
        gathers, rel=1e-12
    )  # every collective priced, gathers too
    assert plan.solver.objective == pytest.approx(plan.predicted_step_time, rel=1e-6)
    report = " ".join(render(plan).split())
    assert report.startswith("replicated on 8 devices: no collective but ZeRO-1's 2 optimizer all-gathers")
    assert (
        "optimizer: Adam state sharded over 8 devices (ZeRO-1): 2 all-gathers of updated weights on axis 0"
        in report
    )
    assert "no device ever waits" not in report
    path = tmp_path / "plan.json"
    plan.save(path)
    assert autoshard.load_plan(path).optimizer_gathers == plan.optimizer_gathers
    data = json.loads(path.read_text())
    data["optimizer_gathers"][0]["phase"] = "backward"
    path.write_text(json.dumps(data))
    with pytest.raises(AutoshardError, match="optimizer_gathers"):
        autoshard.load_plan(path)


def test_a_data_parallel_plan_has_no_optimizer_gathers() -> None:
    """Batch split: every gradient is all-reduced, which is the reduce-scatter + all-gather ZeRO-1 needs."""
    x = torch.randn(4096, 64)  # enough rows that splitting them beats gathering them
    plan = autoshard.plan(_Mlp(), autoshard.load_cluster("a100x8"), (x,), annotations={"x": ("S(0)",)})
    assert set(plan.param_placements.values()) == {("R",)} and plan.optimizer_gathers == ()
    assert any(c.phase == "backward" and c.kind == "all_reduce" for c in plan.collectives)
    report = " ".join(re.sub(r"-\n\s*", "-", render(plan)).split())  # lines wrapped at hyphens joined
    assert re.search(
        r"optimizer: Adam state sharded over 8 devices \(ZeRO-1\): \d+ gradient all-reduces of replicated "
        r"weights \(the bwd rows marked ZeRO-1\) each run as a reduce-scatter",
        report,
    )


def _gathered_through_view(plan: Plan, fqn: str, axis: int) -> Plan:
    """``plan`` with ``fqn`` all-gathered on ``axis`` in the forward as its transpose, as Mixtral's routed
    expert weights are (``transpose_4`` of ``p_model_layers_0_mlp_experts_gate_up_proj``)."""
    view = NodePlan("t", "outside:99", "aten.transpose.int", fqn, "S(0) -> S(1)", 1, 0.0, 0.0,
                    (cases.param_node(fqn),))  # fmt: skip
    gather = cases.collective("all_gather", "forward", "t", "linear", fqn.rsplit(".", 1)[0], axis=axis)
    return dataclasses.replace(plan, nodes=(*plan.nodes, view), collectives=(*plan.collectives, gather))


def test_a_dp_axis_gathering_a_weight_through_a_view_says_zero3() -> None:
    ops = [(f"linear{'_' * i}{i or ''}", f"fc{i}", LINEAR, "S(0), R -> S(0)") for i in range(3)]
    params = {"fc0.weight": ("S(0)",), "fc1.weight": ("R",), "fc2.weight": ("R",)}
    plan = _gathered_through_view(cases.make_plan((2,), params, ops), "fc0.weight", 0)
    report = render(plan)
    body = " ".join(report.split())  # the body's lines are wrapped
    assert report.splitlines()[0] == "DP 2 (ZeRO-3/FSDP on 1 of 3 parameters), 1 microbatch"
    assert "1 of 3 parameters stored split, gathered before use" in body  # the axis line agrees
    assert "FSDP / ZeRO-3 on axis 0 (1 parameter stored split" in body  # and so do the patterns


def test_a_cp_axis_storing_weights_split_says_zero3() -> None:
    seq = "S(1), R -> S(1)"
    ops = [("linear", "attn.q", LINEAR, seq), ("sdpa", "attn", SDPA, "S(2), S(2), S(2) -> S(2)"),
           ("linear_1", "attn.o", LINEAR, seq)]  # fmt: skip
    params = {"attn.q.weight": ("S(0)",), "attn.o.weight": ("S(0)",)}
    gathers = [cases.collective("all_gather", "forward", cases.param_node(f"attn.{m}.weight"), n, f"attn.{m}")
               for m, n in (("q", "linear"), ("o", "linear_1"))]  # fmt: skip
    plan = dataclasses.replace(cases.make_plan((2,), params, ops, gathers), context_axis=0)
    assert headline(plan) == "CP 2 (contiguous; ZeRO-3/FSDP on 2 of 2 parameters), 1 microbatch"


def test_stored_expert_weights_gathered_are_not_replicated() -> None:
    """mixtral-tiny with its experts pinned (R, S(0)): nothing computed split, the experts stored split on
    axis 1 and all-gathered before use."""
    rep = "(R, R), (R, R) -> (R, R)"
    ops = [("linear", "experts", LINEAR, rep), ("linear_1", "head", LINEAR, rep)]
    params = {"experts.weight": ("R", "S(0)"), "head.weight": ("R", "R")}
    plan = _gathered_through_view(cases.make_plan((4, 2), params, ops), "experts.weight", 1)
    report = render(plan)
    body = " ".join(report.split())  # the body's lines are wrapped
    first = (
        "ZeRO-3 2 (axis 1: 1 of 2 parameters stored split and gathered, compute not split)"
        " × replicated 4 (axis 0 splits nothing), 1 microbatch"
    )
    assert headline(plan) == first and "replicated on" not in first
    assert "axis 1 (2): compute not split: every device of this axis computes the same; 1 of 2" in body
    assert "axis 1 (2): nothing split" not in body
    assert degrees_of(plan) == {}  # Plan.degrees: no kind of parallelism on either axis


def test_a_pipeline_headline_names_its_replicated_axis_and_pattern() -> None:
    """llama-tiny --mesh 2x2 --pp 2: two stages on axis 0, every op replicated on axis 1."""
    rep = "(R, R), (R, R) -> (R, R)"
    ops = [("linear", "layers.0.mlp", LINEAR, rep), ("linear_1", "lm_head", LINEAR, rep)]
    params = {"layers.0.mlp.weight": ("R", "R"), "lm_head.weight": ("R", "R")}
    stages = (PipelineStage(0, ("layers.0",), (0, 1), (0, 1)), PipelineStage(1, ("lm_head",), None, (2, 3)))
    plan = dataclasses.replace(
        cases.make_plan((2, 2), params, ops),
        pipeline=PipelinePlan(stages, "gpipe"),
        microbatches=4,
        input_shapes={"x": ((8, 16), "torch.int64")},
    )
    report = render(plan)
    body = " ".join(report.split())  # the body's lines are wrapped
    assert (
        report.splitlines()[0] == "PP 2 (GPipe) × replicated 2 (axis 1 splits nothing), 4 microbatches of 2"
    )
    assert "pipeline on axis 0 (2 stages, GPipe schedule, 4 microbatches)" in body
    assert "every device runs the whole model" not in body
