"""Elimination orders and cutset conditioning: valid orders, the best heuristic kept, exactness, the cap."""

from __future__ import annotations

import math

import numpy as np
import pytest
from search_cases import close, random_problem, transformer_problem

from autoshard.errors import InfeasibleError
from autoshard.search import brute_force
from autoshard.search.exact import ExactSolver
from autoshard.search.order import HEURISTICS, FactorCapExceeded, greedy_order, plan_elimination
from autoshard.search.problem import pairwise_form


def _random_graph(seed: int, n: int = 12) -> tuple[list[set[int]], list[int]]:
    rng = np.random.default_rng(seed)
    adj: list[set[int]] = [set() for _ in range(n)]
    for _ in range(2 * n):
        u, v = (int(x) for x in rng.choice(n, 2, replace=False))
        adj[u].add(v)
        adj[v].add(u)
    return adj, [int(x) for x in rng.integers(2, 30, n)]


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("heuristic", HEURISTICS)
def test_greedy_orders_are_valid_eliminations(seed: int, heuristic: str) -> None:
    adj, sizes = _random_graph(seed)
    steps = greedy_order(range(len(adj)), adj, sizes, heuristic)
    assert sorted(s.var for s in steps) == list(range(len(adj)))
    graph = [set(a) for a in adj]
    for step in steps:  # each step meets exactly the neighbours left in the (filled-in) graph
        assert step.rest == tuple(sorted(graph[step.var]))
        for a in step.rest:
            graph[a] |= set(step.rest) - {a}
            graph[a].discard(step.var)
        graph[step.var] = set()


@pytest.mark.parametrize("seed", range(10))
def test_plan_keeps_the_best_heuristic(seed: int) -> None:
    adj, sizes = _random_graph(seed)
    plan = plan_elimination(range(len(adj)), adj, sizes, cap=1e30)
    for heuristic in HEURISTICS:
        steps = greedy_order(range(len(adj)), adj, sizes, heuristic)
        largest = max(sizes[s.var] * math.prod(sizes[w] for w in s.rest) for s in steps)
        assert plan.largest <= largest
    assert plan.conditioned == ()


def test_weighted_min_fill_wins_when_sizes_differ() -> None:
    # A 4-cycle of big nodes (a, b, c, d) with a small node x joined to a and c. Eliminating x first costs
    # nothing but adds the fill edge a-c; min-fill ties x with b and d and breaks on table size; weighted
    # min-fill prices fill by the domains it joins.  Whatever each picks, the plan is the best of them.
    adj = [{1, 3, 4}, {0, 2}, {1, 3, 4}, {0, 2}, {0, 2}]
    sizes = [40, 40, 40, 40, 2]
    plan = plan_elimination(range(5), adj, sizes, cap=1e30)
    assert plan.largest <= 40 * 40 * 40


def test_conditioning_example_k4() -> None:
    adj = [[1, 2, 3], [0, 2, 3], [0, 1, 3], [0, 1, 2]]
    plan = plan_elimination(range(4), adj, [10] * 4, cap=1e3)
    assert plan.conditioned == (0,) and plan.largest == 1000 and plan.work == 10 * (1000 + 100 + 10)
    with pytest.raises(FactorCapExceeded, match="even after conditioning on 2"):
        plan_elimination(range(4), adj, [10] * 4, cap=10)
    with pytest.raises(FactorCapExceeded, match="in all"):
        plan_elimination(range(4), adj, [10] * 4, cap=1e3, max_work=1e3)


@pytest.mark.parametrize("seed", range(30))
def test_conditioning_matches_brute_force(seed: int) -> None:
    p = random_problem(seed + 300, max_nodes=8, inf_fraction=0.2 if seed % 3 == 0 else 0.0)
    try:
        want = brute_force(p).objective
    except InfeasibleError:
        want = math.inf
    form = pairwise_form(p)
    full = ExactSolver(form)
    if full.plan is None:
        return  # a forest: tree DP, nothing to condition
    cap = max(1, full.plan.largest // 3)
    try:
        cond = ExactSolver(form, cap)
    except FactorCapExceeded:
        return
    _, value = cond.solve()
    assert close(value, want) and close(full.solve()[1], want)
    assert cond.plan is None or cond.plan.largest <= cap  # tree components are never capped


@pytest.mark.parametrize("seed", range(4))
def test_conditioning_equals_plain_elimination_on_a_transformer_layer(seed: int) -> None:
    p = transformer_problem(seed, 5)
    form = pairwise_form(p)  # unreduced: the width-4 structure with the wraparound and the RoPE tables
    plain = ExactSolver(form)
    conditioned = ExactSolver(form, max_factor_size=plain.largest_factor // 5)
    assert conditioned.conditioned and not plain.conditioned
    assert conditioned.largest_factor < plain.largest_factor
    c0, v0 = plain.solve()
    c1, v1 = conditioned.solve()
    assert close(v0, v1) and c0 == c1
    mm0, mm1 = plain.min_marginals(), conditioned.min_marginals()
    assert all(np.allclose(a, b) for a, b in zip(mm0, mm1, strict=True))
