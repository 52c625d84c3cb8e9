"""``autoshard.verify`` in training mode with dropout 0.1 (issue 14): every rank and the single-device reference
start their forward from the same RNG state, and the emitted module draws the single-device masks, so outputs and
gradients match under tensor parallelism, not only under replication."""

from __future__ import annotations

import pytest
import torch

import autoshard

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.slow


def _bert() -> torch.nn.Module:
    cfg = transformers.BertConfig(
        vocab_size=512,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    return transformers.BertModel(cfg).double().train()


def _t5() -> torch.nn.Module:
    cfg = transformers.T5Config(
        vocab_size=512, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4, dropout_rate=0.1
    )
    torch.manual_seed(0)
    return transformers.T5EncoderModel(cfg).double().train()


@pytest.mark.parametrize(
    ("build", "pins"),
    [
        (_bert, {"encoder.layer.0.intermediate.dense": "column", "encoder.layer.0.output.dense": "row"}),
        (
            _t5,
            {
                "encoder.block.0.layer.1.DenseReluDense.wi": "column",
                "encoder.block.0.layer.1.DenseReluDense.wo": "row",
            },
        ),
    ],
    ids=["bert", "t5"],
)
def test_dropout_models_verify_in_training_mode(build, pins) -> None:
    model = build()
    ids = torch.randint(0, 512, (4, 16), generator=torch.Generator().manual_seed(1))
    report = autoshard.verify(model, (ids,), nproc=4, annotations=pins)
    assert report.ok, str(report)
    text = str(report)
    assert "all_reduce" in text  # tensor parallelism ran: the Megatron pair's all-reduces
