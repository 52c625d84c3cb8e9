"""Hints from a similar problem change only the work of a budgeted solve: ``incumbent`` (a plan to start the
Lagrangian sweep from) and a ceiling's second multiplier probe (``solve(multiplier=, ceiling=)``)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import pytest
from search_cases import close, random_problem

from autoshard.errors import InfeasibleError
from autoshard.search import BoundExceeded, SearchProblem, brute_force, memory_of, solve
from autoshard.search.exact import ExactSolver


def _budgeted(seed: int) -> SearchProblem | None:
    p = random_problem(seed + 4000, max_nodes=8, memory=True)
    try:
        brute_force(p)
    except InfeasibleError:
        return None
    return p


@pytest.mark.parametrize("seed", range(24))
def test_incumbent_changes_nothing_but_the_work(seed: int) -> None:
    p = _budgeted(seed)
    if p is None:
        pytest.skip("nothing fits this draw")
    want = brute_force(p)
    plain = solve(p, method="exact")
    rng = np.random.default_rng(seed)
    other = tuple(int(rng.integers(s)) for s in p.sizes)  # fits or not: only a fitting one is used
    for incumbent in (want.choice, other, (0,)):  # (0,): the wrong length, ignored
        got = solve(p, method="exact", incumbent=incumbent)
        assert got.optimal == plain.optimal
        if got.optimal:
            assert close(got.objective, want.objective, 1e-7)
        assert got.lower_bound <= want.objective * (1 + 1e-9) + 1e-12
        assert p.memory_limit is None or memory_of(p, got.choice) <= p.memory_limit


@pytest.mark.parametrize("seed", range(24))
@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e3])
def test_ceiling_probes_never_prune_the_optimum(seed: int, scale: float) -> None:
    p = _budgeted(seed)
    if p is None:
        pytest.skip("nothing fits this draw")
    want = brute_force(p).objective
    lam = scale * max(want, 1e-9) / max(float(np.max(np.concatenate(p.memory or ()))), 1.0)
    above = want * (1 + 1e-6) + 1e-9  # no plan beats it, the optimum does: never pruned
    assert close(solve(p, multiplier=lam, ceiling=above).objective, want, 1e-7)
    try:  # under the optimum: pruned or solved, never with a bound above the optimum
        found = solve(p, multiplier=lam, ceiling=want * (1 - 1e-3))
    except BoundExceeded as e:
        assert e.bound <= want * (1 + 1e-9) + 1e-12
    else:
        assert close(found.objective, want, 1e-7)


def test_second_probe_goes_where_the_bound_rises(monkeypatch: pytest.MonkeyPatch) -> None:
    """One node: costs 0, 1, 5, memory 9, 5, 1, budget 6; ``g(lam) = min(9 lam, 1 + 5 lam, 5 + lam) - 6 lam``
    peaks at 0.75 (lam = 1/4).  At lam = 1 the minimiser fits and g = 0: the second probe, at 1/4, prunes
    a ceiling of 0.5 with no third solve."""
    p = SearchProblem(
        (np.array([0.0, 1.0, 5.0]),), (), ("a",), memory=(np.array([9.0, 5.0, 1.0]),), memory_limit=6.0
    )
    calls: list[int] = []
    real = ExactSolver.solve

    def counted(self: ExactSolver, unary: Any = None) -> Any:
        calls.append(1)
        return real(self, unary)

    monkeypatch.setattr(ExactSolver, "solve", counted)
    with pytest.raises(BoundExceeded) as e:
        solve(p, multiplier=1.0, ceiling=0.5)
    assert math.isclose(e.value.bound, 0.75) and len(calls) == 2
    calls.clear()
    assert solve(dataclasses.replace(p), multiplier=1.0).objective == 1.0  # no ceiling: no probe first


def _too_wide(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every budgeted problem "cannot be eliminated" (as LLaMA-3-70B's zigzag layout cannot): the solver's
    ``wide`` hook runs, as the elimination planner runs it before its conditioning search; returns a list
    that grows by one per call of the wide path (search/wide.py)."""
    import sys

    dispatch = sys.modules["autoshard.search.solve"]  # the module (the package exports the function)
    real, calls = dispatch.with_budget_by_reduction, []

    def too_wide(run: Any, cap: float, wide: Any = None) -> None:
        if wide is not None:
            wide()

    def spied(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(dispatch, "exact_solver", too_wide)
    monkeypatch.setattr(dispatch, "with_budget_by_reduction", spied)
    return calls


@pytest.mark.parametrize("seed", range(16))
def test_the_wide_path_probes_the_hint_before_its_own_work(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hinted multiplier's bound ends a wide budgeted solve before the wide path starts when it reaches
    the ceiling; short of it, the answer is the one without the hint."""
    p = _budgeted(seed)
    if p is None:
        pytest.skip("nothing fits this draw")
    assert p.memory is not None and p.memory_limit is not None
    want = brute_force(p).objective
    lam = max(want, 1e-9) / max(p.memory_limit, 1.0)
    relaxed = dataclasses.replace(
        p,
        node_costs=tuple(c + lam * m for c, m in zip(p.node_costs, p.memory, strict=True)),
        memory=None,
        memory_limit=None,
    )
    bound = brute_force(relaxed).objective - lam * p.memory_limit  # the Lagrangian bound at lam
    assert bound <= want * (1 + 1e-9) + 1e-12
    calls = _too_wide(monkeypatch)
    with pytest.raises(BoundExceeded) as e:
        solve(p, method="exact", multiplier=lam, ceiling=bound - 1e-9 * abs(bound))  # (rounding)
    assert not calls  # pruned before the wide path: by the probe (or the cheapest terms, before it)
    assert bound * (1 - 1e-9) - 1e-12 <= e.value.bound <= want * (1 + 1e-9) + 1e-12  # a true bound
    above = want * (1 + 1e-6) + 1e-9
    plain = solve(p, method="exact", ceiling=above)
    hinted = solve(p, method="exact", multiplier=lam, ceiling=above)
    assert (hinted.choice, hinted.objective, hinted.lower_bound) == (
        plain.choice,
        plain.objective,
        plain.lower_bound,
    )
    assert len(calls) == 2
