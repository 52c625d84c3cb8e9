"""The DOT writer on hand-written plans: boxes, clusters, parameter colours, collective edges, exact edges."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import report_cases as cases
from cli_support import parse_dot

from autoshard.report.dot import REPLICATED_COLOUR, GraphvizError, plan_graph, to_dot, write


def test_module_boxes_carry_strategies_and_parameters_their_placement_colour() -> None:
    g = plan_graph(cases.megatron_mlp())
    boxes = {d["label"].split("\n")[0]: d for _, d in g.nodes(data=True) if d.get("shape") == "box"}
    assert set(boxes) == {"fc1", "act", "fc2"}
    assert "linear: R, S(0) -> S(2)" in boxes["fc1"]["label"]
    notes = {
        d["label"].split("\n")[0]: d["fillcolor"] for _, d in g.nodes(data=True) if d.get("shape") == "note"
    }
    assert notes["fc1.weight"] != notes["fc2.weight"]  # S(0) and S(1) get different colours
    assert notes["parameters S(0)"] == notes["fc1.weight"]  # the legend explains them


def test_replicated_parameters_are_grey_and_collectives_inside_a_box_are_named() -> None:
    g = plan_graph(cases.ulysses_attention_stack())
    colours = {d["fillcolor"] for _, d in g.nodes(data=True) if d.get("shape") == "note"}
    assert colours == {REPLICATED_COLOUR}
    # transpose and SDPA are one box (module layers.0.attn): the all-to-all between them is inside it
    [attn] = [d for _, d in g.nodes(data=True) if d.get("label", "").startswith("attn\n")]
    assert "inside: fwd all_to_all axis 0 ×4, 400.0 us" in attn["label"] and attn["color"] == "red"


def test_dot_text_parses_with_a_cluster_per_stack() -> None:
    graph = parse_dot(to_dot(cases.ulysses_attention_stack()))
    labels = {str(s.get("label")).strip('"') for s in graph.get_subgraphs()}
    assert labels == {"layers.0–3 (×4)", "legend"}
    assert "program order" in str(graph.get("label"))  # edges are inferred: say so


def test_recorded_operands_give_exact_edges() -> None:
    plan = cases.megatron_mlp()
    operands = {"linear": ("x", "p_fc1_weight"), "gelu": ("linear",), "linear_1": ("gelu", "p_fc2_weight")}
    nodes = tuple(dataclasses.replace(n, inputs=operands.get(n.name, ())) for n in plan.nodes)
    g = plan_graph(dataclasses.replace(plan, nodes=nodes))
    assert "program order" not in g.graph["graph"]["label"]
    solid = {(u, v) for u, v, d in g.edges(data=True) if d.get("style") == "solid" and u.startswith("u")}
    assert solid == {("u0", "u1"), ("u1", "u2"), ("u2", "output")}


def test_real_plans_record_operands() -> None:
    import torch

    import autoshard
    from autoshard import zoo

    case = zoo.build("mlp", device="meta")
    plan = autoshard.plan(case.model, autoshard.load_cluster("a100x8"), case.args, case.kwargs)
    by_name = {n.name: n for n in plan.nodes}
    assert by_name["linear_1"].inputs[0] == "gelu"
    assert "program order" not in plan_graph(plan).graph["graph"]["label"]
    del torch


def test_write_dot_and_refuse_images_without_graphviz(tmp_path: Path, monkeypatch) -> None:
    target = write(cases.megatron_mlp(), tmp_path / "plan.dot")
    parse_dot(target.read_text())
    monkeypatch.setattr("autoshard.report.dot.shutil.which", lambda name: None)
    with pytest.raises(GraphvizError, match="graphviz's `dot` is not installed"):
        write(cases.megatron_mlp(), tmp_path / "plan.svg")
