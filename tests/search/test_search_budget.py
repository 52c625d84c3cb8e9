"""Binding memory budgets: Lagrangian bound and plan, fixing never drops the optimum, the dispatcher's path."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from search_cases import close, random_problem, transformer_problem

from autoshard.errors import InfeasibleError
from autoshard.search import SearchProblem, brute_force, budget, memory_of, solve
from autoshard.search.budget import Lagrange, fixing_masks, lagrangian_sweep
from autoshard.search.exact import ExactSolver, min_memory_plan
from autoshard.search.problem import evaluate, pairwise_form


def _binding(seed: int) -> SearchProblem | None:
    """A random problem whose budget rules out the unconstrained optimum (None when it does not)."""
    p = random_problem(seed, max_nodes=8, memory=True, inf_fraction=0.15 if seed % 2 else 0.0)
    try:
        free = brute_force(dataclasses.replace(p, memory_limit=None))
        brute_force(p)
    except InfeasibleError:
        return None
    return p if memory_of(p, free.choice) > p.memory_limit else None  # type: ignore[operator]


@pytest.mark.parametrize("seed", range(40))
def test_lagrangian_bound_plan_and_fixing_keep_the_optimum(seed: int) -> None:
    p = _binding(seed + 2000)
    if p is None:
        return
    want = brute_force(p).objective
    ex = ExactSolver(pairwise_form(p))
    least, _ = min_memory_plan(p)
    plan, value = ex.solve()
    lag = lagrangian_sweep(
        ex, p, Lagrange(least, evaluate(p, least), value, 0.0), lam0=value / memory_of(p, plan)
    )
    assert lag.bound <= want * (1 + 1e-9) + 1e-12 <= lag.cost * (1 + 2e-9) + 2e-12
    assert memory_of(p, lag.plan) <= p.memory_limit  # type: ignore[operator]
    keep = fixing_masks(ex, p, lag)
    assert all(k[s] for k, s in zip(keep, lag.plan, strict=True))
    fixed = dataclasses.replace(p, allowed=tuple(keep))
    assert close(brute_force(fixed).objective, want)


@pytest.mark.parametrize("seed", range(30))
def test_budgeted_solve_matches_brute_force_and_repeats(seed: int) -> None:
    p = _binding(seed + 3000)
    if p is None:
        return
    s = solve(p)
    assert s.optimal and close(s.objective, brute_force(p).objective, 1e-7)
    assert memory_of(p, s.choice) <= p.memory_limit  # type: ignore[operator]
    assert solve(p).choice == s.choice


@pytest.mark.parametrize("fraction", [0.1, 0.5, 0.9])
def test_tight_budgets_on_a_transformer_layer(fraction: float) -> None:
    p = transformer_problem(1, 6, memory=True)
    free = solve(p)
    _, least_mem = min_memory_plan(p)
    budget = math.floor(least_mem + fraction * (memory_of(p, free.choice) - least_mem))
    q = dataclasses.replace(p, memory_limit=float(budget))
    s = solve(q, time_limit=20)
    assert s.optimal and memory_of(q, s.choice) <= budget
    assert s.objective >= free.objective * (1 - 1e-12)
    ilp = solve(q, method="ilp", time_limit=20)  # CP-SAT on the whole reduced problem agrees
    assert close(ilp.objective, s.objective, 1e-7)


def test_fixing_ceiling_from_a_better_known_plan() -> None:
    p = next(q for q in map(_binding, range(2000, 2100)) if q is not None)
    ex = ExactSolver(pairwise_form(p))
    least, _ = min_memory_plan(p)
    lag = Lagrange(least, evaluate(p, least), ex.solve()[1], 0.0)
    loose = fixing_masks(ex, p, lag)
    best = brute_force(p)
    tight = fixing_masks(ex, p, lag, ceiling=best.objective)
    assert all((t <= k).all() for t, k in zip(tight, loose, strict=True))
    assert all(t[s] for t, s in zip(tight, best.choice, strict=True))


@pytest.mark.parametrize("seed", range(30))
def test_ceiling_prunes_only_problems_whose_optimum_reaches_it(seed: int) -> None:
    from autoshard.search import BoundExceeded

    p = _binding(seed + 4000)
    if p is None:
        return
    want = brute_force(p).objective
    for ceiling in (want * 0.999, want * (1 + 1e-9), want * 1.5):
        try:
            s = solve(p, ceiling=ceiling)
        except BoundExceeded as e:
            assert e.bound <= want * (1 + 1e-9) + 1e-12 and e.bound >= ceiling  # a true bound, at the ceiling
            assert want >= ceiling * (1 - 1e-9)
            continue
        assert close(s.objective, want, 1e-7)


def test_dual_search_reaches_the_best_lagrangian_bound_in_few_probes() -> None:
    # the cutting planes stop where g(lambda) reaches the crossing of the lowest rising and falling lines:
    # that is max g, which bisection approaches only to its tolerance
    p = transformer_problem(1, 6, memory=True)
    free = solve(p)
    _, least_mem = min_memory_plan(p)
    q = dataclasses.replace(
        p, memory_limit=float(math.floor(least_mem + 0.5 * (memory_of(p, free.choice) - least_mem)))
    )
    ex = ExactSolver(pairwise_form(q))
    least, _ = min_memory_plan(q)
    plan, value = ex.solve()
    lag = lagrangian_sweep(ex, q, Lagrange(least, evaluate(q, least), value, 0.0), lam0=1.0, seeds=(plan,))
    assert lag.solves <= 12
    want = brute_force(q) if math.prod(q.sizes) <= 10**6 else solve(q)
    assert lag.bound <= want.objective * (1 + 1e-9) <= lag.cost * (1 + 1e-9)
    # no multiplier bounds higher: g at a grid of lambdas around the best one stays at or below it
    for f in (0.25, 0.5, 0.9, 1.1, 2.0, 4.0):
        lam = lag.lam * f
        _, v = ex.solve([c + lam * m for c, m in zip(ex.form.unary, q.memory, strict=True)])  # type: ignore[arg-type]
        assert v - lam * q.memory_limit <= lag.bound * (1 + 1e-9) + 1e-12  # type: ignore[operator]


@pytest.mark.parametrize("method", ["exact", "auto"])
@pytest.mark.parametrize("fraction", [0.2, 0.6])
def test_too_wide_budgeted_problem_solved_by_reduced_relaxations(
    monkeypatch: pytest.MonkeyPatch, method: str, fraction: float
) -> None:
    # the budgeted problem "cannot be eliminated" (as the 405B stage problem cannot); each relaxed problem
    # without the budget still reduces and solves exactly: a fitting plan with a true bound, optimal only
    # when the dual closes, and CP-SAT ("auto") closing the rest
    import sys

    dispatch = sys.modules[
        "autoshard.search.solve"
    ]  # the module (the package exports the function by its name)
    p = transformer_problem(1, 6, memory=True)
    free = solve(p)
    _, least_mem = min_memory_plan(p)
    limit = float(math.floor(least_mem + fraction * (memory_of(p, free.choice) - least_mem)))
    q = dataclasses.replace(p, memory_limit=limit)
    want = solve(q, time_limit=20)
    monkeypatch.setattr(dispatch, "exact_solver", lambda run, cap, wide=None: None)
    s = solve(q, method=method, time_limit=20)  # type: ignore[arg-type]
    assert memory_of(q, s.choice) <= limit
    assert s.lower_bound <= want.objective * (1 + 1e-9) + 1e-12 <= s.objective * (1 + 2e-9) + 2e-12
    assert any("lagrangian by reduction" in line for line in s.log)
    if s.optimal or method == "auto":
        assert close(s.objective, want.objective, 1e-7)


@pytest.mark.parametrize("seed", range(30))
def test_repair_makes_a_plan_fit_and_never_claims_more(seed: int) -> None:
    from autoshard.search.repair import repair

    p = _binding(seed + 5000)
    if p is None:
        return
    free = brute_force(dataclasses.replace(p, memory_limit=None)).choice  # over the budget
    fixed = repair(p, free)
    if fixed is None:
        return
    assert memory_of(p, fixed) <= p.memory_limit  # type: ignore[operator]
    assert evaluate(p, fixed) >= brute_force(p).objective * (1 - 1e-12)  # a plan, so never below the optimum


@pytest.mark.parametrize("wide", [False, True])
def test_budgeted_plan_does_not_depend_on_the_time_limit(monkeypatch: pytest.MonkeyPatch, wide: bool) -> None:
    # the Lagrangian sweeps end by their probe count, never by the clock: a time limit that is spent before
    # the first probe (as on a loaded machine) gives the same plan, bound and probes as a generous one
    import sys

    p = transformer_problem(1, 6, memory=True)
    free = solve(p)
    _, least_mem = min_memory_plan(p)
    limit = float(math.floor(least_mem + 0.4 * (memory_of(p, free.choice) - least_mem)))
    q = dataclasses.replace(p, memory_limit=limit)
    if wide:  # the wide path (search/wide.py), as the 405B stage takes it
        monkeypatch.setattr(
            sys.modules["autoshard.search.solve"], "exact_solver", lambda run, cap, wide=None: None
        )
    slow, hurried = solve(q, method="exact", time_limit=60), solve(q, method="exact", time_limit=1e-9)
    assert (hurried.choice, hurried.objective, hurried.lower_bound) == (
        slow.choice,
        slow.objective,
        slow.lower_bound,
    )
    sweeps = [line for line in slow.log if line.startswith("lagrangian")]
    assert sweeps and sweeps == [line for line in hurried.log if line.startswith("lagrangian")]


@pytest.mark.parametrize("seed", range(8))
def test_climbing_the_gap_finds_the_optimum_fixing_at_the_whole_gap_finds(
    monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    """Fixing first for plans within 0.1 and 0.3 of the Lagrangian gap (solve._climb) is exact: the same
    optimum as fixing at the whole gap alone, on budgets where the gap is open; a rung proven empty only
    raises the bound."""
    import sys

    module = sys.modules["autoshard.search.solve"]
    p = transformer_problem(seed, 6, memory=True)
    free = solve(p)
    _, least_mem = min_memory_plan(p)
    for fraction in (0.2, 0.5):
        limit = float(math.floor(least_mem + fraction * (memory_of(p, free.choice) - least_mem)))
        q = dataclasses.replace(p, memory_limit=limit)
        climbed = solve(q, method="exact")
        with monkeypatch.context() as m:
            m.setattr(module, "_RUNGS", ())
            whole = solve(q, method="exact")
        assert climbed.optimal == whole.optimal
        assert close(climbed.objective, whole.objective, 1e-12)
        assert memory_of(q, climbed.choice) <= limit
        assert climbed.lower_bound <= climbed.objective * (1 + 1e-12)


def test_dual_search_early_stop_waits_for_a_fitting_minimiser() -> None:
    # The least-memory plan (2) costs 100, the optimum (1) costs 1, the plan without the budget (0) is just
    # over it.  The first crossing lies at 1.64, within a tenth of the gap anchored on the starting plan
    # (100 - 0): the old stop fired before any probe and returned the plan at 100.  The gap is now measured
    # once a probe's minimiser fits: the sweep goes on to the optimum, with a bound within a tenth of that
    # gap of max g (1/11, where the lines of plans 0 and 1 cross).
    p = SearchProblem(
        (np.array([0.0, 1.0, 100.0]),), (), ("a",), memory=(np.array([6.1, 5.0, 0.0]),), memory_limit=6.0
    )
    ex = ExactSolver(pairwise_form(p))
    lag = lagrangian_sweep(ex, p, Lagrange((2,), 100.0, 0.0, 0.0), lam0=1.0, seeds=((0,),), tolerance=0.1)
    assert lag.solves >= 1
    assert lag.plan == (1,) and lag.cost == 1.0
    assert 0.0 <= lag.bound <= 1.0 / 11.0 <= lag.bound + 0.1 * (lag.cost - lag.bound)


@pytest.mark.parametrize("seed", [0, 4, 24, 61, 97])
def test_far_starting_line_changes_only_the_probes(monkeypatch: pytest.MonkeyPatch, seed: int) -> None:
    # lam0 and 4 lam0 probed before a least-memory line's far crossing (seeds 24, 61 and 97 have one): the
    # same max g (tolerance 0)
    p = _binding(seed + 2000)
    if p is None:
        return
    ex = ExactSolver(pairwise_form(p))
    least, _ = min_memory_plan(p)
    plan, value = ex.solve()
    lam0 = value / memory_of(p, plan)

    def sweep() -> Lagrange:
        return lagrangian_sweep(ex, p, Lagrange(least, evaluate(p, least), value, 0.0), lam0, seeds=(plan,))

    near = sweep()
    monkeypatch.setattr(budget, "_FAR", math.inf)
    far = sweep()
    assert near.bound == pytest.approx(far.bound, rel=1e-9, abs=1e-12)
    assert near.bound <= brute_force(p).objective * (1 + 1e-9)


@pytest.mark.parametrize("seed", [3, 5])  # 13 and 16 nodes left at the small cap, 4 at the large one
def test_relaxed_solves_fold_up_to_the_elimination_cap_with_the_same_minimum(seed: int) -> None:
    """Each relaxed problem of the wide path folds degree-2 nodes up to the elimination's own cap
    (search/wide.py): a minimiser of ``cost + lambda * memory`` of the same value whatever that cap, and as
    the whole problem's exact elimination."""
    from autoshard.search.wide import _relaxed_by_reduction

    p = transformer_problem(seed % 2 + 1, 4 + seed, memory=True)
    assert p.memory is not None
    p = dataclasses.replace(p, memory_limit=float(min_memory_plan(p)[1]) * 1.5)
    for lam in (0.0, 1e-3, 1e-1):
        tied = tuple(c + lam * m for c, m in zip(p.node_costs, p.memory, strict=True))
        whole = ExactSolver(pairwise_form(dataclasses.replace(p, node_costs=tied))).solve()[1]
        found = [_relaxed_by_reduction(p, cap)(lam) for cap in (300.0, 1e8)]
        assert found[1] is not None
        for plan, value in [f for f in found if f is not None]:  # (300: may be too wide to eliminate)
            assert close(value, whole, 1e-9)
            assert close(evaluate(p, plan) + lam * memory_of(p, plan), whole, 1e-9)
