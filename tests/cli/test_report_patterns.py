"""Pattern recognition and group descriptions on hand-written plans (no planning: milliseconds)."""

from __future__ import annotations

import pytest
import report_cases as cases

from autoshard.report.groups import PlanView, layer_pattern, op_name
from autoshard.report.labels import OpLabel, fmt_bytes, fmt_seconds, parse_label, shard_dim, spec_text
from autoshard.report.patterns import axis_role, describe_group, recognise
from autoshard.report.table import render


def names(plan) -> dict[str, tuple[int, ...]]:
    return {p.name: p.axes for p in recognise(PlanView.of(plan))}


@pytest.mark.parametrize(
    ("label", "parsed"),
    [
        ("R, S(0), S(0) -> S(2)", OpLabel((("R",), ("S(0)",), ("S(0)",)), (("S(2)",),))),
        ("(S(0), R), - -> (S(0), S(1))", OpLabel((("S(0)", "R"), None), (("S(0)", "S(1)"),))),
        ("-> (R, S(0))", OpLabel((), (("R", "S(0)"),))),
        ("(R, R) -> (R, R), (P, R)", OpLabel((("R", "R"),), (("R", "R"), ("P", "R")))),
        ("S(0) -> P(max)", OpLabel((("S(0)",),), (("P(max)",),))),
    ],
)
def test_strategy_labels_parse_per_operand_and_axis(label: str, parsed: OpLabel) -> None:
    assert parse_label(label) == parsed
    rebuilt = (
        ", ".join(spec_text(s) for s in parsed.inputs)
        + " -> "
        + ", ".join(spec_text(s) for s in parsed.outputs)
    )
    assert rebuilt.strip() == label.strip()


def test_units_and_small_helpers() -> None:
    assert (fmt_bytes(512), fmt_bytes(3 * 2**20), fmt_bytes(1.5 * 2**40)) == ("512 B", "3.0 MiB", "1.5 TiB")
    assert (fmt_seconds(2.5), fmt_seconds(0.0042), fmt_seconds(3e-6)) == ("2.500 s", "4.20 ms", "3.0 us")
    assert (shard_dim("S(2)"), shard_dim("R"), shard_dim("P")) == (2, None, None)
    assert op_name("aten.linear.default") == "linear" and op_name("_operator.getitem") == "getitem"
    assert layer_pattern("model.layers.7.mlp", "model.layers", 32) == "model.layers.0–31.mlp"
    assert layer_pattern("model.norm", "model.layers", 32) == "model.norm"


def test_megatron_column_then_row() -> None:
    plan = cases.megatron_mlp()
    view = PlanView.of(plan)
    roles = {r.node.name: axis_role(r, 0) for r in view.ops}
    assert roles == {"linear": "column", "gelu": "dim 2", "linear_1": "row"}
    [pattern] = recognise(view)
    assert str(pattern) == "Megatron column→row on axis 0: fc1 → fc2 (no collective between the pair)"
    assert describe_group(view, view.groups()[0]) == ["MLP column-split on axis 0"]


def test_an_all_gather_between_the_two_matmuls_is_not_megatron() -> None:
    assert "Megatron column→row" not in names(cases.megatron_mlp(gather_between=True))


def test_data_parallel_and_fsdp_on_a_2d_mesh() -> None:
    found = names(cases.data_parallel_and_fsdp())
    assert found == {"data parallel": (0,), "FSDP / ZeRO-3": (1,)}  # axis 1 stores the weight split
    view = PlanView.of(cases.data_parallel_and_fsdp())
    assert describe_group(view, view.groups()[0]) == ["batch on axes 0, 1", "weights FSDP-sharded on axis 1"]


def test_ulysses_sequence_parallel_attention_in_a_layer_stack() -> None:
    plan = cases.ulysses_attention_stack()
    view = PlanView.of(plan)
    [group] = view.groups()
    assert (group.name, group.count) == ("layers.0–3", 4)
    assert describe_group(view, group) == ["attention by heads (all-to-all) on axis 0", "sequence on axis 0"]
    found = {p.name: p for p in recognise(view)}
    assert found["head-parallel attention"].where == ("layers.0–3",)
    assert found["sequence parallel"].evidence.startswith("Ulysses-style")


def test_vocab_parallel_embedding_and_head() -> None:
    found = {p.name: p for p in recognise(PlanView.of(cases.vocab_parallel()))}
    assert found["vocab-parallel embedding and LM head"].where == ("embed", "lm_head")


def test_expert_parallel() -> None:
    found = {p.name: p for p in recognise(PlanView.of(cases.expert_parallel()))}
    assert (
        found["expert parallel"].evidence == "experts split, tokens sent by all-to-all: 2 per step (2.0 MiB)"
    )
    view = PlanView.of(cases.expert_parallel())
    experts = next(g for g in view.groups() if g.name == "moe.experts")
    assert describe_group(view, experts) == ["experts split by expert on axis 0"]


@pytest.mark.parametrize(
    "make",
    [cases.megatron_mlp, cases.data_parallel_and_fsdp, cases.ulysses_attention_stack, cases.expert_parallel],
)
def test_reports_fit_their_width(make) -> None:
    for width in (100, 80):
        assert all(len(line) <= width for line in render(make(), width=width).splitlines())
