"""Fan-out nodes: one redistribution per (tensor, target layout), priced exactly in a pairwise problem.

A tensor read by several consumers is moved once per distinct layout they want: consumers that want the
same layout share one redistribution forward, and their gradients are summed before one reduction
backward.  Its true cost is a function of the producer *and all its consumers at once*::

    cost(a, b_1 .. b_k) = sum over the distinct elements e in {elem_1[b_1], .., elem_k[b_k]} of C[a, e]

where ``elem_j[b]`` names what consumer ``j`` running strategy ``b`` needs (its forward layout and its
gradient layout: the *element*), and ``C[a, e]`` is the forward + backward redistribution time of that
element when the producer runs ``a``.  That is not a sum of pairwise terms, so the solver gets one extra
variable per shared tensor, the **fan-out node** ``F``, whose states are sets of elements:

- edge producer → ``F``: ``M[a, s] = sum_{e in s} C[a, e]`` (each element of the set moved once);
- edge ``F`` → consumer ``j``: ``0`` where ``elem_j[b] in s``, ``inf`` otherwise (the set must cover it).

Exact: every feasible plan picks a set that contains the image ``{elem_j[b_j]}``; costs are >= 0, so the
image itself is an optimal state, and its cost is the true cost above.  The states are exactly the images
reachable by some choice of the consumers (never the full power set), so ``F`` stays small when consumers
agree on few layouts; the graph keeps its shape (``F`` sits where the producer's star of edges was), so
the treewidth that variable elimination sees does not grow.  :func:`fanout_states` returns None above
``max_states`` and the caller must price the edges one by one and say so.

Example::

    >>> import numpy as np
    >>> fan = fanout_node(np.array([[0.0, 2.0]]), [np.array([0, 1]), np.array([1, 1])])
    >>> [sorted(s) for s in fan.states]
    [[1], [0, 1]]
    >>> fan.producer_cost.tolist()
    [[2.0, 2.0]]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["MAX_FANOUT_STATES", "FanOutNode", "fanout_node", "fanout_state", "fanout_states"]

#: States of one fan-out node above which sharing is not modelled (the caller prices edges one by one).
#: A LLaMA layer on a 2-D mesh needs at most a few hundred; the VE tables stay below ``MAX_FACTOR_SIZE``.
MAX_FANOUT_STATES = 4096


def fanout_states(
    entries: Sequence[np.ndarray], max_states: int = MAX_FANOUT_STATES
) -> tuple[frozenset[int], ...] | None:
    """Every set of elements some choice of the consumers produces (``entries[j][b]`` = element of
    consumer ``j`` under strategy ``b``), sorted by size then content; None when more than ``max_states``."""
    sets: set[frozenset[int]] = {frozenset()}
    for entry in entries:
        distinct = sorted({int(e) for e in entry})
        sets = {s | {e} for s in sets for e in distinct}
        if len(sets) > max_states:
            return None
    return tuple(sorted(sets, key=lambda s: (len(s), sorted(s))))


@dataclass(frozen=True, slots=True, eq=False)
class FanOutNode:
    """The arrays of one fan-out node: its states, the producer → F matrix and one F → consumer matrix each."""

    states: tuple[frozenset[int], ...]
    producer_cost: np.ndarray  # [S_producer, K]
    consumer_costs: tuple[np.ndarray, ...]  # per consumer entry [K, S_consumer]: 0 or inf

    def label(self, k: int, names: Sequence[str] | None = None) -> str:
        """``"{R, S(1)}"``: state ``k`` as the set of element names."""
        items = sorted(self.states[k])
        return "{" + ", ".join(names[e] if names else str(e) for e in items) + "}"


def fanout_node(
    element_cost: np.ndarray, entries: Sequence[np.ndarray], max_states: int = MAX_FANOUT_STATES
) -> FanOutNode | None:
    """Arrays of the fan-out node (module docstring); ``element_cost[a, e]`` as ``C[a, e]``, ``entries[j]``
    the element of consumer ``j`` per strategy.  None when the states would exceed ``max_states``."""
    states = fanout_states(entries, max_states)
    if states is None:
        return None
    element_cost = np.asarray(element_cost, dtype=np.float64)
    producer = np.zeros((element_cost.shape[0], len(states)))
    for k, s in enumerate(states):
        if s:
            producer[:, k] = element_cost[:, sorted(s)].sum(axis=1)
    consumers = []
    for entry in entries:
        member = np.array([[int(e) in s for e in entry] for s in states], dtype=bool)
        consumers.append(np.where(member, 0.0, np.inf))
    return FanOutNode(states, producer, tuple(consumers))


def fanout_state(states: Sequence[frozenset[int]], image: set[int] | frozenset[int]) -> int:
    """The index of the state equal to ``image`` (the elements the consumers' choices need)."""
    want = frozenset(image)
    for k, s in enumerate(states):
        if s == want:
            return k
    raise ValueError(
        f"no fan-out state covers exactly {sorted(want)}; the states were built for other consumers"
    )
