"""Propagation: complete finite plans, pins kept, conflicting annotations named."""

from __future__ import annotations

import math

import numpy as np
import pytest
from search_cases import random_problem

from autoshard.errors import AnnotationError, InfeasibleError
from autoshard.search import Edge, SearchProblem, evaluate, propagate
from autoshard.search.propagate import pinned_nodes, with_pins

inf = math.inf


@pytest.mark.parametrize("seed", range(30))
def test_plan_is_complete_and_finite(seed: int) -> None:
    p = random_problem(seed, max_nodes=10)
    choice = propagate(p)
    assert len(choice) == p.num_nodes and math.isfinite(evaluate(p, choice))


@pytest.mark.parametrize("seed", range(30))
def test_trees_with_forbidden_pairs_stay_finite(seed: int) -> None:
    p = random_problem(seed, max_nodes=10, cyclic=False, inf_fraction=0.3)
    try:
        choice = propagate(p)
    except InfeasibleError as e:  # no finite plan at all; never blamed on annotations (there are none)
        assert not isinstance(e, AnnotationError)
        return
    assert math.isfinite(evaluate(p, choice))


@pytest.mark.parametrize("seed", range(20))
def test_pins_are_respected(seed: int) -> None:
    p = random_problem(seed, max_nodes=10)
    rng = np.random.default_rng(seed)
    pins = {int(i): int(rng.integers(p.sizes[i])) for i in rng.choice(p.num_nodes, 2, replace=False)}
    choice = propagate(p, pins)
    assert all(choice[i] == s for i, s in pins.items())
    assert pinned_nodes(with_pins(p, pins)) == pins


def test_propagates_the_pinned_strategy_along_a_chain() -> None:
    swap = np.array([[0.0, 1.0, 1.0], [1.0, 0.0, 1.0], [1.0, 1.0, 0.0]])
    p = SearchProblem(
        tuple(np.zeros(3) for _ in range(5)),
        tuple(Edge(i, i + 1, swap) for i in range(4)),
        tuple("abcde"),
        allowed=(None, None, np.array([False, False, True]), None, None),
    )
    assert propagate(p) == (2, 2, 2, 2, 2)


def test_conflict_between_two_pins_names_both_sides() -> None:
    same = np.array([[0.0, inf], [inf, 0.0]])
    p = SearchProblem(
        tuple(np.zeros(2) for _ in range(3)),
        (Edge(0, 2, same), Edge(1, 2, same)),
        ("left.weight", "right.weight", "join"),
    )
    with pytest.raises(AnnotationError) as info:
        propagate(p, {0: 0, 1: 1})
    msg = str(info.value)
    assert "left.weight" in msg and "right.weight" in msg and "join" in msg


def test_bad_pin_is_an_annotation_error() -> None:
    p = random_problem(0)
    with pytest.raises(AnnotationError):
        propagate(p, {0: 99})
