"""Fan-out nodes: one redistribution per (tensor, target layout), priced exactly in a pairwise problem.

A tensor read by several consumers is moved once per distinct layout they want: consumers that want the
same layout share one redistribution forward, and their gradients are summed before one reduction
backward.  Its true cost is a function of the producer *and all its consumers at once*::

    cost(a, b_1 .. b_k) = sum over the distinct elements e in {elem_1[b_1], .., elem_k[b_k]} of C[a, e]

where ``elem_j[b]`` names what consumer ``j`` running strategy ``b`` needs (its forward layout and its
gradient layout: the *element*) and ``C[a, e] >= 0`` is that element's forward + backward redistribution
time when the producer runs ``a``.  That is not a sum of pairwise terms, so the solver gets one extra
variable per shared tensor, the **fan-out node** ``F``, which replaces the producer's edges to these
consumers.  It takes whichever of two exact forms has fewer states:

- **sets**: a state is a set ``s`` of elements, one of the sets some choice of the consumers produces;
  producer → F ``M[a, s] = sum_{e in s} C[a, e]``; F → consumer ``j``: 0 when ``elem_j[b] in s``, inf
  otherwise.  Every feasible plan picks a superset of the image and costs are >= 0, so the image itself is
  optimal and priced exactly.  Exact for any number of consumers.
- **layout**: a state is ``(a, L)``, a copy of the producer's strategy and the one shared element ``L``
  (or none), ``L`` among the elements at least two consumers can want; producer → F: ``C[a, L]`` when ``a``
  matches, inf otherwise; F → consumer ``j``: 0 when ``elem_j[b] == L``, else ``C[a, elem_j[b]]``.  This is
  the per-tensor layout variable; with at most 3 consumers at most one element can be wanted by two of
  them, so it is exact.  With 4 or more it is an upper bound (two layouts each shared by two consumers pay
  one of them twice); used there only when the sets exceed ``max_states``, and :attr:`FanOutNode.exact`
  says so.

``F`` sits where the producer's star of edges was (producer – F – consumers), so the treewidth variable
elimination sees does not grow.  The layout form is preferred for up to 3 consumers: its F → consumer costs
are finite, so dominance (:mod:`autoshard.search.dominance`) still prunes the consumers' strategies (the
sets form's 0/inf matrices stop it, and variable elimination then meets wide tables).  When no element can
be wanted by two consumers there is nothing to share and :func:`fanout_node` returns None (plain edges are
exact); above ``max_states`` it returns None too, and the caller prices those edges one by one and says so.

Example::

    >>> import numpy as np
    >>> fan = fanout_node(np.array([[0.0, 2.0]]), [np.array([0, 1]), np.array([1, 1])])
    >>> fan.form, [fan.label(k) for k in range(len(fan.states))], fan.producer_cost.tolist()
    ('layout', ['a0:L-', 'a0:L1'], [[0.0, 2.0]])
    >>> fan.consumer_costs[0].tolist()          # consumer 0 wanting element 0 pays it alone
    [[0.0, 2.0], [0.0, 0.0]]
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["MAX_FANOUT_STATES", "FanOutNode", "best_state", "fanout_node", "fanout_sets", "shareable"]

#: States of one fan-out node above which it is not built.  Dominance (search/dominance.py) costs the square
#: of a node's states: at 1024, LLaMA-3-8B on an 8 x 8 mesh solved in 8-11 s instead of 0.1 s; at 256 in
#: 0.2 s, its q/k/v fan-out (864 states) then priced per consumer, as the build notes say.
MAX_FANOUT_STATES = 256

State = frozenset[int] | tuple[int, int]  # sets form: elements; layout form: (producer strategy, L or -1)


def fanout_sets(
    entries: Sequence[np.ndarray], max_states: int = MAX_FANOUT_STATES
) -> tuple[frozenset[int], ...] | None:
    """Every set of elements some choice of the consumers produces, sorted by size then content; None when
    more than ``max_states``."""
    sets: set[frozenset[int]] = {frozenset()}
    for entry in entries:
        distinct = sorted({int(e) for e in entry})
        grown: set[frozenset[int]] = set()
        for s in sets:
            grown.update(s | {e} for e in distinct)
            if len(grown) > max_states:  # stop as soon as the bound is passed: the full set can be huge
                return None
        sets = grown
    return tuple(sorted(sets, key=lambda s: (len(s), sorted(s))))


@dataclass(frozen=True, slots=True, eq=False)
class FanOutNode:
    """Arrays of one fan-out node (module docstring)."""

    form: str  # "sets" | "layout"
    exact: bool
    states: tuple[State, ...]
    producer_cost: np.ndarray  # [S_producer, K]
    consumer_costs: tuple[np.ndarray, ...]  # per consumer entry [K, S_consumer]

    def label(self, k: int) -> str:
        """``"{0, 3}"`` (sets form) or ``"a2:L3"`` (layout form, ``L-`` for none)."""
        state = self.states[k]
        if isinstance(state, frozenset):
            return "{" + ", ".join(str(e) for e in sorted(state)) + "}"
        return f"a{state[0]}:L{state[1] if state[1] >= 0 else '-'}"


def fanout_node(
    element_cost: np.ndarray, entries: Sequence[np.ndarray], max_states: int = MAX_FANOUT_STATES
) -> FanOutNode | None:
    """The fan-out node for ``C = element_cost`` (``[S_producer, E]``) and ``entries[j]`` (element of
    consumer ``j`` per strategy); None when no element is common to two consumers (nothing to share) or
    when both forms exceed ``max_states`` (:func:`shareable` tells the two apart)."""
    cost = np.asarray(element_cost, dtype=np.float64)
    common = _common(entries)
    if not common:
        return None
    layout_size = cost.shape[0] * (len(common) + 1)
    if len(entries) <= 3 and layout_size <= max_states:  # exact; its finite costs leave dominance its power
        return _layout_node(cost, entries, common, exact=True)
    sets = fanout_sets(entries, max_states)
    if sets is not None:
        return _sets_node(cost, entries, sets)
    if layout_size <= max_states:
        return _layout_node(cost, entries, common, exact=False)
    return None


def _common(entries: Sequence[np.ndarray]) -> set[int]:
    seen = Counter(e for entry in entries for e in {int(x) for x in entry})
    return {e for e, n in seen.items() if n >= 2}


def shareable(entries: Sequence[np.ndarray]) -> bool:
    """Whether two consumers can want the same element at all."""
    return bool(_common(entries))


def _sets_node(
    cost: np.ndarray, entries: Sequence[np.ndarray], sets: tuple[frozenset[int], ...]
) -> FanOutNode:
    producer = np.zeros((cost.shape[0], len(sets)))
    for k, s in enumerate(sets):
        if s:
            producer[:, k] = cost[:, sorted(s)].sum(axis=1)
    consumers = []
    for entry in entries:
        member = np.array([[int(e) in s for e in entry] for s in sets], dtype=bool)
        consumers.append(np.where(member, 0.0, np.inf))
    return FanOutNode("sets", True, tuple(sets), producer, tuple(consumers))


def _layout_node(
    cost: np.ndarray, entries: Sequence[np.ndarray], common: set[int], *, exact: bool
) -> FanOutNode:
    shared = [-1, *sorted(common)]
    states = tuple((a, L) for a in range(cost.shape[0]) for L in shared)
    producer = np.full((cost.shape[0], len(states)), np.inf)
    for k, (a, L) in enumerate(states):
        producer[a, k] = cost[a, L] if L >= 0 else 0.0
    consumers = []
    for entry in entries:
        e = entry.astype(int)
        mat = np.empty((len(states), e.size))
        for k, (a, L) in enumerate(states):
            mat[k] = np.where(e == L, 0.0, cost[a, e])
        consumers.append(mat)
    return FanOutNode("layout", exact, states, producer, tuple(consumers))


def best_state(fan: FanOutNode, producer: int, consumers: Sequence[int]) -> int:
    """The state of ``fan`` that costs least once the producer and consumer strategies are fixed."""
    total = fan.producer_cost[producer].copy()
    for mat, b in zip(fan.consumer_costs, consumers, strict=True):
        total = total + mat[:, b]
    k = int(np.argmin(total))
    assert math.isfinite(float(total[k])), "no fan-out state covers these consumers"
    return k
