"""The exact search equals brute force on real problems from a 3-D mesh, with and without a binding budget.

A two-layer MLP captured and priced on a (2, 2, 2) mesh has 4e9 plans; each case keeps a random subset of
every node's strategies (masks, ~2.6e5 plans) so brute force can check the solver on real cost structures:
redistribution prices on three axes, fan-out-free chains, and the memory of real parameter layouts.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from torch import nn

import autoshard
from autoshard.capture import capture
from autoshard.problem.build import build_problem
from autoshard.problem.costs import CostOptions
from autoshard.search import SearchProblem, solve
from autoshard.search.brute import brute_force
from autoshard.search.pareto import pareto_plan
from autoshard.search.problem import evaluate, memory_of
from tests.search.search_cases import close


class _MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 32, bias=False)
        self.fc2 = nn.Linear(32, 16, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


@pytest.fixture(scope="module")
def problem() -> SearchProblem:
    cluster = autoshard.load_cluster("a100x8", mesh=(2, 2, 2))
    captured = capture(_MLP(), (torch.randn(8, 16),), {})
    p = build_problem(captured, cluster, CostOptions()).problem
    # the graph's own nodes only: the gather nodes (problem/extras.py) take the state their two neighbours
    # imply, and brute force over their states would multiply the plans ~1e3 (tests/search checks the peak)
    n = 6
    return SearchProblem(
        node_costs=p.node_costs[:n],
        edges=tuple(e for e in p.edges if e.u < n and e.v < n),
        names=p.names[:n],
        memory=None if p.memory is None else p.memory[:n],
        strategy_labels=None if p.strategy_labels is None else p.strategy_labels[:n],
    )


def _masked(problem: SearchProblem, seed: int, keep: int = 8) -> SearchProblem:
    rng = np.random.default_rng(seed)
    masks = []
    for size in problem.sizes:
        mask = np.zeros(size, dtype=bool)
        mask[rng.choice(size, min(keep, size), replace=False)] = True
        masks.append(mask)
    return dataclasses.replace(problem, allowed=tuple(masks))


@pytest.mark.parametrize("seed", range(4))
def test_free_optimum_equals_brute_force(problem: SearchProblem, seed: int) -> None:
    masked = _masked(problem, seed)
    assert len(masked.sizes) == 6 and max(masked.sizes) >= 27  # the real 3-D strategy counts
    assert close(solve(masked).objective, brute_force(masked).objective, rel=1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_budgeted_optimum_equals_brute_force(problem: SearchProblem, seed: int) -> None:
    masked = _masked(problem, seed)
    free = brute_force(masked)
    assert masked.memory is not None
    least = brute_force(dataclasses.replace(masked, node_costs=tuple(np.asarray(m) for m in masked.memory)))
    low, high = memory_of(masked, least.choice), memory_of(masked, free.choice)
    assert low < high  # the free optimum does not need the least memory: a budget between them binds
    budgeted = dataclasses.replace(masked, memory_limit=(low + high) / 2)
    best = brute_force(budgeted)
    assert best.objective > free.objective
    found = solve(budgeted)
    assert memory_of(budgeted, found.choice) <= budgeted.memory_limit  # type: ignore[operator]
    assert close(found.objective, best.objective, rel=1e-12)
    direct = pareto_plan(budgeted, upper=np.inf)
    assert direct is not None and close(evaluate(budgeted, direct), best.objective, rel=1e-12)
