"""The dispatcher: every method against brute force, budgets, infeasibility messages, honesty of the gap."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from search_cases import close, random_problem

from autoshard.errors import AutoshardError, InfeasibleError
from autoshard.search import Edge, SearchProblem, brute_force, memory_of, solve

inf = math.inf


def _want(p: SearchProblem) -> float:
    try:
        return brute_force(p).objective
    except InfeasibleError:
        return inf


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("method", ["auto", "exact", "ilp"])
def test_methods_match_brute_force(seed: int, method: str) -> None:
    p = random_problem(
        seed + 1000,
        max_nodes=9,
        memory=seed % 2 == 0,
        masks=seed % 5 == 0,
        inf_fraction=0.2 if seed % 3 == 0 else 0.0,
    )
    want = _want(p)
    if want == inf:
        with pytest.raises(InfeasibleError):
            solve(p, method=method, time_limit=20)  # type: ignore[arg-type]
        return
    s = solve(p, method=method, time_limit=20)  # type: ignore[arg-type]
    assert s.lower_bound <= want * (1 + 1e-9) + 1e-12 <= s.objective * (1 + 2e-9) + 2e-12
    if s.optimal:
        assert close(s.objective, want, 1e-7) and s.gap <= 1e-7
    if p.memory_limit is not None:
        assert memory_of(p, s.choice) <= p.memory_limit


def test_budget_that_does_not_bind_is_solved_exactly() -> None:
    p = random_problem(5, memory=True)
    p = dataclasses.replace(p, memory_limit=1e9)
    s = solve(p)
    assert (
        s.optimal and s.method.startswith("exact") and any("optimal under the budget too" in x for x in s.log)
    )


def test_binding_budget_uses_lagrangian_then_cp_sat() -> None:
    rng = np.random.default_rng(0)
    n, k = 12, 4
    cost = tuple(np.linspace(0.0, 1.0, k) + rng.random(k) * 0.1 for _ in range(n))  # cheap = memory-hungry
    mem = tuple(np.linspace(80.0, 10.0, k).round() for _ in range(n))
    edges = tuple(Edge(i, i + 1, rng.random((k, k))) for i in range(n - 1))
    p = SearchProblem(cost, edges, tuple(f"l{i}" for i in range(n)), memory=mem, memory_limit=500.0)
    s = solve(p, time_limit=20)
    assert any(x.startswith("lagrangian") for x in s.log)
    assert memory_of(p, s.choice) <= 500.0 and s.optimal
    exact_only = solve(p, method="exact")
    assert exact_only.objective >= s.objective * (1 - 1e-9) and exact_only.lower_bound <= s.objective


def test_infeasible_budget_names_least_memory() -> None:
    p = SearchProblem(
        (np.zeros(2), np.zeros(3)),
        (Edge(0, 1, np.zeros((2, 3))),),
        ("wte", "mlp"),
        memory=(np.array([4096.0, 2048.0]), np.array([3072.0, 1024.0, 2048.0])),
        memory_limit=3000.0,
    )
    with pytest.raises(InfeasibleError, match=r"3\.00 KiB \(3072 B\)") as info:
        solve(p)
    assert "more devices" in str(info.value)


def test_no_finite_plan_names_the_cycle() -> None:
    differ = np.array([[inf, 0.0], [0.0, inf]])
    p = SearchProblem(
        tuple(np.zeros(2) for _ in range(4)),
        (Edge(0, 1, differ), Edge(1, 2, differ), Edge(2, 0, differ), Edge(2, 3, np.zeros((2, 2)))),
        ("q", "k", "v", "out"),
    )
    with pytest.raises(InfeasibleError, match="q, k, v"):
        solve(p)


def test_treewidth_cap_falls_back_to_cp_sat() -> None:
    rng = np.random.default_rng(0)
    n, k = 6, 3
    edges = tuple(Edge(u, v, rng.random((k, k))) for u in range(n) for v in range(u + 1, n))
    p = SearchProblem(tuple(rng.random(k) for _ in range(n)), edges, tuple(map(str, range(n))))
    s = solve(p, max_factor_size=10, time_limit=20)
    assert s.method == "cp-sat" and s.optimal and close(s.objective, _want(p), 1e-7)
    with pytest.raises(AutoshardError, match="method='exact' cannot"):
        solve(p, method="exact", max_factor_size=10)


def test_propagate_method_and_hint() -> None:
    p = random_problem(11, max_nodes=9)
    s = solve(p, method="propagate")
    assert s.method == "propagate" and not s.optimal and s.lower_bound <= _want(p) <= s.objective
    hinted = solve(p, method="ilp", hint=s.choice, time_limit=20)
    assert hinted.optimal and close(hinted.objective, _want(p), 1e-7)


def test_same_problem_same_plan() -> None:
    p = random_problem(21, max_nodes=9, memory=True)
    for method in ("auto", "ilp"):
        a, b = solve(p, method=method), solve(p, method=method)
        assert a.choice == b.choice and a.objective == b.objective


def test_choice_is_on_original_nodes_and_strategies() -> None:
    p = SearchProblem(
        (np.array([inf, 5.0, 0.0]), np.array([0.0, 1.0]), np.array([1.0, 0.0])),
        (
            Edge(0, 1, np.array([[0.0, 0.0], [0.0, 3.0], [9.0, 0.0]])),
            Edge(2, 1, np.array([[0.0, 0.0], [2.0, 0.0]])),
        ),
        ("a", "b", "c"),
        allowed=(None, None, np.array([False, True])),
    )
    s = solve(p)
    assert s.choice == (2, 1, 1) and s.objective == 1.0 + 0.0 + 0.0 + 0.0
