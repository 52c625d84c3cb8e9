"""The recompute-count search (problem/mix.py) is exact: on random budgeted problems (sum and peak terms,
costs affine in the share ``k / N``) the count and objective equal brute force over every ``k``, a ceiling
given to the solver prunes only what cannot beat it, and the Pareto elimination's multiplier prune keeps
the optimum."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from autoshard.errors import InfeasibleError
from autoshard.problem.mix import best_count, least_fitting
from autoshard.search import BoundExceeded, Edge, SearchProblem, brute_force, solve
from autoshard.search.pareto import pareto_plan
from autoshard.search.problem import evaluate, memory_lower_bound, memory_of
from tests.search.search_cases import close, random_problem

BLOCKS = 6


def _pair(seed: int) -> tuple[SearchProblem, SearchProblem]:
    """Share 0 and share 1 of one problem: recomputing adds cost and drops memory, strategy by strategy."""
    p0 = random_problem(seed, max_nodes=6, memory=True, inf_fraction=0.1 if seed % 4 == 1 else 0.0)
    rng = np.random.default_rng(seed + 7)
    assert p0.memory is not None and p0.memory_limit is not None
    p1 = dataclasses.replace(
        p0,
        node_costs=tuple(c + rng.random(c.size) * 0.6 for c in p0.node_costs),
        edges=tuple(Edge(e.u, e.v, e.cost + rng.random(e.cost.shape) * 0.2) for e in p0.edges),
        memory=tuple(np.floor(m * rng.uniform(0.1, 1.0, m.size)) for m in p0.memory),  # whole bytes
    )
    if seed % 2:  # half the cases with a largest temporary (a max term) in the budget
        peak = tuple(np.round(rng.uniform(0, 40, c.size)) for c in p0.node_costs)
        p0, p1 = (dataclasses.replace(p, peak=peak) for p in (p0, p1))
    # a budget between the least memory with every block recomputed and with none: small k do not fit
    low, high = memory_lower_bound(p1), memory_lower_bound(p0)
    # memory at k / N is fractional: a limit halfway between integers keeps float rounding off the boundary
    limit = float(np.floor(low + (high - low) * rng.uniform(0.2, 1.0))) + 0.5
    return dataclasses.replace(p0, memory_limit=limit), dataclasses.replace(p1, memory_limit=limit)


def _mix(a: np.ndarray, b: np.ndarray, t: float) -> np.ndarray:
    with np.errstate(invalid="ignore"):
        return np.where(np.isfinite(a) & np.isfinite(b), a + t * (b - a), np.inf)


def _at(p0: SearchProblem, p1: SearchProblem, k: int) -> SearchProblem:
    t = k / BLOCKS
    return dataclasses.replace(
        p1,
        node_costs=tuple(_mix(a, b, t) for a, b in zip(p0.node_costs, p1.node_costs, strict=True)),
        edges=tuple(Edge(a.u, a.v, _mix(a.cost, b.cost, t)) for a, b in zip(p0.edges, p1.edges, strict=True)),
        memory=tuple(a + t * (b - a) for a, b in zip(p0.memory, p1.memory, strict=True)),  # type: ignore[arg-type]
    )


def _every(p0: SearchProblem, p1: SearchProblem) -> dict[int, float]:
    out = {}
    for k in range(1, BLOCKS):
        try:
            out[k] = brute_force(_at(p0, p1, k)).objective
        except InfeasibleError:
            continue
    return out


@pytest.mark.parametrize("seed", range(40))
def test_the_count_equals_brute_force_over_every_k(seed: int) -> None:
    p0, p1 = _pair(seed)
    every = _every(p0, p1)
    # the incumbent: every block recomputed (as the planner's uniform policy), or nothing when it does not fit
    try:
        incumbent = brute_force(p1).objective
    except InfeasibleError:
        incumbent = math.inf
    if seed % 5 == 0 and every:  # an incumbent no count beats: nothing is returned
        incumbent = min(every.values())
    found = best_count(p0, p1, BLOCKS, solve, incumbent)
    better = {k: v for k, v in every.items() if v < incumbent * (1 - 1e-9)}
    if not better:
        assert found is None or close(found[1].objective, incumbent)
        return
    assert found is not None
    k, solution = found
    assert close(solution.objective, min(better.values())) and close(every[k], solution.objective)
    assert solution.optimal


@pytest.mark.parametrize("seed", range(40))
def test_the_least_fitting_count_is_the_least_k_whose_memory_floor_fits(seed: int) -> None:
    p0, p1 = _pair(seed)
    first = least_fitting(p0, p1, BLOCKS)
    want = next(
        (k for k in range(1, BLOCKS) if memory_lower_bound(_at(p0, p1, k)) <= p1.memory_limit),  # type: ignore[operator]
        BLOCKS,
    )
    assert first == want
    assert all(k >= first for k in _every(p0, p1))  # nothing below it fits


@pytest.mark.parametrize("seed", range(40))
def test_a_ceiling_prunes_only_what_cannot_beat_it(seed: int) -> None:
    """``solve(ceiling=c)``: BoundExceeded only when the optimum is at least ``c``, else the optimum."""
    p, _ = _pair(seed)
    try:
        want = brute_force(p).objective
    except InfeasibleError:
        return
    for ceiling in (want * 0.98, want * 1.0001, want * 1.05):
        try:
            got = solve(p, ceiling=ceiling)
        except BoundExceeded as e:
            assert want >= ceiling * (1 - 1e-9) and e.bound <= want * (1 + 1e-9)
            continue
        assert close(got.objective, want)


@pytest.mark.parametrize("seed", range(40))
def test_the_pareto_prune_with_a_multiplier_keeps_the_optimum(seed: int) -> None:
    """Any multiplier ``lam >= 0`` (the sweep's, or an arbitrary one) leaves the elimination exact."""
    p = random_problem(seed, max_nodes=7, memory=True, inf_fraction=0.1 * (seed % 2))
    try:
        best = brute_force(p).objective
    except InfeasibleError:
        return
    for lam in (0.0, 1e-3, 0.05, 3.0):
        for upper in (best, best * 1.2):
            found = pareto_plan(p, upper=upper, lam=lam)
            assert found is not None and close(evaluate(p, found), best, rel=1e-12)
            assert memory_of(p, found) <= p.memory_limit  # type: ignore[operator]
        assert pareto_plan(p, upper=best * 0.9 - 1e-3, lam=lam) is None


@pytest.mark.parametrize("seed", range(40))
def test_a_ceiling_with_a_multiplier_prunes_only_what_cannot_beat_it(seed: int) -> None:
    """``solve(ceiling=c, multiplier=lam)`` tries ``lam``'s Lagrangian bound first: BoundExceeded only when
    every fitting plan costs at least ``c`` (also when none fits), else the optimum."""
    p, _ = _pair(seed)
    try:
        want = brute_force(p).objective
    except InfeasibleError:
        want = math.inf
    for lam in (1e-3, 0.05, 3.0):
        for ceiling in (want * 0.98, want * 1.0001, want * 1.05) if math.isfinite(want) else (1.0, 1e9):
            try:
                got = solve(p, ceiling=ceiling, multiplier=lam)
            except BoundExceeded as e:
                assert want >= ceiling * (1 - 1e-9) and e.bound <= want * (1 + 1e-9)
                continue
            except InfeasibleError:
                assert not math.isfinite(want)
                continue
            assert close(got.objective, want)
