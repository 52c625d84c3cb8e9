"""Sharding propagation: a full plan in milliseconds by spreading annotated strategies over the graph.

Input: a :class:`~autoshard.search.problem.SearchProblem` whose pinned nodes (an ``allowed`` mask with one
``True``, or the explicit ``pins``) are the annotations.  Output: one strategy per node.

The MindSpore-style "L1" pass: breadth-first from the pinned nodes over the edges in both directions; each
newly reached node takes the strategy that minimises its node cost plus the edge costs to its already-assigned
neighbours.  A component without pins starts from its lowest-index node (usually the graph input) at its
cheapest strategy.  Arc consistency runs first, so a node only considers strategies that still have a
finite-cost partner at every neighbour; on a tree that guarantees a finite plan, on graphs with cycles the
greedy step can still hit a dead end (the caller checks the objective and falls back to an exact solver).

Conflicting annotations are found before any choice is made: when the pins together empty a node's domain,
:class:`~autoshard.search.problem.AnnotationConflictError` (an ``AnnotationError``) names the pinned nodes on
each side and the node where they meet.

The plan is not optimal; it is the fast answer and the warm start of CP-SAT.

Example::

    >>> import numpy as np
    >>> from autoshard.search.problem import Edge, SearchProblem
    >>> swap = np.array([[0.0, 1.0], [1.0, 0.0]])
    >>> p = SearchProblem((np.zeros(2), np.zeros(2), np.zeros(2)), (Edge(0, 1, swap), Edge(1, 2, swap)),
    ...                   ("a", "b", "c"), allowed=(np.array([False, True]), None, None))
    >>> propagate(p)
    (1, 1, 1)
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Mapping, Sequence

import numpy as np

from autoshard.errors import AnnotationError
from autoshard.search.problem import PairwiseForm, SearchProblem, pairwise_form
from autoshard.search.reduce import prune_domains

__all__ = ["pinned_nodes", "propagate", "with_pins"]


def pinned_nodes(problem: SearchProblem) -> dict[int, int]:
    """``{node: strategy}`` for every node whose ``allowed`` mask admits exactly one strategy."""
    if problem.allowed is None:
        return {}
    return {
        i: int(np.flatnonzero(m)[0]) for i, m in enumerate(problem.allowed) if m is not None and m.sum() == 1
    }


def with_pins(problem: SearchProblem, pins: Mapping[int, int]) -> SearchProblem:
    """``problem`` with extra one-strategy masks; AnnotationError for a pin outside the current mask."""
    masks = list(problem.allowed) if problem.allowed is not None else [None] * problem.num_nodes
    for node, s in pins.items():
        if not 0 <= node < problem.num_nodes or not 0 <= s < problem.node_costs[node].size:
            raise AnnotationError(f"pin {node} -> {s} is outside the problem (node or strategy index)")
        old = masks[node]
        if old is not None and not old[s]:
            raise AnnotationError(
                f"pin of {problem.label(node, s)} contradicts the node's allowed strategies"
            )
        masks[node] = np.arange(problem.node_costs[node].size) == s
    return dataclasses.replace(problem, allowed=tuple(masks))


class _Spread:
    """Greedy breadth-first assignment over arc-consistent domains."""

    def __init__(self, form: PairwiseForm, live: Sequence[np.ndarray]) -> None:
        self.form = form
        self.unary = [np.where(ok, u, np.inf) for u, ok in zip(form.unary, live, strict=True)]
        self.adj = [sorted(a) for a in form.neighbours()]
        self.choice = [-1] * len(self.unary)

    def _pair(self, a: int, b: int) -> np.ndarray:
        return self.form.pairs[(a, b)] if a < b else self.form.pairs[(b, a)].T

    def assign(self, v: int) -> None:
        """Cheapest strategy of ``v`` given its assigned neighbours, looking one step ahead.

        Each unassigned neighbour contributes its cheapest completion (its best strategy given ``v``'s), so a
        choice that merely postpones a redistribution (a row-split layer whose partial output the next op must
        reduce) loses to one that avoids it.  At a dead end: fewest ``inf`` terms.
        """
        cost = self.unary[v].copy()
        ahead = np.zeros(cost.size)
        broken = np.zeros(cost.size)
        for w in self.adj[v]:
            pair = self._pair(v, w)
            if self.choice[w] >= 0:
                col = pair[:, self.choice[w]]
                cost += col
                broken += np.isinf(col)
            else:
                ahead += np.min(pair + self.unary[w][None, :], axis=1)
        looking = cost + ahead
        if np.isfinite(looking).any():
            self.choice[v] = int(np.argmin(looking))
            return
        if np.isfinite(cost).any():
            self.choice[v] = int(np.argmin(cost))
            return
        finite_part = np.where(np.isfinite(self.unary[v]), 0.0, np.inf)
        self.choice[v] = int(np.lexsort((np.arange(cost.size), broken + finite_part))[0])

    def spread(self, seeds: Sequence[int]) -> None:
        queue = deque(seeds)
        while queue:
            x = queue.popleft()
            for y in self.adj[x]:
                if self.choice[y] < 0:
                    self.assign(y)
                    queue.append(y)

    def run(self, pins: Mapping[int, int]) -> tuple[int, ...]:
        for node in sorted(pins):
            self.choice[node] = pins[node]
        self.spread(sorted(pins))
        for root in range(len(self.choice)):
            if self.choice[root] < 0:
                self.assign(root)
                self.spread([root])
        return tuple(self.choice)


def propagate(problem: SearchProblem, pins: Mapping[int, int] | None = None) -> tuple[int, ...]:
    """A full plan by propagation from the pinned nodes (``allowed`` masks with one strategy, plus ``pins``).

    Raises :class:`~autoshard.search.problem.AnnotationConflictError` when the pins contradict each other
    and :class:`~autoshard.errors.InfeasibleError` when the costs alone admit no finite plan.
    """
    if pins:
        problem = with_pins(problem, pins)
    form = pairwise_form(problem)
    live = prune_domains(problem, form)
    return _Spread(form, live).run(pinned_nodes(problem))
