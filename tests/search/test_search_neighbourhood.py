"""The budgeted path for problems too wide to eliminate with their memory terms (Lagrangian by reduction,
multipliers probed from the cost scale down, neighbourhood re-solves), against brute force: every plan fits
(its peak included), every stated bound is at most the true optimum, every claim of optimality is true."""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np
import pytest

from autoshard.errors import InfeasibleError
from autoshard.search import brute_force, memory_of, reduce_problem, solve
from autoshard.search.budget import Lagrange, dual_search
from autoshard.search.exact import MAX_FACTOR_SIZE
from autoshard.search.neighbourhood import improve, neighbourhoods
from autoshard.search.problem import SearchProblem, evaluate
from autoshard.search.run import Run
from autoshard.search.wide import _relaxed_by_reduction, with_budget_by_reduction
from tests.search.search_cases import random_problem

SEEDS = range(60)


def _brute(problem: SearchProblem) -> float:
    try:
        return brute_force(problem).objective
    except InfeasibleError:
        return math.inf


def _by_reduction(problem: SearchProblem, peak: tuple[np.ndarray, ...] | None = None):
    red = reduce_problem(problem)
    run = Run(problem, [red], time.perf_counter(), 60.0)
    return with_budget_by_reduction(run, "exact", 1, MAX_FACTOR_SIZE, None, peak)


@pytest.mark.parametrize("seed", SEEDS)
def test_lagrangian_by_reduction_bounds_the_optimum(seed: int) -> None:
    problem = random_problem(seed, max_nodes=7, memory=True)
    best = _brute(problem)
    if not math.isfinite(best):
        with pytest.raises(InfeasibleError):
            _by_reduction(problem)
        return
    sol = _by_reduction(problem)
    assert problem.memory_limit is not None
    assert memory_of(problem, sol.choice) <= problem.memory_limit
    assert sol.lower_bound <= best * (1 + 1e-9) + 1e-12
    assert sol.objective >= best * (1 - 1e-9) - 1e-12
    if sol.optimal:
        assert math.isclose(sol.objective, best, rel_tol=1e-9, abs_tol=1e-12)


@pytest.mark.parametrize("seed", SEEDS)
def test_peak_aware_plans_fit_with_their_peak(seed: int) -> None:
    """With peak terms the whole solve (thresholds, the relaxation's early stop) stays honest."""
    base = random_problem(seed, max_nodes=6, memory=True)
    rng = np.random.default_rng(seed)
    peak = tuple(rng.integers(0, 30, s).astype(float) for s in base.sizes)
    assert base.memory_limit is not None
    problem = dataclasses.replace(base, peak=peak, memory_limit=base.memory_limit + 15.0)
    best = _brute(problem)
    try:
        sol = solve(problem, method="exact")
    except InfeasibleError:
        assert not math.isfinite(best)
        return
    assert problem.memory_limit is not None
    assert memory_of(problem, sol.choice) <= problem.memory_limit  # the peak counted
    assert sol.lower_bound <= best * (1 + 1e-9) + 1e-12 <= sol.objective * (1 + 2e-9) + 1e-12
    if sol.optimal:
        assert math.isclose(sol.objective, best, rel_tol=1e-9, abs_tol=1e-12)


@pytest.mark.parametrize("seed", SEEDS)
def test_descending_dual_search_bounds_the_optimum(seed: int) -> None:
    """Probing from the cost scale down (no unbudgeted solve first) proves only true bounds; a minimiser
    over the budget proves the budget binds."""
    problem = random_problem(seed, max_nodes=7, memory=True)
    best = _brute(problem)
    if not math.isfinite(best):
        return
    free = _brute(dataclasses.replace(problem, memory_limit=None))
    assert problem.memory is not None
    finite = tuple(
        np.where(np.isfinite(c), m, np.inf) for c, m in zip(problem.node_costs, problem.memory, strict=True)
    )
    zero = tuple(
        dataclasses.replace(e, cost=np.where(np.isfinite(e.cost), 0.0, np.inf)) for e in problem.edges
    )
    least = brute_force(dataclasses.replace(problem, node_costs=finite, edges=zero, memory_limit=None)).choice
    lag = Lagrange(least, evaluate(problem, least), -math.inf, 0.0)
    assert problem.memory_limit is not None
    relaxed = _relaxed_by_reduction(problem, MAX_FACTOR_SIZE)
    dual_search(relaxed, problem, lag, 1.0 / max(problem.memory_limit, 1.0), descend=True)
    assert lag.bound <= best * (1 + 1e-9) + 1e-12
    assert memory_of(problem, lag.plan) <= problem.memory_limit
    if lag.binding:
        assert best > free * (1 - 1e-12) or math.isclose(best, free)


@pytest.mark.parametrize("seed", SEEDS)
def test_neighbourhood_is_the_exact_optimum_of_the_neighbourhood(seed: int) -> None:
    problem = random_problem(seed, max_nodes=7, memory=True)
    assert problem.memory_limit is not None and problem.memory is not None
    rng = np.random.default_rng(seed + 1000)
    over = tuple(int(rng.integers(s)) for s in problem.sizes)
    try:
        fitting = brute_force(problem).choice
    except InfeasibleError:
        return
    found = improve(problem, over, fitting)
    if found is not None:
        assert memory_of(problem, found) <= problem.memory_limit
        assert evaluate(problem, found) < evaluate(problem, fitting)
    # every neighbourhood holds the fitting plan's differences, so nothing better than the optimum appears
    # and the optimum of the first neighbourhood (brute force) is what improve reaches at least
    _, free = (
        neighbourhoods(problem, over, fitting)[0]
        if neighbourhoods(problem, over, fitting)
        else ("", frozenset())
    )
    if not free:
        return
    masks = tuple(
        np.ones(s, bool) if i in free else np.arange(s) == over[i] for i, s in enumerate(problem.sizes)
    )
    local = _brute(dataclasses.replace(problem, allowed=masks))
    got = evaluate(problem, found) if found is not None else evaluate(problem, fitting)
    assert got <= local * (1 + 1e-9) + 1e-12
