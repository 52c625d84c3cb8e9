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
