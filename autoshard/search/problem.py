"""The search problem: plain arrays in, one strategy index per node out.

Input of the search stage (built by ``autoshard/problem`` from strategies and cost models; no torch, no fx):
every graph node ``i`` has ``S_i`` candidate strategies with a cost vector ``node_costs[i]`` (seconds); every
edge ``(u, v)`` has a cost matrix ``cost[s_u, s_v]`` (seconds of redistribution, forward + backward).  The
objective of an assignment ``choice`` is::

    sum_i node_costs[i][choice[i]] + sum_(u,v) edge.cost[choice[u], choice[v]]

subject to ``sum_i memory[i][choice[i]] + max_i peak[i][choice[i]] <= memory_limit`` (bytes per device)
when both are given, and to the ``allowed`` masks (user annotations).  ``peak`` (optional) holds what only
its largest instance costs, such as the largest temporary buffer: :mod:`~autoshard.search.peak` solves it
exactly as a threshold on the other solvers' plain problems.  ``+inf`` marks a forbidden option or combination.

Example::

    >>> import numpy as np
    >>> p = SearchProblem(node_costs=(np.array([1.0, 2.0]), np.array([0.0, 0.0])),
    ...                   edges=(Edge(0, 1, np.array([[0.0, 5.0], [5.0, 0.0]])),), names=("a", "b"))
    >>> evaluate(p, (0, 0)), evaluate(p, (0, 1))
    (1.0, 6.0)

This module also holds the :class:`Solution` record every solver returns and :func:`pairwise_form`, the
normalised view the solvers work on (masks folded in as ``inf``, parallel edges summed).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from autoshard.errors import AnnotationError, InfeasibleError

__all__ = [
    "AnnotationConflictError",
    "Edge",
    "PairwiseForm",
    "SearchProblem",
    "Solution",
    "evaluate",
    "format_bytes",
    "memory_infeasible_error",
    "memory_left",
    "memory_lower_bound",
    "memory_of",
    "pairwise_form",
    "peak_floor",
    "relative_gap",
]


class AnnotationConflictError(AnnotationError, InfeasibleError):
    """Annotations (allowed strategies) that no finite-cost plan can satisfy together.

    Both an :class:`AnnotationError` (the user's annotations are the cause) and an :class:`InfeasibleError`
    (no plan exists), so either ``except`` clause catches it.
    """


def _check_costs(what: str, arrays: Sequence[np.ndarray]) -> None:
    """Refuse NaN and negative costs, checking all arrays in one vectorised pass."""
    if not arrays:
        return
    flat = arrays[0].ravel() if len(arrays) == 1 else np.concatenate([a.ravel() for a in arrays])
    if not (np.isnan(flat).any() or (flat < 0).any()):
        return
    k = next(k for k, a in enumerate(arrays) if np.isnan(a).any() or (a < 0).any())
    where = what if len(arrays) == 1 else f"{what}[{k}]"
    raise ValueError(f"{where} has NaN or negative entries; costs are seconds >= 0 (use +inf to forbid)")


@dataclass(frozen=True, slots=True, eq=False)
class Edge:
    """Data flowing from node ``u`` to node ``v``; ``cost[s_u, s_v]`` prices that pair of strategies."""

    u: int
    v: int
    cost: np.ndarray

    def __post_init__(self) -> None:
        object.__setattr__(self, "cost", np.asarray(self.cost, dtype=np.float64))
        if self.u == self.v:
            raise ValueError(f"edge ({self.u}, {self.v}) is a self-edge; fold its cost into the node cost")
        if self.cost.ndim != 2:
            raise ValueError(f"edge ({self.u}, {self.v}) cost must be a 2-D [S_u, S_v] matrix")
        # checked once here, not by every problem that holds the edge: a planner's problems share their
        # edges (a budget or mask changed, costs re-weighted node by node), ~19 MB of them on LLaMA-3-70B
        _check_costs(f"edge ({self.u}, {self.v}) cost", [self.cost])

    def __repr__(self) -> str:
        return f"Edge({self.u}->{self.v}, shape={self.cost.shape})"


@dataclass(frozen=True, slots=True, eq=False)
class SearchProblem:
    """One strategy per node, minimising node + edge cost under an optional memory budget.

    Attributes:
        node_costs: per node a float64 vector ``[S_i]`` of seconds; ``inf`` forbids a strategy.
        edges: pairwise costs; several edges between the same pair are summed, self-edges are refused.
        names: per node a name used in messages (the fx node name upstream).
        memory: per node a vector ``[S_i]`` of bytes per device, or None for no memory model.
        memory_limit: bytes per device every plan must fit in, or None for no budget (needs ``memory``).
        allowed: per node a bool mask ``[S_i]`` (None = all allowed) from user annotations, or None.
        strategy_labels: per node one label per strategy (e.g. ``"(S(0), R) -> S(0)"``) for explanations.
        peak: per node a vector ``[S_i]`` of bytes of which only the largest over nodes counts (added to the
            sum of ``memory``), or None; needs ``memory``.
    """

    node_costs: tuple[np.ndarray, ...]
    edges: tuple[Edge, ...]
    names: tuple[str, ...]
    memory: tuple[np.ndarray, ...] | None = None
    memory_limit: float | None = None
    allowed: tuple[np.ndarray | None, ...] | None = None
    strategy_labels: tuple[tuple[str, ...], ...] | None = None
    peak: tuple[np.ndarray, ...] | None = None

    def __post_init__(self) -> None:
        costs = tuple(np.asarray(c, dtype=np.float64) for c in self.node_costs)
        object.__setattr__(self, "node_costs", costs)
        object.__setattr__(self, "edges", tuple(self.edges))
        object.__setattr__(self, "names", tuple(self.names))
        if len(self.names) != len(costs):
            raise ValueError(f"names has {len(self.names)} entries for {len(costs)} nodes; give one per node")
        for i, c in enumerate(costs):
            if c.ndim != 1 or c.size == 0:
                raise ValueError(f"node_costs[{i}] ({self.names[i]}) must be a non-empty 1-D vector")
        _check_costs("node_costs", costs)
        self._check_edges()
        self._check_memory()
        self._check_allowed()
        self._check_labels()

    @property
    def num_nodes(self) -> int:
        return len(self.node_costs)

    @property
    def sizes(self) -> tuple[int, ...]:
        """``S_i`` for every node."""
        return tuple(c.size for c in self.node_costs)

    def _check_edges(self) -> None:
        n = self.num_nodes
        for k, e in enumerate(self.edges):
            if not (0 <= e.u < n and 0 <= e.v < n):
                raise ValueError(f"edges[{k}] = ({e.u}, {e.v}) names a node outside 0..{n - 1}")
            want = (self.node_costs[e.u].size, self.node_costs[e.v].size)
            if e.cost.shape != want:
                raise ValueError(
                    f"edges[{k}] {self.names[e.u]} -> {self.names[e.v]} has cost shape {e.cost.shape}; "
                    f"expected [S_u, S_v] = {want}"
                )

    def _check_memory(self) -> None:
        if self.memory is None:
            if self.memory_limit is not None:
                raise ValueError("memory_limit is set but memory is None; give per-strategy memory vectors")
            return
        mem = tuple(np.asarray(m, dtype=np.float64) for m in self.memory)
        object.__setattr__(self, "memory", mem)
        if len(mem) != self.num_nodes:
            raise ValueError(f"memory has {len(mem)} vectors for {self.num_nodes} nodes; give one per node")
        for i, m in enumerate(mem):
            if m.shape != self.node_costs[i].shape:
                raise ValueError(f"memory[{i}] ({self.names[i]}) shape {m.shape} != node cost shape")
            if not np.isfinite(m).all() or (m < 0).any():
                raise ValueError(f"memory[{i}] ({self.names[i]}) must be finite bytes >= 0")
        if self.peak is not None:
            peak = tuple(np.asarray(m, dtype=np.float64) for m in self.peak)
            object.__setattr__(self, "peak", peak)
            if len(peak) != self.num_nodes or any(
                p.shape != c.shape or not np.isfinite(p).all() or (p < 0).any()
                for p, c in zip(peak, self.node_costs, strict=True)
            ):
                raise ValueError(
                    "peak must hold one vector of finite bytes >= 0 per node, shaped like its costs"
                )
        if self.memory_limit is not None and not (
            self.memory_limit >= 0 and math.isfinite(self.memory_limit)
        ):
            raise ValueError(f"memory_limit {self.memory_limit} must be finite bytes >= 0 (None = no budget)")

    def _check_allowed(self) -> None:
        if self.allowed is None:
            return
        if len(self.allowed) != self.num_nodes:
            raise ValueError(f"allowed has {len(self.allowed)} masks for {self.num_nodes} nodes")
        masks: list[np.ndarray | None] = []
        for i, a in enumerate(self.allowed):
            if a is None:
                masks.append(None)
                continue
            mask = np.asarray(a, dtype=bool)
            if mask.shape != self.node_costs[i].shape:
                raise ValueError(f"allowed[{i}] ({self.names[i]}) shape {mask.shape} != node cost shape")
            if not mask.any():
                raise AnnotationError(f"graph node {self.names[i]}: the annotation allows no strategy at all")
            masks.append(mask)
        object.__setattr__(self, "allowed", tuple(masks))

    def _check_labels(self) -> None:
        if self.strategy_labels is None:
            return
        if len(self.strategy_labels) != self.num_nodes or any(
            len(lab) != c.size for lab, c in zip(self.strategy_labels, self.node_costs, strict=True)
        ):
            raise ValueError("strategy_labels must hold one label per strategy of every node")

    def label(self, node: int, strategy: int) -> str:
        """``name=label`` of one strategy, for messages."""
        if self.strategy_labels is None:
            return f"{self.names[node]}#{strategy}"
        return f"{self.names[node]}={self.strategy_labels[node][strategy]}"


@dataclass(frozen=True, slots=True)
class Solution:
    """What a solver returns: the choice, its objective and how far from optimal it can be.

    ``lower_bound`` is a proven bound on the optimum (``objective`` when proven optimal); ``gap`` is
    ``(objective - lower_bound) / objective`` (0 when both are 0).  ``optimal`` is True only when proven.
    """

    choice: tuple[int, ...]
    objective: float
    lower_bound: float
    gap: float
    optimal: bool
    method: str
    seconds: float
    log: tuple[str, ...] = field(default=())
    # False when a memory budget was set but the unconstrained optimum fits it (the budget changed nothing);
    # None when there was no budget or the solver did not find out
    budget_binding: bool | None = None
    # the Lagrange multiplier of the budget at the best bound of a budgeted solve (cost per byte): where a
    # similar problem's sweep starts (``solve(multiplier=)``); None without a Lagrangian sweep
    multiplier: float | None = None
    # the dominance removals of the solve's first reduction (``reduce.Certificates``): a hint that spares a
    # similar problem's reduction most of its dominance search (``solve(dominated=)``)
    dominated: tuple[tuple[int, np.ndarray, np.ndarray], ...] = field(default=(), compare=False, repr=False)


def relative_gap(objective: float, lower_bound: float) -> float:
    """``(objective - lower_bound) / objective``, clipped at 0; 0 when both are 0, inf when unknown."""
    if not math.isfinite(objective) or not math.isfinite(lower_bound):
        return math.inf
    if objective <= 0.0:
        return 0.0 if lower_bound >= objective else math.inf
    return max(0.0, (objective - lower_bound) / objective)


def _check_choice(problem: SearchProblem, choice: Sequence[int]) -> None:
    if len(choice) != problem.num_nodes:
        raise ValueError(f"choice has {len(choice)} entries for {problem.num_nodes} nodes")
    for i, s in enumerate(choice):
        if not 0 <= s < problem.node_costs[i].size:
            raise ValueError(f"choice[{i}] = {s} is outside 0..{problem.node_costs[i].size - 1}")


def evaluate(problem: SearchProblem, choice: Sequence[int]) -> float:
    """Objective of any assignment; ``inf`` if it picks a forbidden option or breaks an ``allowed`` mask."""
    _check_choice(problem, choice)
    if problem.allowed is not None:
        for i, mask in enumerate(problem.allowed):
            if mask is not None and not mask[choice[i]]:
                return math.inf
    total = math.fsum(float(c[choice[i]]) for i, c in enumerate(problem.node_costs))
    total += math.fsum(float(e.cost[choice[e.u], choice[e.v]]) for e in problem.edges)
    return total


def memory_of(problem: SearchProblem, choice: Sequence[int]) -> float:
    """Bytes per device the assignment needs (0 without a memory model)."""
    _check_choice(problem, choice)
    if problem.memory is None:
        return 0.0
    total = math.fsum(float(m[choice[i]]) for i, m in enumerate(problem.memory))
    if problem.peak is not None:
        total += max((float(p[choice[i]]) for i, p in enumerate(problem.peak)), default=0.0)
    return total


@dataclass(frozen=True, slots=True, eq=False)
class PairwiseForm:
    """The normalised view solvers use: masks folded into unary costs, parallel edges summed.

    ``pairs[(u, v)]`` with ``u < v`` is indexed ``[s_u, s_v]`` whatever the direction of the original edges.
    """

    unary: tuple[np.ndarray, ...]
    pairs: dict[tuple[int, int], np.ndarray]

    def neighbours(self) -> list[list[int]]:
        adj: list[list[int]] = [[] for _ in self.unary]
        for u, v in self.pairs:
            adj[u].append(v)
            adj[v].append(u)
        return adj


def _unary(problem: SearchProblem) -> list[np.ndarray]:
    """:func:`pairwise_form`'s unary costs alone (forbidden strategies at ``inf``), without the pair matrices."""
    unary = []
    for i, c in enumerate(problem.node_costs):
        mask = None if problem.allowed is None else problem.allowed[i]
        unary.append(c.copy() if mask is None else np.where(mask, c, np.inf))
    return unary


def pairwise_form(problem: SearchProblem) -> PairwiseForm:
    """Unary costs with forbidden strategies at ``inf``; one ``[S_u, S_v]`` matrix per node pair ``u < v``."""
    unary = _unary(problem)
    pairs: dict[tuple[int, int], np.ndarray] = {}
    for e in problem.edges:
        key, mat = ((e.u, e.v), e.cost) if e.u < e.v else ((e.v, e.u), e.cost.T)
        pairs[key] = pairs[key] + mat if key in pairs else mat.copy()
    return PairwiseForm(unary=tuple(unary), pairs=pairs)


def format_bytes(num: float) -> str:
    """``1536 -> '1.50 KiB'``: human-readable bytes for messages."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(num) < 1024 or unit == "TiB":
            if unit == "B":  # a fraction of a byte as given (memory_limit=0.001 read "0 B": new-user trial)
                return f"{num:.0f} B" if abs(num) >= 1 or num == 0 else f"{num:.3g} B"
            return f"{num:.2f} {unit}"
        num /= 1024
    raise AssertionError("unreachable")


def _both(num: float) -> str:
    """``'3.00 KiB (3072 B)'``: readable and exact."""
    return format_bytes(num) + (f" ({num:.0f} B)" if num >= 1024 else "")


def memory_lower_bound(problem: SearchProblem) -> float:
    """Sum over nodes of the least memory among allowed finite-cost strategies: no plan needs less."""
    assert problem.memory is not None
    total = math.fsum(
        float(m[np.isfinite(u)].min(initial=math.inf))
        for u, m in zip(_unary(problem), problem.memory, strict=True)
    )
    return total + peak_floor(problem)


def peak_floor(problem: SearchProblem) -> float:
    """The least ``max_i peak[i]`` any plan has: each node's least peak among its allowed strategies."""
    if problem.peak is None:
        return 0.0
    least = [
        float(p[np.isfinite(u)].min(initial=math.inf))
        for u, p in zip(_unary(problem), problem.peak, strict=True)
    ]
    return max((x for x in least if math.isfinite(x)), default=0.0)


def memory_infeasible_error(
    problem: SearchProblem, floor: float, least_plan: float | None, why: str = ""
) -> InfeasibleError:
    """The error for a memory budget no plan meets: the least memory any plan needs and what to change.

    ``floor`` is :func:`memory_lower_bound`; ``least_plan`` the memory of the least-memory finite-cost plan
    when it could be computed exactly (it can exceed ``floor`` when forbidden pairs rule out the per-node
    minima together).
    """
    limit = problem.memory_limit
    assert limit is not None
    need = least_plan if least_plan is not None else floor
    what = f"every plan needs at least {_both(floor)} (each node at its least memory)"
    if least_plan is not None:
        what = f"the least-memory plan needs {_both(least_plan)}" + (
            f"; {what}" if floor < least_plan else ""
        )
    return InfeasibleError(
        f"no plan fits the memory budget of {_both(limit)} per device: {what}"
        f"{'; ' + why if why else ''}. Fix: raise the memory limit to at least {format_bytes(need)}, "
        "spread the model over more devices (a larger mesh shards more), or relax annotations that pin "
        "replicated strategies."
    )


def memory_left(problem: SearchProblem, offset: float, nodes_left: bool) -> float | None:
    """The budget left for the nodes an exact reduction kept (``offset``: the folded nodes' memory); raises
    when the folded nodes alone exceed it."""
    if problem.memory_limit is None:
        return None
    left = problem.memory_limit - offset
    if left < 0:
        # Exact pruning keeps the least-memory plan, so with no node left, offset is its memory.
        if not nodes_left:
            raise memory_infeasible_error(problem, memory_lower_bound(problem), offset)
        why = f"the nodes with one strategy left after exact pruning already need {format_bytes(offset)}"
        raise memory_infeasible_error(problem, memory_lower_bound(problem), None, why)
    return left
