"""Reparametrised fixing (search/diffusion.py) against brute force: the reparametrisation changes no plan's
total, its bound is a true one, fixing never loses a fitting plan at most the threshold, and the exact solve of
what is left is the optimum."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from autoshard.errors import InfeasibleError
from autoshard.search import brute_force, memory_of
from autoshard.search.diffusion import exact_below, fix, reparametrise
from autoshard.search.problem import SearchProblem, evaluate
from tests.search.search_cases import random_problem

SEEDS = range(40)


def _plans(problem: SearchProblem) -> list[tuple[int, ...]]:
    return [tuple(p) for p in itertools.product(*(range(s) for s in problem.sizes))]


def _fitting(problem: SearchProblem) -> list[tuple[tuple[int, ...], float]]:
    assert problem.memory_limit is not None
    out = []
    for plan in _plans(problem):
        cost = evaluate(problem, plan)
        if math.isfinite(cost) and memory_of(problem, plan) <= problem.memory_limit:
            out.append((plan, cost))
    return out


@pytest.mark.parametrize("seed", SEEDS)
def test_reparametrisation_keeps_every_plan_and_bounds_the_optimum(seed: int) -> None:
    problem = random_problem(seed, max_nodes=6, memory=True, masks=True)
    assert problem.memory is not None and problem.memory_limit is not None
    lam = float(np.random.default_rng(seed).random()) * 0.05
    rep = reparametrise(problem, lam)
    for plan in _plans(problem)[:200]:
        cost = evaluate(problem, plan)
        if not math.isfinite(cost):
            continue
        total = sum(float(rep.unary[i][s]) for i, s in enumerate(plan))
        total += sum(float(m[plan[a], plan[b]]) for (a, b), m in rep.pairs.items())
        relaxed = cost + lam * (memory_of(problem, plan) - problem.memory_limit)
        assert total - lam * problem.memory_limit == pytest.approx(relaxed, rel=1e-9, abs=1e-9)
    fitting = _fitting(problem)
    if fitting:
        assert rep.bound <= min(c for _, c in fitting) + 1e-9


@pytest.mark.parametrize("seed", SEEDS)
def test_fixing_keeps_every_fitting_plan_at_most_the_threshold(seed: int) -> None:
    problem = random_problem(seed, max_nodes=6, memory=True)
    fitting = _fitting(problem)
    if not fitting:
        return
    costs = sorted(c for _, c in fitting)
    upper = costs[len(costs) // 3]  # a fitting plan's cost, above the optimum on most seeds
    lam = 0.02
    fixed = fix(problem, reparametrise(problem, lam), upper)
    assert fixed.problem is not None  # the plans at most ``upper`` survive, so no node is emptied
    assert fixed.kept <= fixed.total
    for plan, cost in fitting:
        if cost <= upper:
            assert evaluate(fixed.problem, plan) == pytest.approx(cost)
            assert all(fixed.problem.allowed[i][s] for i, s in enumerate(plan))  # type: ignore[index]


def test_most_seeds_have_fitting_plans() -> None:
    """The parametrised tests return early on a seed where no plan fits: most seeds must exercise them."""
    fit = [s for s in SEEDS if _fitting(random_problem(s, max_nodes=7, memory=True, inf_fraction=0.1))]
    assert len(fit) >= 30, fit


def _below_against_brute(seed: int, work: float = 0.0) -> list[str] | None:
    """exact_below on a random problem, checked against brute force; its log (None: no plan fits).  With
    ``work``, odd seeds warm-start CP-SAT from the dearest fitting plan."""
    problem = random_problem(seed, max_nodes=7, memory=True, inf_fraction=0.1)
    fitting = _fitting(problem)
    if not fitting:
        return None
    costs = sorted(c for _, c in fitting)
    upper = costs[-1] + 1.0 if seed % 3 == 0 else costs[len(costs) // 2]
    hint = fitting[-1][0] if work and seed % 2 else None
    log: list[str] = []
    found, proven = exact_below(problem, 0.01 * (seed % 5), upper, log, work=work, hint=hint)
    assert proven, log  # these are small enough to enumerate, eliminate or solve by CP-SAT
    best = brute_force(problem).objective
    if best < upper * (1 - 1e-9):
        assert found is not None
        assert evaluate(problem, found) == pytest.approx(best, rel=1e-9)
        assert memory_of(problem, found) <= problem.memory_limit  # type: ignore[operator]
    else:
        assert found is None or evaluate(problem, found) >= best * (1 - 1e-9)
    return log


@pytest.mark.parametrize("seed", SEEDS)
def test_exact_below_is_the_optimum_below_the_threshold(seed: int) -> None:
    _below_against_brute(seed)


def test_no_fitting_plan_below_the_threshold_is_proven() -> None:
    problem = random_problem(3, max_nodes=6, memory=True)
    best = brute_force(problem).objective  # seed 3 has fitting plans (an InfeasibleError here fails the test)
    found, proven = exact_below(problem, lam=0.01, upper=best, log=[])
    assert proven and (found is None or evaluate(problem, found) >= best * (1 - 1e-9))


def test_the_wide_path_proves_the_optimum_the_dual_alone_leaves_open(monkeypatch: pytest.MonkeyPatch) -> None:
    """On 60 random budgeted problems the Lagrangian path by reduction proves 28 optimal by its dual alone;
    with reparametrised fixing every one, each equal to brute force."""
    import autoshard.search.wide as wide
    from tests.search.test_search_neighbourhood import _brute, _by_reduction

    def proven() -> int:
        count = 0
        for seed in range(60):
            problem = random_problem(seed, max_nodes=7, memory=True)
            best = _brute(problem)
            if not math.isfinite(best):
                continue
            sol = _by_reduction(problem)
            if sol.optimal:
                assert sol.objective == pytest.approx(best, rel=1e-9, abs=1e-12)
                count += 1
        return count

    with_fixing = proven()
    monkeypatch.setattr(wide, "_close_by_fixing", lambda *args, **kwargs: None)
    assert proven() < with_fixing == 60


@pytest.mark.parametrize("seed", SEEDS)
def test_fixing_below_a_threshold_proves_a_bound_with_peak_terms(seed: int) -> None:
    """The wide path's ladder (search/wide.py): ``(None, True)`` from fixing below ``upper`` means no plan
    that fits with its own peak costs less than ``upper`` (it becomes the bound), against brute force."""
    import dataclasses
    import time

    from autoshard.search.problem import peak_floor
    from autoshard.search.reduce import reduce_problem
    from autoshard.search.run import Run
    from autoshard.search.wide import _close_by_fixing

    base = random_problem(seed + 300, max_nodes=6, memory=True)
    rng = np.random.default_rng(seed)
    assert base.memory_limit is not None
    peak = tuple(rng.integers(0, 30, s).astype(float) for s in base.sizes)
    full = dataclasses.replace(base, peak=peak, memory_limit=base.memory_limit + 15.0)
    try:
        best = brute_force(full).objective
    except InfeasibleError:
        return
    plain = dataclasses.replace(base, memory_limit=base.memory_limit + 15.0 - peak_floor(full))
    run = Run(plain, [reduce_problem(plain)], time.perf_counter(), 60.0)
    anyone = tuple(0 for _ in plain.sizes)
    seen = 0
    for upper in (best * 0.97, best * (1 - 1e-6), best * 1.05 + 1e-3):
        got = _close_by_fixing(run, 0.01 * (seed % 5), anyone, peak, upper=upper)
        if got is None:
            continue  # not proven: nothing claimed
        found, proven = got
        assert proven or found is not None
        if found is None:
            assert best >= upper * (1 - 1e-9)  # the claimed bound holds
            seen += 1
        else:
            assert memory_of(full, found) <= full.memory_limit  # type: ignore[operator]
            assert evaluate(full, found) >= best * (1 - 1e-9)
            assert not proven or evaluate(full, found) == pytest.approx(best, rel=1e-9)
    assert seen >= 1 or best == 0.0


def _cpsat_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """What fixing leaves goes to CP-SAT: no enumeration, no Pareto elimination (the 405B stage's residual)."""
    import autoshard.search.diffusion as diffusion

    monkeypatch.setattr(diffusion, "_ENUMERATE", 0)
    monkeypatch.setattr(diffusion, "pareto_below", lambda *args, **kwargs: (None, False))


def test_cpsat_on_what_fixing_leaves_is_the_optimum_below_the_threshold(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """exact_below's CP-SAT step (one worker, a work limit, warm-started where a hint is given) against brute
    force on 40 random budgeted problems: every claim true, and CP-SAT decides at least 30 of them."""
    _cpsat_only(monkeypatch)
    logs = [_below_against_brute(seed, work=10.0) for seed in SEEDS]
    decided = sum(any("cp-sat optimum" in line for line in log) for log in logs if log is not None)
    assert decided >= 30, decided


def test_the_wide_path_with_cpsat_on_the_residual_proves_the_optimum(monkeypatch: pytest.MonkeyPatch) -> None:
    """The wide path with peak terms (search/wide.py), its fixing's residual solved by CP-SAT only: on 60
    random budgeted problems every one that has a fitting plan is proven optimal and equals brute force, and
    CP-SAT's step decides at least 30 of them (the dual alone closes the others)."""
    import dataclasses

    from autoshard.search.problem import peak_floor
    from tests.search.test_search_neighbourhood import _brute, _by_reduction

    _cpsat_only(monkeypatch)
    proven = by_cpsat = feasible = 0
    for seed in range(60):
        base = random_problem(seed + 500, max_nodes=7, memory=True)
        rng = np.random.default_rng(seed)
        assert base.memory_limit is not None
        peak = tuple(rng.integers(0, 30, s).astype(float) for s in base.sizes)
        full = dataclasses.replace(base, peak=peak, memory_limit=base.memory_limit + 15.0)
        best = _brute(full)
        if not math.isfinite(best):
            continue
        feasible += 1
        plain = dataclasses.replace(base, memory_limit=base.memory_limit + 15.0 - peak_floor(full))
        sol = _by_reduction(plain, peak)
        assert sol.lower_bound <= best * (1 + 1e-9) + 1e-12
        if sol.optimal and memory_of(full, sol.choice) <= full.memory_limit:  # type: ignore[operator]
            assert sol.objective == pytest.approx(best, rel=1e-9, abs=1e-12)
            proven += 1
            by_cpsat += any("cp-sat optimum" in line for line in sol.log)
    assert proven == feasible and by_cpsat >= 30, (proven, feasible, by_cpsat)
