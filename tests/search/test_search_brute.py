"""The reference itself: brute force against a plain Python loop over every assignment."""

from __future__ import annotations

import itertools
import math

import pytest
from search_cases import random_problem

from autoshard.errors import InfeasibleError
from autoshard.search import brute_force, evaluate, memory_of


@pytest.mark.parametrize("seed", range(12))
def test_brute_force_equals_naive_loop(seed: int) -> None:
    p = random_problem(seed, max_nodes=6, memory=seed % 2 == 0, masks=True, inf_fraction=0.2)
    fits = [
        (evaluate(p, c), c)
        for c in itertools.product(*(range(s) for s in p.sizes))
        if p.memory_limit is None or memory_of(p, c) <= p.memory_limit
    ]
    best = min(fits, default=(math.inf, None))
    if not math.isfinite(best[0]):
        with pytest.raises(InfeasibleError):
            brute_force(p)
        return
    sol = brute_force(p)
    assert sol.objective == pytest.approx(best[0], rel=1e-12) and sol.choice == best[1]


def test_refuses_large_problems() -> None:
    with pytest.raises(ValueError, match="max_assignments"):
        brute_force(random_problem(0, max_nodes=8), max_assignments=2)
