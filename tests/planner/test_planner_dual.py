"""The ranking's bound raised by the sync the backward cannot hide (autoshard/problem/exposure.py,
autoshard/planner_dual.py): never above a plan's reported step, and the plans it finds."""

from __future__ import annotations

import pytest
import torch
from test_planner_rerank import _plans, _stack  # plans optimal for randomly scaled costs (tests/planner)

import autoshard
from autoshard.capture import capture
from autoshard.planner_rerank import lower_bound_problem
from autoshard.problem.build import build_problem
from autoshard.problem.costs import CostOptions
from autoshard.problem.exposure import exposure, exposure_terms, tightened
from autoshard.search import evaluate
from autoshard.zoo import MLP


def _mlp() -> tuple[torch.nn.Module, torch.Tensor]:
    with torch.device("meta"):
        return MLP(64, 256), torch.zeros(512, 64)


@pytest.mark.parametrize("model", ["stack", "mlp"])
def test_the_tightened_bound_never_exceeds_a_plans_reported_step(model: str) -> None:
    """A stack of 8 repeated blocks with few tokens (each layer's sync outlasts its backward: ``(N - 1)(s -
    c)``) and a Megatron MLP (fc2's sync hides under fc1's backward only in part): for every ``lam`` the
    tightened lower-bound problem stays at or below the critical path of plans of every kind, and it is
    strictly above the lower-bound problem on some (the test would show nothing otherwise)."""
    net, x = _stack(256, 1024) if model == "stack" else _mlp()
    built = build_problem(capture(net, (x,)), autoshard.load_cluster("a100x8", mesh=(8,)), CostOptions())
    lower, terms = lower_bound_problem(built), exposure_terms(built)
    assert lower is not None and terms is not None
    raised = 0
    for plan, choice in _plans(net, (x,), built, 5, seed=3):
        step = plan.predicted_step_time * (1 + 1e-9)
        for lam in (0.25, 0.5, 1.0):
            assert evaluate(tightened(lower, terms, lam), choice) <= step
        raised += exposure(terms, choice) > 0
    assert raised, "some plan must sync more than the backward behind it can hide"
