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
from autoshard.search.fanout import best_state, fanout_node, fanout_sets, shareable


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


def _true_cost(base: SearchProblem, groups, choice, unshared=frozenset()) -> float:
    """Each distinct element once; groups in ``unshared`` (no fan-out node built) once per consumer."""
    total = evaluate(base, choice)
    for g, (producer, consumers, entries, cost) in enumerate(groups):
        wanted = [int(e[choice[c]]) for c, e in zip(consumers, entries, strict=True)]
        total += math.fsum(cost[choice[producer], e] for e in (wanted if g in unshared else set(wanted)))
    return total


def _expanded(base: SearchProblem, groups, max_states: int) -> tuple[SearchProblem, frozenset[int]]:
    node_costs, edges, names = list(base.node_costs), list(base.edges), list(base.names)
    unshared = set()
    for g, (producer, consumers, entries, cost) in enumerate(groups):
        fan = fanout_node(cost, entries, max_states)
        if fan is None:  # nothing two consumers could share, or too large: plain edges
            edges += [Edge(producer, c, cost[:, e]) for c, e in zip(consumers, entries, strict=True)]
            unshared.add(g)
            continue
        assert fan.exact or len(consumers) >= 4
        f = len(node_costs)
        node_costs.append(np.zeros(len(fan.states)))
        names.append(f"fan{f}")
        edges.append(Edge(producer, f, fan.producer_cost))
        edges += [Edge(f, c, m) for c, m in zip(consumers, fan.consumer_costs, strict=True)]
    return SearchProblem(tuple(node_costs), tuple(edges), tuple(names)), frozenset(unshared)


@pytest.mark.parametrize("max_states", [256, 3])  # 3: the sets form, or no node, where layouts are too many
@pytest.mark.parametrize("seed", range(40))
def test_fanout_search_equals_brute_force_on_the_true_cost(seed: int, max_states: int) -> None:
    base, groups = _with_fanouts(seed)
    problem, unshared = _expanded(base, groups, max_states)
    if max_states == 256:
        assert not any(shareable(groups[g][2]) for g in unshared), "only groups with nothing to share"
    best = min(
        _true_cost(base, groups, c, unshared) for c in itertools.product(*(range(s) for s in base.sizes))
    )
    solution = solve(problem)
    assert solution.optimal
    assert solution.objective == pytest.approx(best, rel=1e-9, abs=1e-12)
    # the solver's choice of the original nodes really costs that much
    chosen = solution.choice[: base.num_nodes]
    assert _true_cost(base, groups, chosen, unshared) == pytest.approx(best, rel=1e-9, abs=1e-12)


def test_sets_are_the_reachable_images_only() -> None:
    entries = [np.array([0, 0, 1]), np.array([1, 2])]
    assert fanout_sets(entries) == (frozenset({1}), frozenset({0, 1}), frozenset({0, 2}), frozenset({1, 2}))
    assert fanout_sets([np.arange(10)] * 5, max_states=100) is None  # said, not silently truncated


@pytest.mark.parametrize("max_states", [256, 3])  # the layout form (6 states), then the sets form (3)
def test_shared_element_is_paid_once(max_states: int) -> None:
    # q, k and v all want the gathered layout (element 0): one all-gather, not three
    cost = np.array([[4.0, 1.0], [4.0, 1.0]])
    fan = fanout_node(cost, [np.array([0, 1])] * 3, max_states=max_states)
    assert fan is not None and fan.exact and fan.form == ("layout" if max_states == 256 else "sets")
    k = best_state(fan, 0, [0, 0, 0])
    assert fan.producer_cost[0, k] + sum(m[k, 0] for m in fan.consumer_costs) == 4.0
    mixed = best_state(fan, 0, [0, 1, 1])  # one wants it gathered, two want the other layout: 4 + 1
    assert (
        fan.producer_cost[0, mixed]
        + sum(m[mixed, b] for m, b in zip(fan.consumer_costs, [0, 1, 1], strict=True))
        == 5.0
    )


def test_four_consumers_beyond_the_cap_are_an_upper_bound_and_say_so() -> None:
    fan = fanout_node(np.ones((1, 3)), [np.array([0, 1, 2])] * 4, max_states=4)
    assert fan is not None and fan.form == "layout" and not fan.exact
    assert fanout_node(np.ones((1, 3)), [np.array([0, 1])] * 4, max_states=1) is None
    assert fanout_node(np.ones((1, 3)), [np.array([0]), np.array([1])]) is None  # nothing to share
