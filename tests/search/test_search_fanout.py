"""Fan-out nodes keep the search exact: on small random graphs where tensors have several consumers, the
solver's optimum over (nodes + fan-out nodes) equals brute force over the nodes alone with the true cost
(each distinct element a producer's consumers need is paid once)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from search_cases import random_problem

from autoshard.search import Edge, SearchProblem, evaluate, solve
from autoshard.search.fanout import fanout_node, fanout_state, fanout_states


def _with_fanouts(seed: int):
    """A random problem plus 1-3 producers, each read by 2-4 consumers; elements drawn from a few ids."""
    rng = np.random.default_rng(1000 + seed)
    base = random_problem(seed, max_nodes=6)
    n, sizes = base.num_nodes, base.sizes
    groups = []
    for _ in range(int(rng.integers(1, 4))):
        producer = int(rng.integers(n))
        others = [i for i in range(n) if i != producer]
        k = int(rng.integers(2, min(4, len(others)) + 1)) if len(others) >= 2 else len(others)
        if k < 2:
            continue
        consumers = [int(c) for c in rng.choice(others, k, replace=False)]
        n_elem = int(rng.integers(1, 4))
        entries = [rng.integers(0, n_elem, sizes[c]) for c in consumers]
        cost = rng.random((sizes[producer], n_elem)) * 3
        groups.append((producer, consumers, entries, cost))
    return base, groups


def _true_cost(base: SearchProblem, groups, choice) -> float:
    total = evaluate(base, choice)
    for producer, consumers, entries, cost in groups:
        image = {int(e[choice[c]]) for c, e in zip(consumers, entries, strict=True)}
        total += math.fsum(cost[choice[producer], e] for e in image)
    return total


def _expanded(base: SearchProblem, groups) -> SearchProblem:
    node_costs, edges, names = list(base.node_costs), list(base.edges), list(base.names)
    for producer, consumers, entries, cost in groups:
        fan = fanout_node(cost, entries)
        assert fan is not None
        f = len(node_costs)
        node_costs.append(np.zeros(len(fan.states)))
        names.append(f"fan{f}")
        edges.append(Edge(producer, f, fan.producer_cost))
        edges += [Edge(f, c, m) for c, m in zip(consumers, fan.consumer_costs, strict=True)]
    return SearchProblem(tuple(node_costs), tuple(edges), tuple(names))


@pytest.mark.parametrize("seed", range(40))
def test_fanout_search_equals_brute_force_on_the_true_cost(seed: int) -> None:
    base, groups = _with_fanouts(seed)
    best = min((_true_cost(base, groups, c), c) for c in itertools.product(*(range(s) for s in base.sizes)))
    solution = solve(_expanded(base, groups))
    assert solution.optimal
    assert solution.objective == pytest.approx(best[0], rel=1e-9, abs=1e-12)
    # the solver's choice of the original nodes really costs that much
    assert _true_cost(base, groups, solution.choice[: base.num_nodes]) == pytest.approx(best[0], rel=1e-9)


def test_states_are_the_reachable_images_only() -> None:
    entries = [np.array([0, 0, 1]), np.array([1, 2])]
    assert fanout_states(entries) == (frozenset({1}), frozenset({0, 1}), frozenset({0, 2}), frozenset({1, 2}))
    assert fanout_states([np.arange(10)] * 5, max_states=100) is None  # said, not silently truncated


def test_shared_element_is_paid_once() -> None:
    # q, k and v all want the gathered layout (element 0): one all-gather, not three
    fan = fanout_node(np.array([[4.0, 1.0]]), [np.array([0, 1])] * 3)
    assert fan is not None
    gathered = fanout_state(fan.states, {0})
    assert fan.producer_cost[0, gathered] == 4.0
    assert all(m[gathered, 0] == 0.0 and m[gathered, 1] == np.inf for m in fan.consumer_costs)
