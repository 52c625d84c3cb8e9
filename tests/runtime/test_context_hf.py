"""Context parallelism where users need it: a Hugging Face LLaMA (explicit mask, proven causal at capture) plans
the zigzag ring by itself and matches one device on gloo; a pipelined CP plan of a multi-head LLaMA verifies."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import autoshard
from autoshard import zoo
from autoshard.codegen import context
from autoshard.runtime.verify import cluster_for


def _count_hops(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    hops = tmp_path / "hops"
    rotate = context._rotate

    def counted(tensors, nxt, prv, group):  # type: ignore[no-untyped-def]
        with hops.open("a") as f:  # the ranks are forked: they append to one file
            f.write("hop\n")
        return rotate(tensors, nxt, prv, group)

    monkeypatch.setattr(context, "_rotate", counted)
    return hops


@pytest.mark.slow
def test_hf_llama_plans_the_zigzag_ring_itself_and_matches_one_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    case = zoo.build(
        "llama-tiny", batch=1, seq=1024
    )  # 2 layers, GQA 4/2 heads, transformers' own causal mask
    model = case.model.double()
    plan = autoshard.plan(model, cluster_for("cpu", 2), case.args)  # nothing pinned
    # the ring pays at 1024 tokens once its causal triangle is priced; the mask is causal, so zigzag balances it
    assert plan.degrees == {"cp": 2} and (plan.context_axis, plan.context_layout) == (0, "zigzag")
    assert plan.input_placements == {"input_ids": ("S(1)",)}
    assert any("explicit attention masks proven causal" in n for n in plan.notes)
    assert any("layout searched: zigzag on axis 0" in n for n in plan.notes)
    hops = _count_hops(tmp_path, monkeypatch)
    report = autoshard.verify(model, case.args, plan=plan)
    assert report.ok, str(report)
    # the K/V ring really ran: 2 layers x 2 ranks x (1 hop forward + 2 backward)
    assert hops.read_text().count("hop") == 2 * 2 * 3


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
    hops = _count_hops(tmp_path, monkeypatch)
    report = autoshard.verify(model, (ids,), plan=plan)
    assert report.ok, str(report)
    # verify runs every layer as one stage on all 4 ranks (each pipeline row rings over its 2 CP ranks):
    # 4 ranks x 4 layers x (1 hop forward + 2 backward)
    assert hops.read_text().count("hop") == 4 * 4 * 3
