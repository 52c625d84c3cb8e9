"""A max term in the memory budget (``SearchProblem.peak``: the largest temporary) is solved exactly: the
threshold search equals brute force, and the peak moves the optimum where a sum-only budget would not."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from search_cases import close, random_problem

from autoshard.errors import InfeasibleError
from autoshard.search import SearchProblem, brute_force, memory_of, solve
from autoshard.search.problem import Edge


def _with_peak(seed: int) -> SearchProblem:
    p = random_problem(seed, max_nodes=7, memory=True, inf_fraction=0.1 if seed % 3 else 0.0)
    rng = np.random.default_rng(seed)
    assert p.memory is not None and p.memory_limit is not None
    scale = float(np.mean([m.mean() for m in p.memory]))
    peak = tuple(np.round(rng.uniform(0, 2 * scale, c.size)) for c in p.node_costs)
    return dataclasses.replace(p, peak=peak, memory_limit=p.memory_limit + scale)


@pytest.mark.parametrize("seed", range(60))
@pytest.mark.parametrize("method", ["auto", "ilp"])
def test_peak_budget_equals_brute_force(seed: int, method: str) -> None:
    p = _with_peak(seed + 500)
    try:
        want = brute_force(p)
    except InfeasibleError:
        with pytest.raises(InfeasibleError, match=r"memory budget|no finite"):
            solve(p, method=method)  # type: ignore[arg-type]
        return
    got = solve(p, method=method)  # type: ignore[arg-type]
    assert close(got.objective, want.objective)
    assert memory_of(p, got.choice) <= p.memory_limit  # type: ignore[operator]
    assert got.optimal


def test_the_peak_moves_the_optimum() -> None:
    """Two nodes; the fast strategy of ``a`` leaves a large temporary.  Counted as a sum the budget would
    allow it; as the max it is, with ``b``'s memory on top, it does not fit and the optimum moves."""
    p = SearchProblem(
        node_costs=(np.array([0.0, 2.0]), np.array([0.0, 1.0])),
        edges=(Edge(0, 1, np.zeros((2, 2))),),
        names=("a", "b"),
        memory=(np.array([1.0, 1.0]), np.array([5.0, 2.0])),
        memory_limit=9.0,
        peak=(np.array([4.0, 1.0]), np.array([0.0, 0.0])),
    )
    without = solve(dataclasses.replace(p, peak=None))
    assert without.choice == (0, 0)  # 1 + 5 = 6 <= 9: fits when the temporary is ignored
    got, want = solve(p), brute_force(p)
    assert got.choice == want.choice == (0, 1)  # 1 + 2 + 4 = 7; (0, 0) needs 1 + 5 + 4 = 10
    assert got.objective == 1.0 and memory_of(p, got.choice) == 7.0


def test_no_plan_fits_says_by_how_much() -> None:
    p = SearchProblem(
        node_costs=(np.array([0.0, 1.0]),),
        edges=(),
        names=("a",),
        memory=(np.array([3.0, 2.0]),),
        memory_limit=2048.0,
        peak=(np.array([1024.0, 1024.0]),),
    )
    p = dataclasses.replace(p, memory=(np.array([3072.0, 2048.0]),))
    with pytest.raises(InfeasibleError, match=r"at least 3.00 KiB \(1.00 KiB over; the largest temporary"):
        solve(p)


def test_no_plan_fits_names_no_temporary_of_0_bytes() -> None:
    """An MLP read "the largest temporary alone at least 0 B": a floor of nothing is not said."""
    p = SearchProblem(
        node_costs=(np.array([0.0, 1.0]),),
        edges=(),
        names=("a",),
        memory=(np.array([3072.0, 2048.0]),),
        memory_limit=1024.0,
        peak=(np.array([0.0, 0.0]),),
    )
    with pytest.raises(InfeasibleError, match=r"at least 2.00 KiB \(1.00 KiB over\)\. Fix:"):
        solve(p)
