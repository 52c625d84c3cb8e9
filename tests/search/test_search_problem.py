"""SearchProblem validation, evaluate/memory_of, and the normalised pairwise form."""

from __future__ import annotations

import math

import numpy as np
import pytest

from autoshard.errors import AnnotationError
from autoshard.search import Edge, SearchProblem, evaluate, memory_of
from autoshard.search.problem import pairwise_form, relative_gap


def _two(**kw: object) -> SearchProblem:
    base: dict[str, object] = {
        "node_costs": (np.array([1.0, 2.0]), np.array([0.0, 0.5, 1.0])),
        "edges": (Edge(0, 1, np.arange(6.0).reshape(2, 3)),),
        "names": ("a", "b"),
    }
    base.update(kw)
    return SearchProblem(**base)  # type: ignore[arg-type]


def test_evaluate_indexes_edge_cost_by_source_then_target() -> None:
    p = _two()
    # cost[s_a, s_b] = 3 * s_a + s_b: an asymmetric matrix catches a transposed lookup
    assert evaluate(p, (1, 2)) == 2.0 + 1.0 + 5.0
    assert evaluate(p, (0, 1)) == 1.0 + 0.5 + 1.0


def test_evaluate_is_inf_outside_mask_and_memory_sums() -> None:
    p = _two(
        allowed=(np.array([True, False]), None),
        memory=(np.array([10.0, 5.0]), np.array([1.0, 2.0, 3.0])),
    )
    assert math.isinf(evaluate(p, (1, 0)))
    assert evaluate(p, (0, 0)) == 1.0
    assert memory_of(p, (1, 2)) == 8.0


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"names": ("a",)}, "names has 1"),
        ({"edges": (Edge(0, 1, np.zeros((3, 2))),)}, "expected"),
        ({"edges": (Edge(0, 5, np.zeros((2, 3))),)}, "outside"),
        ({"node_costs": (np.array([1.0, np.nan]), np.zeros(3))}, "NaN"),
        ({"node_costs": (np.array([1.0, -1.0]), np.zeros(3))}, "negative"),
        ({"memory_limit": 10.0}, "memory is None"),
        ({"memory": (np.zeros(2),)}, "memory has 1"),
        ({"memory": (np.zeros(2), np.zeros(3)), "memory_limit": -1.0}, "memory_limit"),
        ({"allowed": (np.array([True]), None)}, "shape"),
        ({"strategy_labels": (("x", "y"), ("z",))}, "strategy_labels"),
    ],
)
def test_validation_says_what_is_wrong(kw: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        _two(**kw)


@pytest.mark.parametrize("bad", [np.nan, -1.0])
def test_edge_costs_are_checked_when_the_edge_is_made(bad: float) -> None:
    # once per edge, not per problem: problems made from one another (a budget changed) share their edges
    cost = np.zeros((2, 3))
    cost[1, 2] = bad
    with pytest.raises(ValueError, match=r"edge \(0, 1\) cost has NaN or negative"):
        Edge(0, 1, cost)


def test_self_edge_and_empty_mask_are_refused() -> None:
    with pytest.raises(ValueError, match="self-edge"):
        Edge(1, 1, np.zeros((2, 2)))
    with pytest.raises(AnnotationError, match="allows no strategy"):
        _two(allowed=(np.array([False, False]), None))


def test_pairwise_form_sums_parallel_and_reversed_edges() -> None:
    m = np.arange(6.0).reshape(2, 3)
    p = _two(edges=(Edge(0, 1, m), Edge(1, 0, m.T * 10), Edge(0, 1, m)))
    form = pairwise_form(p)
    np.testing.assert_array_equal(form.pairs[(0, 1)], 12 * m)
    assert evaluate(p, (1, 2)) == 2.0 + 1.0 + 12 * 5.0


def test_relative_gap() -> None:
    assert relative_gap(2.0, 1.0) == 0.5
    assert relative_gap(0.0, 0.0) == 0.0
    assert relative_gap(1.0, 2.0) == 0.0
    assert math.isinf(relative_gap(1.0, -math.inf))
