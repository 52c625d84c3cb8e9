"""Expert parallelism and MLA on real gloo ranks, for tiny Hugging Face Mixtral, Qwen3-MoE and DeepSeek-V3.

- Forced expert parallelism (the routed experts' weights split over experts on a 1-D mesh of 4) matches one
  device in outputs and every gradient, with either token dispatcher: all-gather (tokens whole on the axis,
  the output's Partial reduced) and all-to-all (tokens split, dispatched and combined by
  ``all_to_all_single``: 3 forward all-to-alls -- split sizes, dispatch, combine -- and 2 backward per MoE
  layer), each asserted from the collectives every rank issued, against the plan; the report names it.
- DeepSeek-V3's MLA attention with Megatron tensor parallelism forced on ``q_b_proj`` / ``kv_b_proj``
  (column) and ``o_proj`` (row) matches one device forward and backward (it used to fail in backward with
  "_RedistributeBackward returned an invalid gradient": slice assignment into a ``new_empty`` buffer).
- A Mixtral-8x7B-shaped model on 8 x 8 with 16 x 4096 tokens is planned expert-parallel by the planner itself,
  dispatching by all-to-all, and the report gives the all-to-all volume.

Models run in float32: CPU grouped matmuls (``aten._grouped_mm``) take no float64.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import autoshard
from autoshard.capture import capture
from autoshard.capture.dispatch import routed_experts
from autoshard.runtime.verify import cluster_for, verify

transformers = pytest.importorskip("transformers")

_COMMON = {
    "vocab_size": 64, "hidden_size": 32, "num_attention_heads": 4, "max_position_embeddings": 32,
    "use_cache": False, "bos_token_id": 0, "eos_token_id": 1,
}  # fmt: skip


def _model(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if kind == "mixtral":
        config: Any = transformers.MixtralConfig(
            **_COMMON, num_key_value_heads=2, intermediate_size=32, num_hidden_layers=1, num_local_experts=4,
            num_experts_per_tok=2, router_jitter_noise=0.0,
        )  # fmt: skip
        cls: Any = transformers.MixtralForCausalLM
    elif kind == "qwen3-moe":
        config = transformers.Qwen3MoeConfig(
            **_COMMON, num_key_value_heads=2, intermediate_size=32, moe_intermediate_size=16, num_hidden_layers=1,
            num_experts=4, num_experts_per_tok=2, head_dim=8,
        )  # fmt: skip
        cls = transformers.Qwen3MoeForCausalLM
    else:  # DeepSeek-V3: MLA with a compressed query, routed experts in groups, a shared expert
        config = transformers.DeepseekV3Config(
            **_COMMON, num_key_value_heads=4, intermediate_size=32, moe_intermediate_size=16, num_hidden_layers=1,
            n_shared_experts=1, n_routed_experts=4, num_experts_per_tok=2, n_group=2, topk_group=1,
            first_k_dense_replace=0, kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=4, v_head_dim=8,
            qk_nope_head_dim=8,
        )  # fmt: skip
        cls = transformers.DeepseekV3ForCausalLM
    config._attn_implementation = "sdpa"
    return cls(config).float().eval()


EXPERT_PARALLEL = {"*.experts": ((1, 1), (4, 1, 1), (4, 1, 1))}  # x whole, both expert weights split 4 ways
ALL_TO_ALL = {"*.experts": ((4, 1), (4, 1, 1), (4, 1, 1))}  # tokens and both expert weights split 4 ways


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["mixtral", "qwen3-moe", "deepseek-v3"])
def test_forced_expert_parallelism_verifies_on_4_ranks(kind: str) -> None:
    model = _model(kind)
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    captured = capture(model, (ids,), blocks="full")
    assert any(n.target is routed_experts for n in captured.graph_module.graph.nodes)
    plan = autoshard.plan(model, cluster_for("cpu", 4), (ids,), annotations=EXPERT_PARALLEL)
    experts = [n for n in plan.nodes if n.target.endswith("routed_experts")]
    assert experts and all(n.strategy == "R, S(0), S(0), R, R -> P" for n in experts)
    assert "expert parallel on axis 0" in plan.summary()
    # the Partial is reduced after the experts (DeepSeek-V3: after the shared expert's output is added)
    reductions = [
        c for c in plan.collectives if c.phase == "forward" and c.kind in ("all_reduce", "reduce_scatter")
    ]
    assert reductions, "the expert output's Partial must be reduced"
    report = verify(model, (ids,), plan=plan, captured=captured, name=kind)
    assert report.ok, str(report)
    assert report.emitted == report.planned and report.ranks_agree
    assert report.emitted.get("forward all_reduce", 0) + report.emitted.get("forward reduce_scatter", 0) >= 1
    assert "forward all_to_all" not in report.emitted


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["mixtral", "qwen3-moe", "deepseek-v3"])
def test_all_to_all_dispatch_verifies_on_4_ranks(kind: str) -> None:
    """Tokens stay split; each rank sends its rows to the experts' ranks and gets them back.  The plan lists
    the all-to-alls with the volume it priced (each rank's 4 tokens x top-2 rows of 32 float32), and the ranks
    ran exactly those."""
    model = _model(kind)
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    plan = autoshard.plan(model, cluster_for("cpu", 4), (ids,), annotations=ALL_TO_ALL)
    [experts] = [n for n in plan.nodes if n.target.endswith("routed_experts")]
    assert experts.strategy == "S(0), S(0), S(0), S(0), S(0) -> S(0)"
    a2a = [c for c in plan.collectives if c.kind == "all_to_all" and c.node == experts.name]
    rows = 16 // 4 * 2 * 32 * 4  # tokens per rank x top-k x hidden x bytes
    assert sorted((c.phase, c.nbytes) for c in a2a) == [
        ("backward", rows), ("backward", rows), ("forward", 4 * 8), ("forward", rows), ("forward", rows)
    ]  # fmt: skip
    assert "tokens sent by all-to-all: 5 per step" in " ".join(plan.summary().split())  # lines wrap
    report = verify(model, (ids,), plan=plan, name=kind)
    assert report.ok, str(report)
    assert report.emitted == report.planned and report.ranks_agree
    assert report.emitted["forward all_to_all"] == 3 and report.emitted["backward all_to_all"] == 2


@pytest.mark.slow
def test_all_to_all_dispatch_composes_with_a_second_axis() -> None:
    """On 2 x 2 the all-to-all runs on axis 0's groups while axis 1 splits the tokens further (each group
    exchanges its own quarter of the batch) or splits the FFN dim inside the experts (the combined rows come
    back Partial on axis 1 and are reduced after)."""
    model = _model("mixtral")
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    cluster = autoshard.load_cluster("cpu", mesh=(2, 2))
    for pins, out in [
        ({"*.experts": ((4, 1), (2, 1, 1), (2, 1, 1))}, "-> (S(0), S(0))"),  # tokens on both axes
        ({"*.experts": ((2, 1), (2, 1, 1), (2, 2, 1))}, "-> (S(0), P)"),  # FFN dim on axis 1
    ]:
        plan = autoshard.plan(model, cluster, (ids,), annotations=pins)
        [experts] = [n for n in plan.nodes if n.target.endswith("routed_experts")]
        assert experts.strategy.endswith(out), experts.strategy
        report = verify(model, (ids,), plan=plan, name="mixtral 2x2")
        assert report.ok, str(report)
        assert report.emitted == report.planned and report.ranks_agree
        assert report.emitted["forward all_to_all"] == 3 and report.emitted["backward all_to_all"] == 2


MLA_TP = {
    "*.q_b_proj": ((1, 1, 1), (2, 1)),
    "*.kv_b_proj": ((1, 1, 1), (2, 1)),
    "*.o_proj": ((1, 1, 2), (1, 2)),
}


@pytest.mark.slow
def test_mla_tensor_parallel_forward_and_backward() -> None:
    model = _model("deepseek-v3")
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(2))
    plan = autoshard.plan(model, cluster_for("cpu", 2), (ids,), annotations=MLA_TP)
    report = verify(model, (ids,), plan=plan, captured=capture(model, (ids,), blocks="full"), name="mla")
    assert report.ok, str(report)
    assert report.emitted == report.planned and report.ranks_agree
    assert {"forward all_reduce", "backward all_reduce"} <= set(report.emitted)


@pytest.mark.slow
def test_mixtral_8x7b_chooses_expert_parallelism_on_8x8() -> None:
    """At 16 x 4096 tokens, moving tokens to the experts costs less than gathering 2.8 GB of expert weights per
    layer: the planner splits the experts (across nodes, here), dispatches by all-to-all, and the report names
    it, with the bytes."""
    from autoshard import zoo

    case = zoo.build("mixtral-8x7b", batch=16, seq=4096)
    plan = autoshard.plan(case.model, autoshard.load_cluster("a100x8", nodes=8, mesh=(8, 8)), case.args)
    experts = [n for n in plan.nodes if n.target.endswith("routed_experts")]
    assert experts and all("(S(0), R), (S(0), R)" in n.strategy for n in experts), [
        n.strategy for n in experts
    ]
    assert "expert parallel on axis 0" in plan.summary()
    moved = [c for c in plan.collectives if c.mesh_axis == 0 and c.module.endswith("mlp.experts")]
    # 8 experts over 8 nodes, top-2: sending each token's 2 rows (n / k = 4 times less than gathering every
    # token) wins; per layer: split sizes, dispatch and combine forward, both again backward
    assert {c.kind for c in moved} == {"all_to_all"} and len(moved) == 5 * 32
    rows = 16 * 4096 // 64 * 2 * 4096 * 2  # tokens per device x top-2 x hidden x bf16 bytes
    assert sorted({c.nbytes for c in moved}) == [8 * 8, rows]
    assert "tokens sent by all-to-all: 160 per step" in " ".join(plan.summary().split())


@pytest.mark.slow
def test_planner_tries_fused_and_unfused_experts_and_codegen_follows() -> None:
    """With fused expert MLPs in the capture the planner also plans the unfused graph and keeps the cheaper;
    verify (through parallelize's capture) rebuilds the graph the plan was made on, fused or not."""
    from autoshard.capture.experts import plan_fuses_experts

    model = _model("deepseek-v3")
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(3))
    plan = autoshard.plan(model, cluster_for("cpu", 2), (ids,), annotations={"input_ids": ("S(0)",)})
    assert any(note.startswith("expert MLPs planned") for note in plan.notes), plan.notes
    assert "experts_alternative" in plan.timings
    fused = plan_fuses_experts(plan.nodes)
    assert fused == any(note.startswith("expert MLPs planned fused") for note in plan.notes)
    report = verify(model, (ids,), plan=plan, name="deepseek-either")  # captures as the plan says
    assert report.ok, str(report)
    assert report.emitted == report.planned and report.ranks_agree
    assert sum(report.emitted.values()) >= 1  # something distributed ran (here: the ids gathered)


def test_experts_split_on_the_zigzag_axis_are_dispatched_in_storage_order() -> None:
    """On the ring's zigzag axis every split is stored zigzag, the experts' too: device r of n holds chunks r
    and 2n-1-r of 2n, and the all-to-all dispatch renumbers expert ids in that order (the H100 Mixtral plan
    dispatching on its ring axis sent tokens to the wrong experts before)."""
    from autoshard.codegen.dispatch import zigzag_expert_order

    assert zigzag_expert_order(8, 2) == (0, 1, 6, 7, 2, 3, 4, 5)
    assert zigzag_expert_order(4, 2) == (0, 3, 1, 2)
    assert sorted(zigzag_expert_order(16, 4)) == list(range(16))
