"""Exact preprocessing: the map back to the original nodes, pruning, folding, and infeasibility messages."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from search_cases import close, random_problem

from autoshard.errors import AnnotationError, InfeasibleError
from autoshard.search import (
    Edge,
    SearchProblem,
    brute_force,
    evaluate,
    memory_of,
    reduce_problem,
    solve_exact,
)
from autoshard.search.reduce import prune_domains
from autoshard.search.run import carry

inf = math.inf


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("eliminate_free", [True, False])
def test_reduction_preserves_objective_and_optimum(seed: int, eliminate_free: bool) -> None:
    p = random_problem(seed, max_nodes=9, inf_fraction=0.2 if seed % 2 else 0.0, masks=seed % 3 == 0)
    try:
        want = brute_force(p).objective
    except InfeasibleError:
        want = inf
    try:
        red = reduce_problem(p, eliminate_free=eliminate_free)
    except InfeasibleError:
        assert want == inf
        return
    rng = np.random.default_rng(seed)
    for _ in range(5):  # any reduced choice maps to an original one of the same cost
        c = [int(rng.integers(s)) for s in red.problem.sizes]
        assert close(evaluate(red.problem, c) + red.cost_offset, evaluate(p, red.expand(c)))
    best = red.expand(solve_exact(red.problem).choice)
    assert close(evaluate(p, best), want)


@pytest.mark.parametrize("seed", range(15))
def test_memory_offset_under_a_budget(seed: int) -> None:
    p = random_problem(seed, max_nodes=9, memory=True)
    red = reduce_problem(p)
    c = [0] * red.problem.num_nodes
    assert close(memory_of(red.problem, c) + red.memory_offset, memory_of(p, red.expand(c)))
    assert red.problem.memory_limit == p.memory_limit - red.memory_offset  # type: ignore[operator]


def test_chain_collapses_without_budget() -> None:
    rng = np.random.default_rng(0)
    p = SearchProblem(
        tuple(rng.random(3) for _ in range(6)),
        tuple(Edge(i, i + 1, rng.random((3, 3))) for i in range(5)),
        tuple("abcdef"),
    )
    red = reduce_problem(p)
    assert red.problem.num_nodes == 0
    assert close(red.cost_offset, brute_force(p).objective)


def test_memory_nodes_stay_and_constant_memory_nodes_go() -> None:
    rng = np.random.default_rng(1)
    mem = (np.array([1.0, 2.0]), np.array([3.0, 3.0]), np.array([5.0, 1.0]))
    p = SearchProblem(
        tuple(rng.random(2) for _ in range(3)),
        (Edge(0, 1, rng.random((2, 2))), Edge(1, 2, rng.random((2, 2)))),
        tuple("abc"),
        memory=mem,
        memory_limit=6.0,
    )
    red = reduce_problem(p, dominance=False)
    assert red.kept == (0, 2) and red.memory_offset == 3.0 and red.problem.memory_limit == 3.0


def test_separable_and_parallel_edges_disappear() -> None:
    p = SearchProblem(
        (np.zeros(2), np.zeros(3)),
        (Edge(0, 1, np.add.outer([1.0, 2.0], [0.0, 5.0, 1.0])), Edge(1, 0, np.zeros((3, 2)))),
        ("a", "b"),
    )
    red = reduce_problem(p, eliminate_free=False, dominance=False)
    assert red.problem.edges == () and "1 separable" in red.log[0]
    assert close(evaluate(red.problem, (0, 0)) + red.cost_offset, evaluate(p, red.expand((0, 0))))


def test_arc_consistency_prunes_unsupported_strategies() -> None:
    p = SearchProblem(
        (np.zeros(3), np.array([0.0, inf])),
        (Edge(0, 1, np.array([[0.0, 0.0], [inf, 0.0], [1.0, inf]])),),
        ("a", "b"),
    )
    live = prune_domains(p)
    assert live[0].tolist() == [True, False, True] and live[1].tolist() == [True, False]


def test_conflicting_pins_raise_annotation_error_naming_both() -> None:
    same = np.array([[0.0, inf], [inf, 0.0]])
    p = SearchProblem(
        tuple(np.zeros(2) for _ in range(3)),
        (Edge(0, 1, same), Edge(1, 2, same)),
        ("wq", "mid", "wo"),
        allowed=(np.array([True, False]), None, np.array([False, True])),
    )
    with pytest.raises(AnnotationError, match="wq") as info:
        reduce_problem(p)
    assert "wo" in str(info.value) and isinstance(info.value, InfeasibleError)


def test_unannotated_dead_end_raises_infeasible_naming_nodes() -> None:
    p = SearchProblem(
        (np.array([0.0, inf]), np.zeros(2), np.zeros(2)),
        (Edge(0, 1, np.array([[inf, inf], [0.0, 0.0]])),),
        ("emb", "proj", "other"),
    )
    with pytest.raises(InfeasibleError, match="emb") as info:
        reduce_problem(p)
    assert not isinstance(info.value, AnnotationError) and "proj" in str(info.value)


def test_restrict_maps_hints_onto_pruned_domains() -> None:
    p = SearchProblem(
        (np.array([0.0, inf, 0.0]), np.zeros(2)), (Edge(0, 1, np.array([[0.0, 1.0]] * 3)),), ("a", "b")
    )
    red = reduce_problem(p, eliminate_free=False, dominance=False)
    assert red.restrict((2, 1)) == [1, 1] and red.restrict((1, 0)) == [None, 0]


@pytest.mark.parametrize("seed", range(40))
def test_carry_maps_any_plan_to_a_kept_one_no_dearer_and_no_larger(seed: int) -> None:
    # dominance removed strategies: a plan using them is carried to its dominators (the sweep's start)
    p = random_problem(seed + 1300, max_nodes=8, memory=seed % 2 == 0)
    p = dataclasses.replace(p, memory_limit=None) if seed % 4 == 2 else p
    try:
        red = reduce_problem(p)
    except InfeasibleError:
        return
    rng = np.random.default_rng(seed)
    for _ in range(20):
        plan = tuple(int(rng.integers(0, s)) for s in p.sizes)
        cost = evaluate(p, plan)
        if not math.isfinite(cost):
            continue
        carried = carry(red, plan)
        assert None not in carried
        local = tuple(int(x) for x in carried if x is not None)
        assert evaluate(red.problem, local) + red.cost_offset <= cost * (1 + 1e-9) + 1e-12
        if p.memory_limit is not None and red.problem.memory is not None:  # memory kept only under a budget
            assert memory_of(red.problem, local) + red.memory_offset <= memory_of(p, plan) + 1e-9
        if red.restrict(plan) == carried:
            continue
        assert any(x is None for x in red.restrict(plan))  # it differs only where restrict has a hole


def test_folds_over_the_cap_run_in_slabs_and_keep_a_wide_graph_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    from autoshard.search import reduce as reduce_module
    from autoshard.search import solve

    rng = np.random.default_rng(3)
    p = SearchProblem(  # a ring of free nodes, nothing dominated: it folds away, else needs tables of 9 entries
        tuple(0.1 * rng.random(3) for _ in range(6)),
        tuple(Edge(i, (i + 1) % 6, 1 - np.eye(3) + 0.1 * rng.random((3, 3))) for i in range(6)),
        tuple("abcdef"),
    )
    whole = reduce_problem(p)
    monkeypatch.setattr(reduce_module, "_MAX_FOLD_TABLE", 2)  # no fold by default; slabs of one row
    assert reduce_problem(p).problem.num_nodes == 6
    sliced = reduce_problem(p, fold_cap=10**6)
    assert sliced.problem.num_nodes == whole.problem.num_nodes == 0
    assert (sliced.cost_offset, sliced.expand(())) == (whole.cost_offset, whole.expand(()))  # to the bit
    found = solve(p, max_factor_size=1)  # too wide to eliminate as reduced by default: folded after all
    assert found.optimal and "cp-sat" not in found.method and any("folding up to" in s for s in found.log)
    assert close(found.objective, brute_force(p).objective)
