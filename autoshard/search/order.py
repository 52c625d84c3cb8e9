"""Elimination orders for variable elimination, and cutset conditioning when no order fits the table cap.

Input: the nodes to eliminate, their adjacency (the interaction graph) and their domain sizes.  Output: an
:class:`EliminationPlan`: the order (each step names the variable and the variables it meets), the nodes to
*condition* on (enumerate outside elimination) and the table sizes that plan builds.  Purely symbolic: no
costs are read, so one plan serves every unary cost vector (the Lagrangian sweep re-solves with new ones).

Orders.  Finding the order with the smallest largest table is NP-hard; greedy heuristics do well on graphs
of treewidth 2-5.  Three are run and the order with the smallest (largest table, total entries) kept:

* ``min-fill``: fewest new edges among the neighbours (ties: smallest new table);
* ``weighted-min-fill``: least ``sum S_a * S_b`` over the new edges ``(a, b)``, so a fill edge between two
  48-strategy nodes counts more than one between two 4-strategy nodes (Kjaerulff's weighted min-fill);
* ``min-weight``: smallest new table ``S_v * prod S_neighbours``.

All ties break on the node index, so the order is deterministic.

Conditioning.  When every order builds a table over the cap, removing a node ``c`` from the graph and
solving once per strategy of ``c`` (its edges become unary costs of its neighbours) is exact and needs only
the smaller tables of the graph without ``c``.  Candidates are the nodes in the scopes of the over-cap tables;
the one that brings the largest table under the cap with the least total work (tables x enumerations) wins,
and a second node is added the same way if one is not enough.

Example::

    >>> adj = [[1, 2, 3], [0, 2, 3], [0, 1, 3], [0, 1, 2]]          # K4: one table over all 4 nodes
    >>> plan_elimination(range(4), adj, [10] * 4, cap=1e4).largest
    10000
    >>> p = plan_elimination(range(4), adj, [10] * 4, cap=1e3); p.conditioned, p.largest
    ((0,), 1000)
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

__all__ = [
    "HEURISTICS",
    "MAX_CONDITIONED",
    "MAX_WORK",
    "EliminationPlan",
    "FactorCapExceeded",
    "Step",
    "greedy_order",
    "plan_elimination",
]

#: Nodes cutset conditioning may enumerate together (their strategy counts multiply the work).
MAX_CONDITIONED = 2

#: Table entries summed over all steps and all conditioned assignments that a plan may cost: about 10 s of
#: numpy min-plus work on this project's machines since each table is reduced in one pass (the 405B-shaped
#: LLaMA at 128K on 128 x 16 x 8: 1.0e9 entries, ~4 CPU s, where CP-SAT ran 40 s without proving its plan).
#: Above it CP-SAT is the better bet.
MAX_WORK = 2e9


class FactorCapExceeded(Exception):
    """Internal signal: variable elimination would build a table over the size cap (treewidth too high)."""

    def __init__(self, size: float, cap: float, node: int, why: str = "") -> None:
        super().__init__(
            f"variable elimination needs a table of {size:.3g} entries at graph node {node} (cap {cap:.3g}){why}"
        )
        self.size = size
        self.cap = cap
        self.node = node


@dataclass(frozen=True, slots=True)
class Step:
    """Eliminate ``var``: it meets the remaining variables ``rest`` (sorted) when it goes."""

    var: int
    rest: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class EliminationPlan:
    """An elimination order over the nodes that are not ``conditioned``, and what it costs.

    ``largest``: entries of the largest table; ``work``: entries of all tables times the number of
    conditioned assignments; ``heuristic``: the greedy rule that produced the order.
    """

    steps: tuple[Step, ...]
    conditioned: tuple[int, ...]
    largest: int
    work: float
    heuristic: str


_Key = Callable[[int, int, int, float], tuple[float, ...]]


def _keys() -> dict[str, _Key]:
    """Per heuristic, the heap key from (node, fill edges, their ``sum S_a * S_b``, log of the new table)."""
    return {
        "min-fill": lambda v, fill, weight, logw: (fill, logw, v),
        "weighted-min-fill": lambda v, fill, weight, logw: (weight, logw, v),
        "min-weight": lambda v, fill, weight, logw: (logw, fill, v),
    }


HEURISTICS: tuple[str, ...] = ("min-fill", "weighted-min-fill", "min-weight")


def greedy_order(
    nodes: Iterable[int], adj: Sequence[Iterable[int]], sizes: Sequence[int], heuristic: str
) -> list[Step]:
    """Eliminate greedily by ``heuristic`` (one of :data:`HEURISTICS`), with lazy heap updates.

    ``adj`` may name nodes outside ``nodes``: those edges are ignored (the nodes are conditioned on).
    """
    key_of = _keys()[heuristic]
    weighted = heuristic == "weighted-min-fill"
    members = set(nodes)
    graph = {v: {w for w in adj[v] if w in members} for v in members}
    logsize = {v: math.log(sizes[v]) for v in members}
    stamp = dict.fromkeys(members, 0)

    def key(v: int) -> tuple[tuple[float, ...], int, int]:
        around = graph[v]
        nb = sorted(around)
        # each missing pair among the neighbours is met twice, once from each end (integers: exact halves)
        fill = weight = 0
        for a in nb:
            missing = around - graph[a]
            missing.discard(a)
            fill += len(missing)
            if weighted:
                weight += sizes[a] * sum(sizes[b] for b in missing)
        logw = logsize[v] + sum(logsize[w] for w in nb)
        return (key_of(v, fill // 2, weight // 2, logw), v, stamp[v])

    heap = [key(v) for v in sorted(members)]
    heapq.heapify(heap)
    out = []
    while heap:
        _, v, st = heapq.heappop(heap)
        if v not in graph or st != stamp[v]:
            continue
        nb = sorted(graph.pop(v))
        for a in nb:
            graph[a].discard(v)
            graph[a].update(w for w in nb if w != a)
        out.append(Step(v, tuple(nb)))
        for w in set(nb).union(*(graph[a] for a in nb)) if nb else ():
            stamp[w] += 1
            heapq.heappush(heap, key(w))
    return out


def _tables(steps: Sequence[Step], sizes: Sequence[int]) -> list[int]:
    return [sizes[s.var] * math.prod(sizes[w] for w in s.rest) for s in steps]


def _best_order(
    nodes: Sequence[int], adj: Sequence[Iterable[int]], sizes: Sequence[int], conditioned: tuple[int, ...]
) -> EliminationPlan:
    """The best of the greedy heuristics on ``nodes`` without ``conditioned``."""
    skip = set(conditioned)
    rest = [v for v in nodes if v not in skip]
    runs = math.prod(sizes[c] for c in conditioned)
    best: EliminationPlan | None = None
    for name in HEURISTICS:
        steps = greedy_order(rest, adj, sizes, name)
        tables = _tables(steps, sizes)
        plan = EliminationPlan(
            tuple(steps), conditioned, max(tables, default=0), float(runs * sum(tables)), name
        )
        if best is None or (plan.largest, plan.work) < (best.largest, best.work):
            best = plan
    assert best is not None
    return best


def plan_elimination(
    nodes: Iterable[int],
    adj: Sequence[Iterable[int]],
    sizes: Sequence[int],
    cap: float,
    *,
    max_conditioned: int = MAX_CONDITIONED,
    max_work: float = MAX_WORK,
    wide: Callable[[], object] | None = None,
) -> EliminationPlan:
    """The cheapest plan whose tables stay within ``cap`` entries, conditioning on up to ``max_conditioned``
    nodes when needed; raises :class:`FactorCapExceeded` when none fits (or the fitting one costs more than
    ``max_work`` entries in all).  ``wide``: called once before the conditioning search, when no order fits
    the cap (the dispatcher's hinted bound: search/hinted.py; an exception it raises ends the planning)."""
    order = sorted(nodes)
    plan = _best_order(order, adj, sizes, ())
    cap = cap * (1 + 1e-9)
    if wide is not None and plan.largest > cap:
        wide()
    while plan.largest > cap and len(plan.conditioned) < max_conditioned:
        big = sorted(
            {
                w
                for s, t in zip(plan.steps, _tables(plan.steps, sizes), strict=True)
                if t > cap
                for w in (s.var, *s.rest)
            }
        )
        trials = [_best_order(order, adj, sizes, (*plan.conditioned, c)) for c in big]
        # Under the cap with the least work first; otherwise the smallest largest table.
        plan = min(trials, key=lambda p: (p.largest > cap, p.work if p.largest <= cap else p.largest))
    if plan.largest > cap or plan.work > max_work:
        where = max(zip(_tables(plan.steps, sizes), (s.var for s in plan.steps), strict=True))
        why = (
            f" even after conditioning on {len(plan.conditioned)} node(s)"
            if plan.largest > cap
            else f"; conditioning would cost {plan.work:.3g} entries in all (limit {max_work:.3g})"
        )
        raise FactorCapExceeded(float(where[0]), cap / (1 + 1e-9), where[1], why)
    return plan
