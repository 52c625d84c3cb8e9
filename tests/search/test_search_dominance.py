"""Dominance pruning: which strategies go, ties, memory, and that the optimum never changes (brute force)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from search_cases import close, random_problem, transformer_problem

from autoshard.errors import InfeasibleError
from autoshard.search import Edge, SearchProblem, brute_force, evaluate, memory_of, reduce_problem
from autoshard.search.dominance import dominated_mask

inf = math.inf


def _brute(p: SearchProblem) -> float:
    try:
        return brute_force(p).objective
    except InfeasibleError:
        return inf


def test_duplicates_merge_keeping_the_first_index() -> None:
    rows = np.array([[0.0, 3.0], [1.0, 0.0], [0.0, 3.0], [1.0, 0.0]])
    keep = dominated_mask(np.array([1.0, 2.0, 1.0, 2.0]), [rows])
    assert keep.tolist() == [True, True, False, False]


def test_elementwise_and_goldstein_dominance() -> None:
    # 1 >= 0 everywhere: elementwise dominated.  2 is not elementwise dominated by 0 (it is cheaper at c=1),
    # but its 1.0 saving there never makes up for the 2.0 it pays more in node cost: Goldstein removes it.
    unary = np.array([0.0, 0.5, 2.0])
    rows = np.array([[1.0, 2.0], [1.0, 2.5], [1.0, 1.0]])
    assert dominated_mask(unary, [rows]).tolist() == [True, False, False]


def test_two_edges_need_a_strategy_that_is_no_worse_on_both() -> None:
    # Each is cheaper than the other for some choice of the neighbours (0 on edge b, 1 on edge a): both stay.
    unary = np.zeros(2)
    a = np.array([[0.0, 1.0], [0.0, 0.0]])
    b = np.array([[0.0, 0.0], [1.0, 0.0]])
    assert dominated_mask(unary, [a, b]).tolist() == [True, True]


def test_memory_blocks_a_cheaper_but_larger_strategy() -> None:
    unary = np.array([1.0, 0.0])
    rows = np.zeros((2, 3))
    assert dominated_mask(unary, [rows]).tolist() == [False, True]
    assert dominated_mask(unary, [rows], memory=np.array([10.0, 20.0])).tolist() == [True, True]


def test_inf_rows() -> None:
    # 0 forbids c=1 where 1 allows it: 0 cannot replace 1.  1 pairs finitely with everything 0 does and costs
    # no more there, so 1 replaces 0 (columns where 0 is inf do not count against 1).
    rows = np.array([[0.0, inf], [0.0, 5.0]])
    assert dominated_mask(np.zeros(2), [rows]).tolist() == [False, True]


@pytest.mark.parametrize("seed", range(40))
def test_every_removed_strategy_has_a_kept_dominator(seed: int) -> None:
    rng = np.random.default_rng(seed)
    size = int(rng.integers(2, 9))
    unary = rng.integers(0, 4, size).astype(float)
    rows = [rng.integers(0, 4, (size, int(rng.integers(1, 5)))).astype(float) for _ in range(2)]
    memory = rng.integers(0, 3, size).astype(float) if seed % 2 else None
    keep = dominated_mask(unary, rows, memory)
    assert keep.any()
    for s in np.flatnonzero(~keep).tolist():
        # min over every neighbour assignment of cost(s) - cost(t) >= 0 for some kept t
        def worst_gain(t: int, s: int = s) -> float:
            return float(unary[s] - unary[t]) + sum(float((r[s] - r[t]).min()) for r in rows)

        assert any(
            worst_gain(int(t)) >= 0 and (memory is None or memory[t] <= memory[s])
            for t in np.flatnonzero(keep)
        )


@pytest.mark.parametrize("seed", range(60))
def test_dominance_never_changes_the_optimum(seed: int) -> None:
    p = random_problem(
        seed + 500,
        max_nodes=9,
        memory=seed % 3 == 0,
        masks=seed % 4 == 0,
        inf_fraction=0.2 if seed % 2 else 0.0,
    )
    want = _brute(p)
    for free in (False, True):
        try:
            red = reduce_problem(p, eliminate_free=free)
        except InfeasibleError:
            assert want == inf
            continue
        got = _brute(red.problem)
        assert close(got + red.cost_offset, want) or got == want == inf
        if got < inf:
            choice = red.expand(brute_force(red.problem).choice)
            assert close(evaluate(p, choice), want)
            if p.memory_limit is not None:
                assert memory_of(p, choice) <= p.memory_limit


@pytest.mark.parametrize("seed", range(6))
def test_dominance_is_deterministic_and_shrinks_structured_problems(seed: int) -> None:
    p = transformer_problem(seed, 6)
    a, b = reduce_problem(p, eliminate_free=False), reduce_problem(p, eliminate_free=False)
    assert [d.tolist() for d in a.domains] == [d.tolist() for d in b.domains]
    plain = reduce_problem(p, eliminate_free=False, dominance=False)
    assert sum(a.problem.sizes) <= sum(plain.problem.sizes)


@pytest.mark.parametrize("seed", range(20))
def test_pair_bounds_never_fall_below_the_exact_term(seed: int) -> None:
    """The per-pair and sampled-column bounds are upper bounds of ``min_c (F[s, c] - F[t, c])`` (finite F[s, c])."""
    from autoshard.search.dominance import _min_row_differences, _sample_columns, _targeted

    rng = np.random.default_rng(seed)
    mat = rng.integers(0, 4, size=(12, 30)).astype(float)
    mat[rng.random(mat.shape) < 0.2] = inf
    exact = np.full((12, 12), inf)
    for s in range(12):
        for t in range(12):
            terms = [mat[s, c] - mat[t, c] for c in range(30) if math.isfinite(mat[s, c])]
            exact[s, t] = min(terms, default=inf)
    for bound in (_targeted(mat), _min_row_differences(_sample_columns(mat))):
        ok = np.isnan(bound) | (bound >= exact)
        assert ok.all()


def _perturbed(p: SearchProblem, seed: int, scale: float) -> SearchProblem:
    """The same nodes and strategies with costs moved a little (a share of recomputation, another policy)."""
    rng = np.random.default_rng(seed + 1000)
    return dataclasses.replace(
        p,
        node_costs=tuple(c + rng.random(c.size) * scale for c in p.node_costs),
        edges=tuple(Edge(e.u, e.v, e.cost + rng.random(e.cost.shape) * scale) for e in p.edges),
    )


@pytest.mark.parametrize("seed", range(40))
def test_a_similar_problems_removals_as_a_hint_keep_the_optimum(seed: int) -> None:
    """Reducing with another problem's dominance removals (``hint``) checks each on this problem: the
    optimum (brute force) never changes, whether the hint comes from a near problem, a far one, or is
    nonsense (random pairs), and every removal the reduction reports has a dominator kept at that point."""
    p = random_problem(seed, max_nodes=7, memory=seed % 2 == 0, inf_fraction=0.1 if seed % 3 == 0 else 0.0)
    q = _perturbed(p, seed, 0.05 if seed % 4 else 1.0)
    rng = np.random.default_rng(seed)
    bogus = tuple((v, rng.integers(0, n, 3), rng.integers(0, n, 3)) for v, n in enumerate(p.sizes) if n > 1)
    want = _brute(q)
    try:
        near = reduce_problem(p).dominated
    except InfeasibleError:
        near = ()
    for hint in (near, bogus):
        try:
            red = reduce_problem(q, hint=hint)
        except InfeasibleError:
            assert want == inf
            continue
        if red.problem.num_nodes == 0:
            got = evaluate(q, red.expand(()))
            assert q.memory_limit is None or memory_of(q, red.expand(())) <= q.memory_limit
        else:
            got = _brute(red.problem) + red.cost_offset
        assert close(got, want)


def test_a_hint_spares_the_search_but_not_the_check() -> None:
    """The transformer-shaped problem reduced with its own removals as the hint removes the same strategies;
    a hint whose dominator no longer dominates here (costs swapped) removes nothing wrongly."""
    p = transformer_problem(2, 12, memory=True)
    red = reduce_problem(p)
    again = reduce_problem(p, hint=red.dominated)
    assert [d.tolist() for d in again.domains] == [d.tolist() for d in red.domains]
    assert sum(s.size for _, s, _ in again.dominated) == sum(s.size for _, s, _ in red.dominated)
    flipped = tuple((v, t, s) for v, s, t in red.dominated)  # each pair the wrong way round
    swapped = reduce_problem(p, hint=flipped)
    assert close(_brute(swapped.problem) + swapped.cost_offset, _brute(red.problem) + red.cost_offset)


@pytest.mark.parametrize("seed", range(10))
def test_the_bounds_of_a_matrix_without_inf_skip_masking_and_agree(seed: int) -> None:
    """edge_bound's shortcut for matrices with no forbidden entry gives the masked passes' values."""
    from autoshard.search.dominance import _sample_columns, _targeted

    mat = np.random.default_rng(seed).integers(0, 5, size=(9, 14)).astype(float)
    assert (_sample_columns(mat, dense=True) == _sample_columns(mat)).all()
    assert (_targeted(mat, dense=True) == _targeted(mat)).all()
