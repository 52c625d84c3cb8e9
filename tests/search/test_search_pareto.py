"""Elimination over (memory, cost) Pareto sets equals brute force under binding memory budgets."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from autoshard.search import Edge, SearchProblem
from autoshard.search import pareto as pareto_mod
from autoshard.search.brute import brute_force
from autoshard.search.pareto import pareto_plan
from autoshard.search.problem import evaluate, memory_of
from tests.search.search_cases import close, random_problem


@pytest.mark.parametrize("seed", range(60))
def test_equals_brute_force_on_random_budgeted_graphs(seed: int) -> None:
    problem = random_problem(
        seed, max_nodes=7, memory=True, masks=seed % 3 == 0, inf_fraction=0.1 * (seed % 2)
    )
    try:
        best = brute_force(problem)
    except Exception:  # nothing fits: the elimination finds nothing either
        assert pareto_plan(problem, upper=math.inf) is None
        return
    found = pareto_plan(problem, upper=math.inf)
    assert found is not None
    assert memory_of(problem, found) <= problem.memory_limit  # type: ignore[operator]
    assert close(evaluate(problem, found), best.objective, rel=1e-12)
    # told the optimum's own cost, it still finds it; told less, nothing qualifies
    again = pareto_plan(problem, upper=best.objective)
    assert again is not None and close(evaluate(problem, again), best.objective, rel=1e-12)
    assert pareto_plan(problem, upper=best.objective * 0.9 - 1e-3) is None


def test_a_dearer_plan_wins_when_the_cheap_one_does_not_fit() -> None:
    # two independent nodes: the cheapest pair needs 13 bytes of 10; (1, 0) costs 1 and needs 9
    p = SearchProblem(
        (np.array([0.0, 1.0, 5.0]), np.array([0.0, 2.0])),
        (Edge(0, 1, np.zeros((3, 2))),),
        ("a", "b"),
        memory=(np.array([9.0, 5.0, 1.0]), np.array([4.0, 1.0])),
        memory_limit=10.0,
    )
    assert pareto_plan(p, upper=math.inf) == (1, 0)


def test_gives_up_when_a_table_would_pass_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    problem = random_problem(3, max_nodes=7, memory=True)
    monkeypatch.setattr(pareto_mod, "MAX_WORK", 1)
    assert pareto_plan(problem, upper=math.inf) is None
    monkeypatch.setattr(pareto_mod, "MAX_WORK", 10**9)
    monkeypatch.setattr(pareto_mod, "MAX_TOTAL_WORK", 1)
    assert pareto_plan(problem, upper=math.inf) is None


def test_sliced_steps_equal_whole_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    """A step too large for one table is done one value of its first separator variable at a time."""
    rng = np.random.default_rng(5)
    sizes = [6, 7, 5, 6, 4]
    edges = tuple(
        Edge(u, v, rng.random((sizes[u], sizes[v])))
        for u, v in ((0, 1), (1, 2), (0, 2), (2, 3), (3, 4), (1, 3))
    )
    mem = tuple(rng.integers(0, 50, s).astype(float) for s in sizes)
    p = SearchProblem(
        tuple(rng.random(s) for s in sizes), edges, tuple("abcde"), memory=mem,
        memory_limit=float(sum(m.min() for m in mem) + 40),
    )  # fmt: skip
    whole = pareto_plan(p, upper=math.inf)
    calls: list[int] = []
    rows = pareto_mod._combine_rows

    def counted(*args: Any) -> Any:
        calls.append(1)
        return rows(*args)

    monkeypatch.setattr(pareto_mod, "_combine_rows", counted)
    monkeypatch.setattr(pareto_mod, "MAX_ENTRIES", 1000)
    sliced = pareto_plan(p, upper=math.inf)
    assert len(calls) > len(sizes) + 1  # some step ran in slices
    best = brute_force(p)
    assert whole is not None and sliced is not None
    assert close(evaluate(p, whole), best.objective, rel=1e-12)
    assert close(evaluate(p, sliced), best.objective, rel=1e-12)


def test_an_empty_problem_is_the_empty_plan() -> None:
    empty = SearchProblem((), (), (), memory=(), memory_limit=0.0)
    assert pareto_plan(empty, upper=0.0) == ()


@pytest.mark.parametrize("seed", range(40))
def test_pareto_below_tells_nothing_fits_from_too_large(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """``(None, True)`` is a proof (reparametrised fixing turns it into a bound): no plan fits at most
    ``upper``; the caps give ``(None, False)``."""
    problem = random_problem(seed, max_nodes=7, memory=True, inf_fraction=0.1 * (seed % 2))
    try:
        best = brute_force(problem).objective
    except Exception:
        assert pareto_mod.pareto_below(problem, upper=math.inf) == (None, True)
        return
    found, proven = pareto_mod.pareto_below(problem, upper=best)
    assert proven and found is not None and close(evaluate(problem, found), best, rel=1e-12)
    assert pareto_mod.pareto_below(problem, upper=best * (1 - 1e-6) - 1e-6) == (None, True)
    monkeypatch.setattr(pareto_mod, "MAX_TOTAL_WORK", 1)
    assert pareto_mod.pareto_below(problem, upper=best) == (None, False)
