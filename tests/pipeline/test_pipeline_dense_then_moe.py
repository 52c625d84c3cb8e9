"""A pipeline over a stack whose repeated run starts after a non-repeated layer (``BlockInfo.first > 0``).

A tiny DeepSeek-V3 has one dense layer, then two identical MoE layers: capture collapses the MoE run
(``model.layers.1`` on), and the pipeline plan must cut that run at the model's own layer indices, with the
dense layer whole on the first stage.  Two stages of two gloo ranks each run one 1F1B step of four
microbatches; the loss and every gradient a rank holds whole equal the single-device model's.
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch
import torch.nn.functional as F

import autoshard
from autoshard.capture import capture
from autoshard.runtime.launch import launch
from autoshard.runtime.pipelining import build_pipeline, step
from autoshard.runtime.stages import prepare_stages

transformers = pytest.importorskip("transformers")

BATCH, SEQ, MICRO, LAYERS = 8, 8, 4, 3


def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten())


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.DeepseekV3Config(
        vocab_size=64, hidden_size=32, num_attention_heads=4, max_position_embeddings=32, use_cache=False,
        bos_token_id=0, eos_token_id=1, num_key_value_heads=4, intermediate_size=32, moe_intermediate_size=16,
        num_hidden_layers=LAYERS, n_shared_experts=1, n_routed_experts=4, num_experts_per_tok=2, n_group=2,
        topk_group=1, first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=4,
        v_head_dim=8, qk_nope_head_dim=8,
    )  # fmt: skip
    config._attn_implementation = "sdpa"
    return transformers.DeepseekV3ForCausalLM(config).float()  # CPU grouped matmuls take no float64


@functools.cache
def _case():  # type: ignore[no-untyped-def]
    model = _model()
    ids = torch.randint(0, 64, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    labels = torch.randint(0, 64, (BATCH, SEQ), generator=torch.Generator().manual_seed(2))
    cluster = autoshard.load_cluster("cpu", mesh=(4,))
    plan = autoshard.plan(model, cluster, (ids,), pipeline=2, microbatches=MICRO, schedule="1f1b")
    return model, ids, labels, plan, prepare_stages(model, plan, (ids,))


def _rank() -> dict:
    model, ids, labels, plan, stages = _case()
    run = build_pipeline(model, plan, (ids,), loss_fn, stages=stages, record=True)
    loss = step(run, ids, labels)
    grads = {k: v.grad for m in run.modules for k, v in m.named_parameters() if v.grad is not None}
    return {"loss": loss, "stages": run.stage_indices, "grads": grads}


@pytest.mark.slow
def test_two_stage_pipeline_of_a_dense_then_moe_stack_matches_one_device() -> None:
    model, ids, labels, plan, _ = _case()
    blocks = capture(model, (ids,)).blocks
    assert blocks is not None and blocks.first == 1 and blocks.num_blocks == LAYERS - 1
    assert plan.pipeline is not None and plan.degrees["pp"] == 2
    first, last = plan.pipeline.stages
    assert "model.layers.0" in first.modules and "model.embed_tokens" in first.modules  # dense layer whole
    layers = [
        tuple(m for m in s.modules if m.count(".") == 2 and m.startswith("model.layers."))
        for s in (first, last)
    ]
    assert (
        layers[0][-1] == f"model.layers.{first.layers[1] - 1}"
        and layers[1][0] == f"model.layers.{last.layers[0]}"
    )
    assert first.layers[0] == 1 and last.layers[1] == LAYERS  # the model's layer indices: the run starts at 1
    assert sorted({m for s in layers for m in s}) == [f"model.layers.{i}" for i in range(LAYERS)]

    results = launch(_rank, 4, timeout=300)
    reference = copy.deepcopy(model)
    want = loss_fn(reference(ids).logits, labels)
    want.backward()
    losses = [r["loss"] for r in results if r["loss"] is not None]
    assert len(losses) == 2  # the last stage's two ranks
    for got in losses:
        torch.testing.assert_close(got, want.detach(), rtol=1e-5, atol=1e-6)
    assert {tuple(r["stages"]) for r in results} == {(0,), (1,)}
    expected = dict(reference.named_parameters())
    compared = set()
    for r in results:
        for name, grad in r["grads"].items():
            ref = expected[name].grad
            if ref is not None and grad.shape == ref.shape:  # a rank holding the whole parameter
                torch.testing.assert_close(grad, ref, rtol=1e-4, atol=1e-5)
                compared.add(name)
    assert any(n.startswith("model.layers.0.") for n in compared)  # the dense layer, on the first stage
    assert any(
        n.startswith(f"model.layers.{LAYERS - 1}.") for n in compared
    )  # the last MoE layer, on the last stage
