"""An inference plan (``search --inference``) has no gradients and no optimizer state: its memory holds the
weights alone and its report says so (it listed "weights, grads, optimizer" and "Adam ... sharded")."""

from __future__ import annotations

import functools

import autoshard
from autoshard import zoo
from autoshard.report.figures import Baseline, param_memory
from autoshard.report.table import render

WHOLE = {"fc1": "replicate", "fc2": "replicate"}


@functools.cache
def _plans() -> tuple[autoshard.Plan, autoshard.Plan, int]:
    case = zoo.build("mlp")
    cluster = autoshard.load_cluster("a100x8", mesh=(8,))
    weights = sum(p.numel() * p.element_size() for p in case.model.parameters())
    plan = functools.partial(autoshard.plan, case.model, cluster, case.args, annotations=WHOLE)
    return plan(training=False), plan(training=True), weights


def test_inference_memory_holds_the_weights_alone() -> None:
    inference, training, weights = _plans()
    assert param_memory(inference) == weights  # replicated: every device holds each weight once, nothing more
    assert param_memory(training) > 2 * weights  # + gradients and (sharded) Adam state


def test_inference_report_names_no_gradient_or_optimizer() -> None:
    inference, training, _ = _plans()
    text = render(inference, baseline=Baseline.of(inference))
    assert "weights only" in text and "inference: no gradients, no optimizer state" in text
    assert "optimizer  " not in text and "Adam" not in text and "grad sync" not in text
    assert "weights, grads, optimizer" in render(training) and "Adam (fp32 master + moments)" in render(
        training
    )


def test_baseline_activations_leave_out_the_reserve_and_temporaries() -> None:
    """The data-parallel column's activations row held the runtime reserve and the largest temporary."""
    _, training, _ = _plans()
    rows = {
        line[:30].strip(): line[30:].split()
        for line in render(training, baseline=Baseline.of(training)).splitlines()
    }
    mine, theirs = rows["activations"][:2], rows["activations"][2:]
    assert mine == theirs  # the same plan on both sides reads the same
