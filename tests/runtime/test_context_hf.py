"""Context parallelism where users need it: a Hugging Face LLaMA (explicit mask, proven causal at capture) plans
the zigzag ring by itself and matches one device on gloo; a pipelined CP plan of a multi-head LLaMA verifies; a
pipeline with the zigzag ring in every stage equals one device."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from context_cases import count_hops, planned_per_hop, sent_per_hop

import autoshard
from autoshard import zoo
from autoshard.codegen import parallel_info
from autoshard.codegen.shard import gather_full
from autoshard.runtime.launch import launch
from autoshard.runtime.pipelining import build_pipeline, step
from autoshard.runtime.stages import prepare_stages
from autoshard.runtime.verify import cluster_for


@pytest.mark.slow
def test_hf_llama_prices_its_mask_causal_plans_zigzag_and_matches_one_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    case = zoo.build(
        "llama-tiny", batch=1, seq=1024
    )  # 2 layers, GQA 4/2 heads, transformers' own causal mask
    model = case.model.double()
    # the ring is pinned (at this size head and batch splits are cheaper); the layout is chosen by price
    pins = {"model.layers.*.self_attn": "ring"}
    plan = autoshard.plan(model, cluster_for("cpu", 2), case.args, annotations=pins)
    # the mask is proven causal: contiguous pieces leave rank 1 3/2 of the average work, zigzag balances it
    assert plan.degrees == {"cp": 2} and (plan.context_axis, plan.context_layout) == (0, "zigzag")
    assert plan.input_placements == {"input_ids": ("S(1)",)}
    assert any("explicit attention masks proven causal" in n for n in plan.notes)
    assert any("layout searched: contiguous" in n and "; zigzag on axis 0" in n for n in plan.notes)
    hops = count_hops(tmp_path, monkeypatch)
    report = autoshard.verify(model, case.args, plan=plan)
    assert report.ok, str(report)
    # the K/V ring really ran: 2 layers x 2 ranks x (1 hop forward + 2 backward)
    assert hops.read_text().count("hop") == 2 * 2 * 3
    assert sent_per_hop(hops) == planned_per_hop(plan, 2)  # the report lists the hops that ran


def _multi_head_llama() -> tuple[torch.nn.Module, torch.Tensor]:
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=2,
        vocab_size=128, max_position_embeddings=64, use_cache=False, attn_implementation="sdpa",
        bos_token_id=0, eos_token_id=127,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config).double().eval()
    return model, torch.randint(0, 128, (4, 32), generator=torch.Generator().manual_seed(1))


@pytest.mark.slow
def test_verify_of_a_pipelined_context_parallel_plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: K reaches the ring as a transposed view when no repeat_kv copies it (as many heads as KV
    heads), and the ring's receive buffers copied its strides: gloo refused them in ``_rotate``."""
    model, ids = _multi_head_llama()
    pins = {"model.layers.*.self_attn": "ring"}
    plan = autoshard.plan(model, cluster_for("cpu", 4), (ids,), annotations=pins, pipeline=2, microbatches=2)
    assert plan.degrees.get("pp") == 2 and plan.degrees.get("cp") == 2
    hops = count_hops(tmp_path, monkeypatch)
    report = autoshard.verify(model, (ids,), plan=plan)
    assert report.ok, str(report)
    # verify runs every layer as one stage on all 4 ranks (each pipeline row rings over its 2 CP ranks):
    # 4 ranks x 4 layers x (1 hop forward + 2 backward)
    assert hops.read_text().count("hop") == 4 * 4 * 3


def _pipelined_rank(model: torch.nn.Module, plan: autoshard.Plan, stages: Any, ids: torch.Tensor) -> Any:
    run = build_pipeline(model, plan, (ids,), _loss, stages=stages)
    loss = step(run, ids, _labels())
    grads = {}
    for module in run.modules:
        info = parallel_info(module)
        for attr in info.attrs:
            if attr.kind == "parameter":
                grad = module.get_parameter(attr.fqn).grad
                grads[attr.fqn] = gather_full(grad, attr.spec, attr.global_shape, info.comm)
    return None if loss is None else float(loss), grads


def _loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())


def _labels() -> torch.Tensor:
    return torch.randint(0, 128, (4, 32), generator=torch.Generator().manual_seed(2))


@pytest.mark.slow
def test_a_pipeline_runs_the_zigzag_ring_in_every_stage_and_equals_one_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """2 stages x CP 2 on 4 gloo ranks, zigzag asked; the sequence is cut in the zigzag
    layout once, at stage 0's input, every stage keeps it (activations cross stages in it) and the logits are
    gathered back to global order for the loss, so the labels are never permuted."""
    model, ids = _multi_head_llama()
    pins = {"model.layers.*.self_attn": "ring"}
    cluster = cluster_for("cpu", 4)
    plan = autoshard.plan(
        model, cluster, (ids,), annotations=pins, pipeline=2, microbatches=2, cp_layout="zigzag"
    )
    assert plan.degrees == {"pp": 2, "cp": 2} and (plan.context_axis, plan.context_layout) == (1, "zigzag")
    assert any("zigzag layout pinned" in n for n in plan.notes)  # chosen on the stage search's plan
    stages = prepare_stages(model, plan, (ids,), pins)
    assert {(s.plan.context_axis, s.plan.context_layout) for s in stages} == {(0, "zigzag")}
    hops = count_hops(tmp_path, monkeypatch)
    ranks = launch(_pipelined_rank, 4, model, plan, stages, ids, timeout=300)
    reference = copy.deepcopy(model)
    loss = _loss(reference(ids).logits, _labels())
    loss.backward()
    losses = [r[0] for r in ranks if r[0] is not None]
    assert len(losses) == 2 and losses == pytest.approx([float(loss)] * 2, rel=1e-12)
    params = dict(reference.named_parameters())
    for _, grads in ranks:
        for fqn, grad in grads.items():
            torch.testing.assert_close(grad, params[fqn].grad, rtol=1e-9, atol=1e-12)
    # every layer's ring ran on both CP ranks of its stage, for both microbatches: 4 layers x 2 ranks x 2
    # microbatches x (1 hop forward + 2 backward)
    assert hops.read_text().count("hop") == 4 * 2 * 2 * 3
    # the plan lists them on the ring axis behind 'pp', for the whole model (every stage's layers) per CP rank
    assert {r.mesh_axis for r in plan.ring_transfers} == {plan.context_axis}
    assert sent_per_hop(hops) == planned_per_hop(plan, 2)
