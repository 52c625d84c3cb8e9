"""The report's headline degrees come from what each mesh axis splits, the facts its body prints."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from pathlib import Path

import pytest
import report_cases as cases
import torch

import autoshard
from autoshard import zoo
from autoshard.pipeline.summary import degrees_of, headline
from autoshard.plans import Plan, RingTransfer
from autoshard.report.table import render
from autoshard.runtime.verify import cluster_for

LINEAR, SDPA, EMBEDDING = cases.LINEAR, cases.SDPA, cases.EMBEDDING
SEQ = "(S(0), S(1))"  # (B, S, H) activations: batch on axis 0, sequence on axis 1


def context_parallel_with_a_gathered_embedding() -> Plan:
    """Mesh (4, 8): batch on axis 0; attention and every linear split by sequence on axis 1 (ring attention),
    the embedding table stored split on axis 1 and all-gathered before use.  The headline used to read
    ``FSDP 8 × DP 4`` (one gathered parameter made axis 1 "FSDP") above a body showing context parallelism."""
    qkv = "(S(0), S(2))"  # (B, H, S, D): sequence is dim 2
    ops = [
        ("embedding", "embed", EMBEDDING, f"(R, R), {SEQ} -> {SEQ}"),
        ("linear", "attn.q", LINEAR, f"{SEQ}, (R, R) -> {SEQ}"),
        ("sdpa", "attn", SDPA, f"{qkv}, {qkv}, {qkv} -> {qkv}"),
        ("linear_1", "attn.out", LINEAR, f"{SEQ}, (R, R) -> {SEQ}"),
    ]
    params = {"embed.weight": ("R", "S(1)"), "attn.q.weight": ("R", "R"), "attn.out.weight": ("R", "R")}
    w = cases.param_node("embed.weight")
    comms = [cases.collective("all_gather", "forward", w, "embedding", "embed", axis=1)]
    return cases.make_plan((4, 8), params, ops, comms, inputs={"ids": ("S(0)", "S(1)")})


def _axes_section(report: str) -> list[str]:
    """The kinds the "mesh axes" section names, one per axis: ``["DP", "CP"]``."""
    block = report.split("mesh axes")[1].split("\n\n")[0]
    return re.findall(r"^  axis \d+ \(\d+\): ([A-Z]+):", block, flags=re.M)


def _headline_kinds(line: str) -> list[str]:
    return re.findall(r"([A-Z]+) \d+", line.split(",")[0])


def test_context_parallel_axis_is_cp_not_fsdp() -> None:
    plan = context_parallel_with_a_gathered_embedding()
    report = render(plan)
    # the embedding stored split and gathered on the CP axis is said, as on a DP axis (ZeRO-3)
    assert report.splitlines()[0] == "CP 8 (ZeRO-3/FSDP on 1 of 3 parameters) × DP 4, 1 microbatch"
    assert "attention by sequence (context parallel) on axis 1" in report  # the body says the same
    assert "axis 1 (8): CP: activations split by sequence, attention too (ring)" in report
    assert degrees_of(plan) == {"cp": 8, "dp": 4}


def test_an_axis_that_runs_the_ring_is_cp_whatever_else_it_splits() -> None:
    """GPT-2 on 2 x 2 x 2 with ``--forbid dp`` was headed ``TP 8`` while axis 1 ran zigzag ring attention (36
    K/V hops per device): weights split on axis 1 took most of the compute, so the axis read as TP."""
    qkv = "(S(1), S(2))"  # (B, H, S, D): heads on axis 0, sequence on axis 1 (the ring)
    ops = [
        ("linear", "attn.q", LINEAR, "(R, R), (S(0), S(0)) -> (S(2), S(2))"),
        ("sdpa", "attn", SDPA, f"{qkv}, {qkv}, {qkv} -> {qkv}"),
        ("linear_1", "mlp.fc", LINEAR, "(R, R), (S(0), S(0)) -> (S(2), S(2))"),
    ]
    params = {"attn.q.weight": ("S(0)", "S(0)"), "mlp.fc.weight": ("S(0)", "S(0)")}
    plan = cases.make_plan((2, 2), params, ops)
    assert headline(plan) == "TP 4, 1 microbatch"  # no ring: both axes split weights
    hops = (RingTransfer("forward", 1, 3, 2**20, "sdpa", "attn", 1e-4),)
    ring = dataclasses.replace(plan, context_axis=1, context_layout="zigzag", ring_transfers=hops)
    report = render(ring)
    assert report.splitlines()[0] == "TP 2 × CP 2 (zigzag), 1 microbatch"
    assert degrees_of(ring) == {"tp": 2, "cp": 2}
    assert "axis 1 (2): CP: attention split by sequence (ring K/V), weights used split" in report
    assert _headline_kinds(report.splitlines()[0]) == _axes_section(report) == ["TP", "CP"]


@pytest.mark.parametrize(
    "make",
    [
        cases.megatron_mlp,
        cases.data_parallel_and_fsdp,
        cases.ulysses_attention_stack,
        cases.vocab_parallel,
        cases.expert_parallel,
        context_parallel_with_a_gathered_embedding,
    ],
)
def test_headline_and_body_name_the_same_kinds(make) -> None:
    plan = make()
    report = render(plan)
    axes = _axes_section(report)
    assert sorted(_headline_kinds(headline(plan))) == sorted(dict.fromkeys(axes))
    assert len(axes) == sum(1 for n in plan.mesh_shape if n > 1)


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (cases.megatron_mlp, {"tp": 8}),
        (cases.data_parallel_and_fsdp, {"dp": 2, "fsdp": 8}),
        (cases.ulysses_attention_stack, {"sp": 8}),
        (cases.vocab_parallel, {"tp": 8}),
        (cases.expert_parallel, {"ep": 8}),
    ],
)
def test_canonical_plans_keep_their_degrees(make, expected) -> None:
    assert degrees_of(make()) == expected


def _example_layout(kind: str, mesh: tuple[int, ...]) -> dict:
    path = Path(__file__).parents[2] / "examples" / "train.py"
    spec = importlib.util.spec_from_file_location("example_train", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module._layout(kind, mesh)


@pytest.mark.slow
def test_train_example_tp_dp_layout_is_headed_tp_by_dp() -> None:
    """``examples/train.py plan --mesh 2x2 --layout tp-dp`` was headed ``FSDP 2 × DP 2``."""
    case = zoo.build("llama-tiny", batch=4, seq=32, device="meta")
    ids = torch.zeros(4, 32, dtype=torch.long, device="meta")
    plan = autoshard.plan(
        case.model,
        cluster_for("cpu", 4, (2, 2)),
        (ids,),
        {"labels": ids},
        annotations=_example_layout("tp-dp", (2, 2)),
    )
    report = render(plan)
    assert report.splitlines()[0] == "TP 2 × DP 2, 1 microbatch"
    assert _axes_section(report) == ["DP", "TP"]
    # the body: Megatron pairs on axis 1.  Before FSDP's backward re-gather was priced (issue 14) the optimum
    # row-split the MLP and gathered 10 weights on axis 1 instead; with the re-gather those gathers cost twice
    # and the plain column->row pairs win (14.5 ms of exposed communication against 16.4 ms)
    assert "Megatron column→row on axis 1" in report and "FSDP" not in report


def test_dp_headline_says_when_some_weights_are_fsdp_sharded() -> None:
    """GPT-2 on 8: the batch split, 146 of 148 weights replicated, the tied embedding table stored split and
    all-gathered.  The headline read ``DP 8`` above a body listing FSDP / ZeRO-3 on axis 0."""
    ops = [
        ("embedding", "wte", EMBEDDING, "R, S(0) -> S(0)"),
        ("linear", "fc", LINEAR, "S(0), R -> S(0)"),
        ("linear_1", "lm_head", LINEAR, "S(0), R -> S(0)"),
    ]
    params = {"wte.weight": ("S(1)",), "fc.weight": ("R",), "fc.bias": ("R",)}
    w = cases.param_node("wte.weight")
    comms = [cases.collective("all_gather", "forward", w, "linear_1", "lm_head")]
    plan = cases.make_plan((8,), params, ops, comms, inputs={"ids": ("S(0)",)})
    assert headline(plan) == "DP 8 (ZeRO-3/FSDP on 1 of 3 parameters), 1 microbatch"
    assert _headline_kinds(headline(plan)) == ["DP"]  # the axis is still data parallel: most weights whole
    plain = cases.make_plan((8,), params | {"wte.weight": ("R",)}, ops, [], inputs={"ids": ("S(0)",)})
    assert headline(plain) == "DP 8, 1 microbatch"


def _stack_with_fsdp(per_layer: bool) -> Plan:
    """LLaMA-3-8B on 2 x 8 in miniature: a 4-layer stack, ``w`` and ``v`` stored split on both axes, only ``w``
    all-gathered before use (on axis 0 once for the captured block, on axis 1 once per layer when
    ``per_layer``), and a head stored split on axis 1 and used split there (not gathered)."""
    ops = [
        ("linear", "layers.0.w", LINEAR, "(S(0), S(0)), (R, R) -> (S(0), S(0))"),
        ("linear_1", "layers.0.v", LINEAR, "(S(0), S(0)), (R, R) -> (S(0), S(0))"),
        ("linear_2", "head", LINEAR, "(S(0), R), (R, S(0)) -> (S(0), S(1))"),
    ]
    params = {"layers.0.w.weight": ("S(0)", "S(0)"), "layers.0.v.weight": ("S(0)", "S(0)")}
    params |= {"head.weight": ("R", "S(0)")}
    w = cases.param_node("layers.0.w.weight")
    comms = [cases.collective("all_gather", "forward", w, "linear", "layers.0.w", axis=0)]
    layers = range(4) if per_layer else [None]
    comms += [
        cases.collective("all_gather", "forward", w, "linear", "layers.0.w", 1, layer=i) for i in layers
    ]
    return cases.make_plan((2, 8), params, ops, comms, layers=4, inputs={"x": ("S(0)", "S(0)")})


@pytest.mark.parametrize("per_layer", [False, True])
def test_fsdp_counts_agree_in_headline_axis_lines_and_patterns(per_layer: bool) -> None:
    """One definition: a parameter stored split on an axis and all-gathered before use there is FSDP on that
    axis, counted by its own name.  LLaMA-3-8B on 2 x 8 was headed "ZeRO-3/FSDP on 32 of 291 parameters" over
    an FSDP axis line "226 of 291 stored split, 7 gathered before use" (per-layer templates) and a patterns
    line of 224; ``--forbid tp`` said "3 gathered" on the axis line, 96 in the patterns (new-user trial)."""
    report = render(_stack_with_fsdp(per_layer))
    # the head is used split over its output features (the vocabulary) on axis 1: the headline names it
    # (new-user trial: LLaMA-3-8B --batch 16 was headed "DP 16" above a vocabulary-split LM head)
    first = "DP 16 (ZeRO-3/FSDP on 4 of 9 parameters; head vocab-split on axis 1), 1 microbatch"
    assert report.splitlines()[0] == first
    axes = " ".join(report.split("mesh axes")[1].split("\n\n")[0].split())
    assert "axis 0 (2): DP: activations split by batch (100% of the weighted compute); 8 of 9" in axes
    assert axes.count("parameters stored split, 4 gathered before use") == 2  # both axes: w's 4 layers
    patterns = " ".join(report.split("patterns recognised")[1].split("\n\n")[0].split())
    fsdp = render(cases.data_parallel_and_fsdp())  # an FSDP axis: the headline counts it the same way
    assert fsdp.splitlines()[0] == "FSDP 8 (1 of 1 parameters) × DP 2, 1 microbatch"
    assert "1 of 1 parameters stored split, gathered before use" in " ".join(fsdp.split())
    counts = re.findall(r"FSDP / ZeRO-3 on ax[ie]s ([\d, ]+) \((\d+) parameters stored split", patterns)
    assert {n for _, n in counts} == {"4"} and "1" in "".join(a for a, _ in counts)  # axis 1 said 4 too


@pytest.mark.parametrize(
    ("tokens", "stored", "says"),
    [
        ("R", "R", "axis 0: same tokens, experts computed 2×"),  # every node computes the same experts
        ("S(0)", "R", "axis 0: tokens split, experts replicated"),
        ("S(0)", "S(1)", "axis 0: tokens split, experts gathered"),  # ZeRO-3/FSDP on the experts
    ],
)
def test_ep_headline_says_what_every_axis_does_to_the_experts(tokens: str, stored: str, says: str) -> None:
    """Mixtral on 2 nodes was headed ``EP 8 × DP 2`` while the tokens were gathered across nodes before the
    experts, so both nodes computed every expert on the same tokens (new-user trial)."""
    x = f"({tokens}, S(0))"
    ops = [
        ("router", "moe.gate", LINEAR, "(S(0), S(0)), (R, R) -> (S(0), S(0))"),
        ("_grouped_mm", "moe.experts", cases.GROUPED_MM, f"{x}, (R, S(0)), (R, R) -> {x}"),
    ]
    params = {"moe.gate.weight": ("R", "R"), "moe.experts.w": (stored, "S(0)")}
    plan = cases.make_plan((2, 8), params, ops, inputs={"x": ("S(0)", "S(0)")})
    assert headline(plan) == f"EP 8 (experts split on axis 1; {says}) × DP 2, 1 microbatch"
    assert render(plan).splitlines()[0] == headline(plan)
    assert headline(cases.expert_parallel()) == "EP 8, 1 microbatch"  # one axis: the degree says it all


def test_fsdp_headline_says_how_many_parameters_take_its_full_degree() -> None:
    """LLaMA-3-8B on 2 x 8 (README's Python example) was headed "FSDP 16 (224 of 291 parameters)" while axis 0
    split only 160 of them: k_proj and v_proj were (R, S(0)), 8-way.  The count beside the degree now says how
    many parameters the whole degree splits."""
    ops = [
        ("linear", "q", LINEAR, "(S(0), S(0)), (R, R) -> (S(0), S(0))"),
        ("linear_1", "k", LINEAR, "(S(0), S(0)), (R, R) -> (S(0), S(0))"),
    ]
    params = {"q.weight": ("S(0)", "S(1)"), "k.weight": ("R", "S(0)")}
    q, k = cases.param_node("q.weight"), cases.param_node("k.weight")
    comms = [
        cases.collective("all_gather", "forward", q, "linear", "q", axis=0),
        cases.collective("all_gather", "forward", q, "linear", "q", axis=1),
        cases.collective("all_gather", "forward", k, "linear_1", "k", axis=1),
    ]
    plan = cases.make_plan((2, 8), params, ops, comms, inputs={"x": ("S(0)", "S(0)")})
    assert headline(plan) == "FSDP 16 (2 of 2 parameters split, 1 of them 16-way), 1 microbatch"
    both = cases.make_plan(
        (2, 8),
        params | {"k.weight": ("S(0)", "S(1)")},
        ops,
        [*comms[:2], cases.collective("all_gather", "forward", k, "linear_1", "k", axis=0), comms[2]],
        inputs={"x": ("S(0)", "S(0)")},
    )
    assert headline(both) == "FSDP 16 (2 of 2 parameters), 1 microbatch"
