"""A reduction that applies only a similar problem's dominance removals (``reduce_problem(search=False)``,
``solve(dominance_search=False)``): the per-block intervals' and the ranking's solves.  Exact like the full
reduction: the same optimum (brute force), the same budgeted solve and ceiling answers."""

from __future__ import annotations

import dataclasses
import importlib

import numpy as np
import pytest
from search_cases import close, random_problem

from autoshard.errors import InfeasibleError
from autoshard.search import BoundExceeded, Edge, SearchProblem, brute_force, reduce_problem, solve


def _near(p: SearchProblem, seed: int) -> SearchProblem:
    rng = np.random.default_rng(seed + 7)
    return dataclasses.replace(
        p,
        node_costs=tuple(c + rng.random(c.size) * 0.05 for c in p.node_costs),
        edges=tuple(Edge(e.u, e.v, e.cost + rng.random(e.cost.shape) * 0.05) for e in p.edges),
    )


def _removed(red: object) -> int:
    return sum(s.size for _, s, _ in red.dominated)  # type: ignore[attr-defined]


def test_only_the_hint_is_applied() -> None:
    """Without a search, no removal beyond the hint's (none at all without one); with the problem's own
    removals as the hint, the same strategies go as with the search."""
    p = random_problem(4, max_nodes=7, memory=True)  # 9 strategies dominated
    full = reduce_problem(p)
    assert _removed(full) > 0
    assert _removed(reduce_problem(p, search=False)) == 0
    own = reduce_problem(p, hint=full.dominated, search=False)
    assert [d.tolist() for d in own.domains] == [d.tolist() for d in full.domains]
    near = reduce_problem(_near(p, 4), hint=full.dominated, search=False)
    assert _removed(near) <= _removed(full)


@pytest.mark.parametrize("seed", range(24))
def test_the_optimum_and_the_ceiling_answer_do_not_change(seed: int) -> None:
    """On random budgeted problems hinted by a near problem's removals: the same optimum as brute force;
    under a ceiling, every bound stated is a true one, and none reaches a ceiling above the optimum."""
    p = random_problem(seed, max_nodes=7, memory=True, inf_fraction=0.1 if seed % 3 == 0 else 0.0)
    q = _near(p, seed)
    try:
        hint = solve(p).dominated
        want = brute_force(q).objective
    except InfeasibleError:
        return
    got = solve(q, dominated=hint, dominance_search=False)
    assert close(got.objective, want)
    for ceiling in (want * 0.999, want * 1.001 + 1e-9):
        for search in (True, False):
            try:
                found = solve(q, method="exact", ceiling=ceiling, dominated=hint, dominance_search=search)
            except BoundExceeded as e:
                assert e.bound <= want * (1 + 1e-9) + 1e-12 < ceiling or e.bound >= ceiling  # a true bound
                assert ceiling <= want * (1 + 1e-9) + 1e-12  # none above the optimum
                continue
            assert found.lower_bound <= want * (1 + 1e-9) + 1e-12


def test_a_wide_remainder_searches_dominance_after_all(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the hinted removals leave tables over ``_HINTED_TABLE`` (here: any), the solve reduces with
    the dominance search after all: the same reduction and optimum as the default."""
    dispatch = importlib.import_module("autoshard.search.solve")  # the package's `solve` is the function
    p = random_problem(4, max_nodes=7, memory=True)
    want = solve(p)
    monkeypatch.setattr(dispatch, "_HINTED_TABLE", 0)
    got = solve(p, dominance_search=False)
    assert got.log[0] == want.log[0]  # the reduction's line: the same removals
    assert close(got.objective, want.objective)
