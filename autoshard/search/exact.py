"""Exact minimisation without a memory budget: tree DP and variable elimination, in numpy.

Input: a :class:`~autoshard.search.problem.SearchProblem` (``memory`` is ignored here; masks become ``inf``).
Output: an :class:`ExactResult`, a provably optimal choice, or :class:`FactorCapExceeded` when the graph's
treewidth makes an intermediate table too large, so the caller can fall back to CP-SAT.

Method, per connected component of the interaction graph (nodes, and one edge per pair of nodes that share a
cost matrix):

* **tree DP** (chains, trees): root the component, send min-plus messages leaf to root
  ``m_c(s_p) = min_t [F(s_p, t) + b_c(t)]`` with ``b_c = unary_c + sum of the children's messages``, keep the
  argmin back-pointers, choose the root's best strategy and walk back down.  O(sum_e S_u S_v).
* **variable elimination** (everything else): a greedy min-fill order (ties: smallest new table, then node
  index, so it is deterministic) fixes the scopes up front; each step adds the factors that mention the
  variable, minimises it out and keeps the argmin table; back-substitution runs the order in reverse.
  The residual stream of a transformer gives treewidth 2-3, so tables stay at ``S^3``-``S^4`` entries.

Factors keep their variables in increasing order, so aligning a factor to a larger scope is a reshape, never a
transpose.  ``inf`` propagates through min-plus sums; an ``inf`` optimum means no finite plan exists.

Example::

    >>> import numpy as np
    >>> from autoshard.search.problem import Edge, SearchProblem
    >>> p = SearchProblem((np.array([0.0, 3.0]), np.array([3.0, 0.0])),
    ...                   (Edge(0, 1, np.array([[0.0, 2.0], [2.0, 0.0]])),), ("a", "b"))
    >>> r = solve_exact(p); r.choice, r.objective
    ((0, 1), 2.0)
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from autoshard.search.problem import PairwiseForm, SearchProblem, pairwise_form

__all__ = [
    "MAX_FACTOR_SIZE",
    "ExactResult",
    "ExactSolver",
    "FactorCapExceeded",
    "min_memory_plan",
    "solve_exact",
]

#: Largest intermediate table (entries) variable elimination builds before handing over to CP-SAT: 2e7
#: float64 entries are 160 MB, plus the argmin table.
MAX_FACTOR_SIZE = 20_000_000


class FactorCapExceeded(Exception):
    """Internal signal: variable elimination would build a table over the size cap (treewidth too high)."""

    def __init__(self, size: float, cap: float, node: int) -> None:
        super().__init__(
            f"variable elimination needs a table of {size:.3g} entries at node {node} (cap {cap:.3g})"
        )
        self.size = size
        self.cap = cap
        self.node = node


@dataclass(frozen=True, slots=True)
class ExactResult:
    """A provably optimal choice (ignoring memory); ``objective`` is ``inf`` when no finite plan exists."""

    choice: tuple[int, ...]
    objective: float
    method: str
    largest_factor: int
    width: int


@dataclass(frozen=True, slots=True)
class _Tree:
    """One tree component: nodes in BFS order from the root and each node's parent (-1 for the root)."""

    order: tuple[int, ...]
    parent: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class _Step:
    """Eliminate ``var``: it meets the remaining variables ``rest`` (sorted) when it goes."""

    var: int
    rest: tuple[int, ...]


def _components(n: int, adj: Sequence[Sequence[int]]) -> list[list[int]]:
    seen = [False] * n
    comps = []
    for root in range(n):
        if seen[root]:
            continue
        seen[root] = True
        comp, stack = [], [root]
        while stack:
            x = stack.pop()
            comp.append(x)
            for y in adj[x]:
                if not seen[y]:
                    seen[y] = True
                    stack.append(y)
        comps.append(sorted(comp))
    return comps


def _bfs_tree(root: int, adj: Sequence[Sequence[int]], parent: list[int]) -> tuple[int, ...]:
    order = [root]
    parent[root] = -1
    head = 0
    while head < len(order):
        x = order[head]
        head += 1
        for y in adj[x]:
            if y != parent[x]:
                parent[y] = x
                order.append(y)
    return tuple(order)


class _FillOrder:
    """Greedy min-fill elimination order over a set of nodes, with lazy heap updates."""

    def __init__(self, nodes: Sequence[int], adj: Sequence[Sequence[int]], sizes: Sequence[int]) -> None:
        self.adj = {v: set(adj[v]) for v in nodes}
        self.logsize = {v: math.log(sizes[v]) for v in nodes}
        self.stamp = dict.fromkeys(nodes, 0)
        self.heap = [self._key(v) for v in nodes]
        heapq.heapify(self.heap)

    def _key(self, v: int) -> tuple[int, float, int, int]:
        nb = list(self.adj[v])
        fill = sum(1 for k, a in enumerate(nb) for b in nb[k + 1 :] if b not in self.adj[a])
        weight = self.logsize[v] + sum(self.logsize[w] for w in nb)
        return (fill, weight, v, self.stamp[v])

    def steps(self, cap: float) -> list[_Step]:
        out = []
        while self.heap:
            _, weight, v, stamp = heapq.heappop(self.heap)
            if v not in self.stamp or stamp != self.stamp[v]:
                continue
            if math.exp(weight) > cap * (1 + 1e-9):
                raise FactorCapExceeded(math.exp(weight), cap, v)
            nb = sorted(self.adj.pop(v))
            del self.stamp[v]
            for a in nb:
                self.adj[a].discard(v)
                self.adj[a].update(w for w in nb if w != a)
            out.append(_Step(v, tuple(nb)))
            touched = set(nb).union(*(self.adj[a] for a in nb)) if nb else set()
            for w in touched:
                self.stamp[w] += 1
                heapq.heappush(self.heap, self._key(w))
        return out


class ExactSolver:
    """The elimination structure of one graph, reusable for many unary cost vectors (Lagrangian sweeps).

    Raises :class:`FactorCapExceeded` at construction when variable elimination would build a table over
    ``max_factor_size`` entries.
    """

    def __init__(self, form: PairwiseForm, max_factor_size: float = MAX_FACTOR_SIZE) -> None:
        self.form = form
        self.sizes = tuple(u.size for u in form.unary)
        n = len(self.sizes)
        adj = form.neighbours()
        self.trees: list[_Tree] = []
        ve_nodes: list[int] = []
        parent = [-1] * n
        for comp in _components(n, adj):
            num_edges = sum(len(adj[x]) for x in comp) // 2
            if num_edges == len(comp) - 1:
                order = _bfs_tree(comp[0], adj, parent)
                self.trees.append(_Tree(order, tuple(parent[x] for x in order)))
            else:
                ve_nodes.extend(comp)
        self.steps = _FillOrder(ve_nodes, adj, self.sizes).steps(max_factor_size) if ve_nodes else []
        tables = [self.sizes[s.var] * math.prod(self.sizes[w] for w in s.rest) for s in self.steps]
        tree_tables = [
            self.sizes[x] * self.sizes[p]
            for t in self.trees
            for x, p in zip(t.order, t.parent, strict=True)
            if p >= 0
        ]
        self.largest_factor = max([*tables, *tree_tables, *self.sizes], default=0)
        self.width = max([len(s.rest) for s in self.steps] + [1 if tree_tables else 0])
        kinds = (["tree-dp"] if self.trees else []) + (["variable-elimination"] if self.steps else [])
        self.method = "+".join(kinds) or "none"

    def _pair(self, a: int, b: int) -> np.ndarray:
        """Cost matrix indexed ``[s_a, s_b]``."""
        return self.form.pairs[(a, b)] if a < b else self.form.pairs[(b, a)].T

    def _solve_tree(self, tree: _Tree, unary: Sequence[np.ndarray], choice: np.ndarray) -> float:
        belief = {x: unary[x].astype(np.float64, copy=True) for x in tree.order}
        back: dict[int, np.ndarray] = {}
        for x, p in zip(reversed(tree.order), reversed(tree.parent), strict=True):
            if p < 0:
                continue
            table = self._pair(p, x) + belief[x][None, :]  # (S_p, S_x)
            arg = np.argmin(table, axis=1)
            back[x] = arg
            belief[p] += table[np.arange(table.shape[0]), arg]
        root = tree.order[0]
        choice[root] = int(np.argmin(belief[root]))
        for x, p in zip(tree.order[1:], tree.parent[1:], strict=True):
            choice[x] = int(back[x][choice[p]])
        return float(belief[root][choice[root]])

    def _solve_ve(self, unary: Sequence[np.ndarray], choice: np.ndarray) -> float:
        factors: dict[int, tuple[tuple[int, ...], np.ndarray]] = {}
        bucket: dict[int, set[int]] = {s.var: set() for s in self.steps}
        next_id = iter(range(1 << 62))

        def add(scope: tuple[int, ...], table: np.ndarray) -> None:
            fid = next(next_id)
            factors[fid] = (scope, table)
            for w in scope:
                bucket[w].add(fid)

        for v in bucket:
            add((v,), unary[v])
        for (a, b), mat in self.form.pairs.items():
            if a in bucket:
                add((a, b), mat)
        total = 0.0
        backs = []
        for step in self.steps:
            parts = []
            for fid in sorted(bucket.pop(step.var)):
                fscope, arr = factors.pop(fid)
                for w in fscope:
                    if w != step.var:
                        bucket[w].discard(fid)
                parts.append((fscope, arr))
            scope = tuple(sorted((step.var, *step.rest)))
            table = self._gather(scope, parts)
            axis = scope.index(step.var)
            arg = np.argmin(table, axis=axis)
            best = table.min(axis=axis)
            backs.append(arg)
            if step.rest:
                add(step.rest, best)
            else:
                total += float(best)
        for step, arg in zip(reversed(self.steps), reversed(backs), strict=True):
            choice[step.var] = int(arg[tuple(choice[w] for w in step.rest)])
        return total

    def _gather(self, scope: tuple[int, ...], parts: list[tuple[tuple[int, ...], np.ndarray]]) -> np.ndarray:
        """Sum factors over ``scope``; each factor's sorted scope is a subsequence, so a reshape aligns it."""
        table: np.ndarray | None = None
        for fscope, arr in parts:
            aligned = arr.reshape([self.sizes[w] if w in fscope else 1 for w in scope])
            table = aligned if table is None else table + aligned
        assert table is not None
        return table

    def solve(self, unary: Sequence[np.ndarray] | None = None) -> tuple[tuple[int, ...], float]:
        """Optimal choice and objective for these unary costs (default: the form's own)."""
        unary = self.form.unary if unary is None else unary
        choice = np.zeros(len(self.sizes), dtype=np.int64)
        total = math.fsum(self._solve_tree(t, unary, choice) for t in self.trees)
        if self.steps:
            total += self._solve_ve(unary, choice)
        return tuple(int(c) for c in choice), total


def solve_exact(problem: SearchProblem, *, max_factor_size: float = MAX_FACTOR_SIZE) -> ExactResult:
    """Provably optimal choice of ``problem`` ignoring its memory budget (masks and ``inf`` respected)."""
    solver = ExactSolver(pairwise_form(problem), max_factor_size)
    choice, objective = solver.solve()
    return ExactResult(
        choice=choice,
        objective=objective,
        method=solver.method,
        largest_factor=solver.largest_factor,
        width=solver.width,
    )


def min_memory_plan(
    problem: SearchProblem, *, max_factor_size: float = MAX_FACTOR_SIZE
) -> tuple[tuple[int, ...], float]:
    """The finite-cost plan that needs the least memory, and that memory (bytes per device).

    Only which options are finite matters here: unary costs become the memory of finite options, pair costs
    0 where finite and ``inf`` where forbidden.  Raises :class:`FactorCapExceeded` on high treewidth.
    """
    assert problem.memory is not None, "min_memory_plan needs a memory model"
    form = pairwise_form(problem)
    unary = tuple(
        np.where(np.isfinite(u), m, np.inf) for u, m in zip(form.unary, problem.memory, strict=True)
    )
    pairs = {k: np.where(np.isfinite(f), 0.0, np.inf) for k, f in form.pairs.items()}
    return ExactSolver(PairwiseForm(unary, pairs), max_factor_size).solve()
