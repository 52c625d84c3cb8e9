"""``autoshard.verify`` in training mode with dropout 0.1 (issue 14): the reference and every rank start their
forward from the same RNG state and the emitted module draws the single-device masks, so BERT and T5 outputs and
gradients match under tensor parallelism, not only under replication.  (test_runtime_rng drives the runtime
directly; this goes through the user-facing check.)"""

from __future__ import annotations

import pytest
from test_runtime_rng import _case

import autoshard

pytest.importorskip("transformers")
pytestmark = pytest.mark.slow

PINS = {
    "bert": {"bert.encoder.layer.0.intermediate.dense": "column", "bert.encoder.layer.0.output.dense": "row"},
    "t5": {
        "encoder.block.0.layer.1.DenseReluDense.wi": "column",
        "encoder.block.0.layer.1.DenseReluDense.wo": "row",
    },
}


@pytest.mark.parametrize("name", ["bert", "t5"])
def test_dropout_models_verify_in_training_mode(name: str) -> None:
    model, args, kwargs, _ = _case(name)
    assert model.training
    report = autoshard.verify(model, args, kwargs, nproc=4, annotations=PINS[name])
    assert report.ok, str(report)
    assert "all_reduce" in str(report)  # the Megatron pair's all-reduces ran


# GPT-2's Conv1D runs addmm(bias, x, W): split the rows of x (batch x sequence)
BATCH_SPLIT = ((1,), (2, 1), (1, 1))
GPT2_PLANS: dict[str, dict[str, object] | None] = {
    "replicated": None,
    "batch split": {"*.c_attn": BATCH_SPLIT, "*.c_proj": BATCH_SPLIT, "*.c_fc": BATCH_SPLIT},
}


@pytest.mark.parametrize("pins", list(GPT2_PLANS))
def test_gpt2_with_attention_dropout_verifies(pins: str) -> None:
    """HF GPT-2 in training mode, attention dropout 0.1 (its default): its attention gets a boolean causal mask
    under export, which the seeded attention handed to ATen's math op as given (added as 0/1): MISMATCH even on a
    replicated plan.  The batch-split plan cuts the attention and its dropout mask by batch."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from autoshard.runtime.verify import cluster_for

    config = GPT2Config(n_embd=32, n_layer=1, n_head=4, vocab_size=64, n_positions=16, use_cache=False)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config).train()
    assert config.attn_pdrop == 0.1
    ids = torch.zeros(4, 8, dtype=torch.long)
    plan = autoshard.plan(model, cluster_for("cpu", 2), (ids,), annotations=GPT2_PLANS[pins])
    attention = next(
        n.strategy for n in plan.nodes if n.target == "aten.scaled_dot_product_attention.default"
    )
    report = autoshard.verify(model, (ids,), plan=plan, allow_replicated=pins == "replicated")
    assert report.ok, str(report)
    if pins == "batch split":
        assert attention == "S(0), S(0), S(0), S(0) -> S(0)"
        assert report.emitted.get("backward all_reduce", 0) > 0  # the batch split's gradient all-reduces ran


def test_native_dropout_verifies_under_a_megatron_pair() -> None:
    """``native_dropout`` between a column and a row linear draws its piece of the single-device mask (before: a
    per-rank draw, MISMATCH); the pair's all-reduces ran."""
    import torch
    from torch import nn

    from autoshard.runtime.verify import cluster_for

    class Pair(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc2(torch.native_dropout(self.fc1(x), 0.5, True)[0])

    model, x = Pair().double().train(), torch.randn(4, 8, dtype=torch.float64)
    plan = autoshard.plan(model, cluster_for("cpu", 2), (x,), annotations={"fc1": "column", "fc2": "row"})
    report = autoshard.verify(model, (x,), plan=plan)
    assert report.ok, str(report)
    assert report.emitted.get("forward all_reduce", 0) > 0


def test_llama_head_split_with_attention_dropout_verifies() -> None:
    """HF LLaMA (grouped kv heads, boolean causal mask, attention dropout 0.1) under Megatron pins: the attention
    splits heads (its dropout mask cut on dim 1) and the pair's all-reduces ran."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from autoshard.runtime.verify import cluster_for

    config = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=64, use_cache=False, attention_dropout=0.1)  # fmt: skip
    torch.manual_seed(0)
    model, ids = LlamaForCausalLM(config).train(), torch.zeros(4, 8, dtype=torch.long)
    pins = {"*.q_proj": "column", "*.k_proj": "column", "*.v_proj": "column", "*.o_proj": "row"}
    plan = autoshard.plan(model, cluster_for("cpu", 2), (ids,), annotations=pins)
    attention = next(
        n.strategy for n in plan.nodes if n.target.endswith("scaled_dot_product_attention.default")
    )
    assert attention.endswith("-> S(1)")
    report = autoshard.verify(model, (ids,), plan=plan)
    assert report.ok, str(report)
    assert report.emitted.get("forward all_reduce", 0) > 0
