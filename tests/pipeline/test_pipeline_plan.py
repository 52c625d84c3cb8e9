"""autoshard.plan with stages and microbatches: the joint optimum, the plan record, pins and bad input."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import autoshard
from autoshard.errors import PipelineError
from autoshard.pipeline.options import check_request, split_cut_pins
from cost_models.profile import load_profile

transformers = pytest.importorskip("transformers")

# per device: the profile's 1 GB runtime reserve plus ~300 MiB, too little for the model on one node of 4
BUDGET = 1300 * 2**20


def _llama(layers: int = 4, hidden: int = 1024):
    cfg = transformers.LlamaConfig(
        hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers, num_attention_heads=8,
        num_key_value_heads=8, vocab_size=4096, max_position_embeddings=256, use_cache=False,
        attn_implementation="sdpa", bos_token_id=0, eos_token_id=4095,
    )  # fmt: skip
    with torch.device("meta"):
        return transformers.LlamaForCausalLM(cfg), torch.zeros(16, 128, dtype=torch.long, device="meta")


@pytest.fixture(scope="module")
def slow_link() -> autoshard.Cluster:
    """2 nodes of 4 A100s whose network is 1000x slower than the profile's: crossing nodes is dear."""
    a100 = load_profile("a100x8")
    network = dataclasses.replace(a100.inter_node, nic_bandwidth=a100.inter_node.nic_bandwidth / 1000)
    profile = dataclasses.replace(a100, inter_node=network, devices_per_node=4)
    return autoshard.load_cluster(profile, nodes=2, mesh=(2, 4))


@pytest.fixture(scope="module")
def tight_plan(slow_link):
    model, ids = _llama(layers=8)
    return autoshard.plan(model, slow_link, (ids,), pipeline="auto", microbatches="auto", memory_limit=BUDGET)


def test_tight_memory_and_slow_network_give_stages_across_nodes(tight_plan, slow_link) -> None:
    plan = tight_plan
    assert plan.degrees.get("pp") == 2 and plan.pipeline is not None
    assert plan.memory_per_device <= BUDGET
    # every stage's device group is one whole node; intra-op parallelism inside it
    per_node = slow_link.devices_per_node
    for stage in plan.pipeline.stages:
        assert {r // per_node for r in stage.ranks} == {stage.ranks[0] // per_node}
    assert plan.degrees.get("tp", 1) * plan.degrees.get("dp", 1) * plan.degrees.get("fsdp", 1) == 4
    assert plan.mesh_shape == (2, 4) and plan.pipeline.mesh_axis == 0
    # the stages cover every layer once, embedding first and head last
    layers = [i for st in plan.pipeline.stages for i in range(*st.layers)]
    assert layers == sorted(layers) == list(range(8))
    assert plan.pipeline.stages[0].modules[0] == "model.embed_tokens"
    assert "lm_head" in plan.pipeline.stages[-1].modules
    assert plan.summary().splitlines()[0].startswith("PP 2 (")
    assert "microbatches of" in plan.summary().splitlines()[0]


def test_without_stages_the_same_budget_costs_more(tight_plan, slow_link) -> None:
    model, ids = _llama(layers=8)
    try:
        flat = autoshard.plan(model, slow_link, (ids,), memory_limit=BUDGET)
    except autoshard.AutoshardError:
        return  # nothing fits without stages: the stages were necessary
    assert flat.predicted_step_time > tight_plan.predicted_step_time


def test_pipeline_plan_round_trips_through_json(tight_plan, tmp_path) -> None:
    path = tmp_path / "plan.json"
    tight_plan.save(path)
    back = autoshard.load_plan(path)
    assert back.pipeline == tight_plan.pipeline
    assert back.degrees == tight_plan.degrees and back.microbatches == tight_plan.microbatches


def test_pinned_cut_and_schedule(slow_link) -> None:
    model, ids = _llama()
    plan = autoshard.plan(
        model, slow_link, (ids,), pipeline=2, microbatches=4, schedule="gpipe",
        annotations={"model.layers.1": "stage"}, memory_limit=float("inf"),
    )  # fmt: skip
    assert plan.pipeline is not None and plan.pipeline.schedule == "gpipe"
    assert [st.layers for st in plan.pipeline.stages] == [(0, 1), (1, 4)]
    assert plan.microbatches == 4
    p, m = 2, 4
    assert plan.pipeline.bubble_fraction == pytest.approx((p - 1) / (m + p - 1), rel=0.5)


def test_suggested_degrees_fit_the_outermost_axis() -> None:
    """On a 2 x 8 mesh only 1 and 2 stages fit the outermost axis: the error suggests those, not [1, 2, 4, 8]."""
    for degree in (3, 4):  # 3 read "3 stages do not divide the 16 devices" (new-user trial)
        with pytest.raises(
            PipelineError, match=r"outermost mesh axis, of size 2, which \d does not divide.*\[1, 2\]$"
        ):
            check_request(degree, 1, "auto", batch=16, layers=12, devices=16, nodes=2, outer=2)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"pipeline": 3}, ["pipeline=3", "do not divide the 8 devices", "[1, 2]"]),  # 2 nodes: whole nodes
        ({"pipeline": 8}, ["pipeline=8", "more stages than", "4 repeated layers"]),
        ({"microbatches": 5}, ["microbatches=5", "global batch of 16", "[1, 2, 4, 8, 16]"]),
        ({"schedule": "zigzag"}, ["schedule='zigzag'", "interleaved_1f1b"]),
        ({"pipeline": "two"}, ["pipeline='two'", "'auto'"]),
    ],
)
def test_bad_pins_are_one_line(kwargs, words) -> None:
    args = {"pipeline": None, "microbatches": 1, "schedule": "auto", **kwargs}
    with pytest.raises(PipelineError) as err:
        check_request(**args, batch=16, layers=4, devices=8, nodes=2)
    text = str(err.value)
    assert "\n" not in text
    for word in words:
        assert word in text


def test_cut_pins_are_checked() -> None:
    rest, cuts = split_cut_pins({"model.layers.2": "stage", "lm_head": "column"}, "model.layers", 4)
    assert cuts == (2,) and rest == {"lm_head": "column"}
    with pytest.raises(PipelineError, match="cut inside a layer"):
        split_cut_pins({"model.layers.2.mlp": "stage"}, "model.layers", 4)
    with pytest.raises(PipelineError, match=r"model.layers.1 .. model.layers.3"):
        split_cut_pins({"model.layers.0": "stage"}, "model.layers", 4)
    with pytest.raises(PipelineError, match="only start at a repeated layer"):
        split_cut_pins({"lm_head": "stage"}, "model.layers", 4)


def test_plan_refuses_stages_that_do_not_fit_before_capturing(slow_link) -> None:
    model, ids = _llama()
    with pytest.raises(PipelineError, match="microbatches=3"):
        autoshard.plan(model, slow_link, (ids,), pipeline=2, microbatches=3)


def test_dot_draws_stages_as_clusters_with_p2p(tight_plan) -> None:
    from autoshard.report.dot import to_dot

    text = to_dot(tight_plan)
    assert text.count('label="pipeline stage') == len(tight_plan.pipeline.stages)
    assert "stage0 -> stage1" in text and "p2p" in text


def test_pinned_degree_inside_one_node() -> None:
    from autoshard import zoo

    case = zoo.build("llama-tiny", layers=4, batch=8, seq=16)
    cluster = autoshard.load_cluster("cpu", mesh=(4,))
    plan = autoshard.plan(case.model, cluster, case.args, pipeline=2, microbatches=4, schedule="1f1b")
    assert plan.mesh_shape == (2, 2) and "mesh (2, 2)" in plan.cluster["description"]
    assert [st.ranks for st in plan.pipeline.stages] == [(0, 1), (2, 3)]
    assert plan.summary().splitlines()[0].startswith("PP 2 (1F1B)")
