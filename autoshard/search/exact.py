"""Exact minimisation without a memory budget: tree DP and variable elimination, in numpy.

Input: a :class:`~autoshard.search.problem.SearchProblem` (``memory`` is ignored here; masks become ``inf``).
Output: an :class:`ExactResult`, a provably optimal choice, or :class:`FactorCapExceeded` when the graph's
treewidth makes an intermediate table too large even with conditioning, so the caller can fall back to
CP-SAT.

Method, per connected component of the interaction graph (nodes, and one edge per pair of nodes that share a
cost matrix):

* **tree DP** (chains, trees): root the component, send min-plus messages leaf to root
  ``m_c(s_p) = min_t [F(s_p, t) + b_c(t)]`` with ``b_c = unary_c + sum of the children's messages``, keep the
  argmin back-pointers, choose the root's best strategy and walk back down.  O(sum_e S_u S_v).
* **variable elimination** (everything else): the best of three greedy orders (:mod:`~autoshard.search.order`:
  min-fill, weighted min-fill, min-weight; deterministic) fixes the scopes up front; each step adds the
  factors that mention the variable, minimises it out and keeps the argmin table; back-substitution runs the
  order in reverse.  The residual stream of a transformer gives treewidth 2-4, so tables stay at
  ``S^3``-``S^5`` entries; preprocessing (:mod:`~autoshard.search.reduce`, dominance above all) keeps ``S``
  small.
* **cutset conditioning**, when every order needs a table over ``max_factor_size``: eliminate the graph
  without one or two nodes once per assignment of those nodes (their edges become unary costs of their
  neighbours) and keep the first best assignment.  Exact; it trades ``S_c`` times the work for tables
  ``S_c`` times smaller.

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

import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from autoshard.errors import InfeasibleError
from autoshard.search.messages import message
from autoshard.search.minplus import reduced
from autoshard.search.order import EliminationPlan, FactorCapExceeded, Step, plan_elimination
from autoshard.search.problem import Edge, PairwiseForm, SearchProblem, pairwise_form

if TYPE_CHECKING:
    from autoshard.search.marginals import Buckets

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


class ExactSolver:
    """The elimination structure of one graph, reusable for many unary cost vectors (Lagrangian sweeps).

    Raises :class:`FactorCapExceeded` at construction when variable elimination would build a table over
    ``max_factor_size`` entries; ``wide`` is called first when it needs conditioning (:func:`plan_elimination`).
    """

    def __init__(
        self,
        form: PairwiseForm,
        max_factor_size: float = MAX_FACTOR_SIZE,
        wide: Callable[[], object] | None = None,
    ) -> None:
        self.form = form
        self.sizes = tuple(u.size for u in form.unary)
        self._own: tuple[tuple[int, ...], float] | None = None  # the optimum at the form's own costs
        self.last: Buckets | None = None  # the buckets of the last elimination (without conditioning)
        self.earlier: Buckets | None = None  # and of the one before (search/marginals.py)
        self.memo: dict[int, tuple[tuple[np.ndarray, ...], np.ndarray]] = {}  # search/messages.py
        n = len(self.sizes)
        adj = form.neighbours()
        self._adj = adj
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
        self.plan: EliminationPlan | None = (
            plan_elimination(ve_nodes, adj, self.sizes, max_factor_size, wide=wide) if ve_nodes else None
        )
        self.steps = self.plan.steps if self.plan else ()
        self.tree_steps = [
            Step(x, (p,) if p >= 0 else ())
            for t in self.trees
            for x, p in zip(reversed(t.order), reversed(t.parent), strict=True)
        ]
        self.conditioned = self.plan.conditioned if self.plan else ()
        tree_tables = [
            self.sizes[x] * self.sizes[p]
            for t in self.trees
            for x, p in zip(t.order, t.parent, strict=True)
            if p >= 0
        ]
        self.largest_factor = max(
            [self.plan.largest if self.plan else 0, *tree_tables, *self.sizes], default=0
        )
        self.width = max([len(s.rest) for s in self.steps] + [1 if tree_tables else 0])
        kinds = (["tree-dp"] if self.trees else []) + (["variable-elimination"] if self.plan else [])
        self.method = "+".join(kinds) or "none"

    def describe(self) -> str:
        """One line for the solver log: method, width, largest table, order, conditioning."""
        line = f"{self.method}, width {self.width}, largest table {self.largest_factor} entries"
        if self.plan is not None:
            line += f", {self.plan.heuristic} order"
        if self.conditioned:
            runs = math.prod(self.sizes[c] for c in self.conditioned)
            line += f", conditioned on {len(self.conditioned)} node(s) ({runs} eliminations)"
        return line

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

    def assignments(self) -> Iterator[tuple[int, ...]]:
        """Every assignment of the conditioned nodes, in lexicographic order (one empty one without any)."""
        return itertools.product(*(range(self.sizes[c]) for c in self.conditioned))

    def condition(
        self, unary: Sequence[np.ndarray], values: tuple[int, ...]
    ) -> tuple[list[np.ndarray], float]:
        """Unary costs with the conditioned nodes fixed to ``values``: their edges move into the neighbours'
        unary costs; their own costs and the edges among them become a constant."""
        cond = self.conditioned
        local = list(unary)
        const = math.fsum(float(unary[c][s]) for c, s in zip(cond, values, strict=True))
        for c, s in zip(cond, values, strict=True):
            for w in self._adj[c]:
                if w in cond:  # a pair of conditioned nodes: a constant, counted once
                    const += float(self._pair(c, w)[s, values[cond.index(w)]]) if w > c else 0.0
                else:
                    local[w] = local[w] + self._pair(w, c)[:, s]
        return local, const

    def _solve_ve(self, unary: Sequence[np.ndarray], choice: np.ndarray) -> float:
        """Variable elimination, once per assignment of the conditioned nodes; the first best one wins."""
        best, best_choice = math.inf, None
        for values in self.assignments():
            local, const = self.condition(unary, values)
            trial = choice.copy()
            trial[list(self.conditioned)] = values
            value = const + self._eliminate(local, trial)
            if best_choice is None or value < best:
                best, best_choice = value, trial
        assert best_choice is not None
        choice[:] = best_choice
        return best

    def _eliminate(self, unary: Sequence[np.ndarray], choice: np.ndarray) -> float:
        factors: dict[int, tuple[tuple[int, ...], np.ndarray, int]] = {}  # scope, table, step that sent it
        bucket: dict[int, set[int]] = {s.var: set() for s in self.steps}
        next_id = iter(range(1 << 62))

        def add(scope: tuple[int, ...], table: np.ndarray, origin: int = -1) -> None:
            fid = next(next_id)
            factors[fid] = (scope, table, origin)
            for w in scope:
                bucket[w].add(fid)

        for v in bucket:
            add((v,), unary[v])
        for (a, b), mat in self.form.pairs.items():
            if a in bucket and b in bucket:  # pairs with a conditioned node are in the unary costs
                add((a, b), mat)
        roots: dict[int, float] = {}
        backs = []
        for k, step in enumerate(self.steps):
            parts = []
            for fid in sorted(bucket.pop(step.var)):
                part = factors.pop(fid)
                for w in part[0]:
                    if w != step.var:
                        bucket[w].discard(fid)
                parts.append(part)
            # min, not argmin: the argmin is needed only at the one assignment of ``rest`` the plan ends up
            # with, and _back recomputes it there; the last solve's message where it holds (search/messages.py)
            best = message(self, k, step, parts)
            backs.append(parts)
            if step.rest:
                add(step.rest, best, k)
            else:
                roots[k] = float(best)
        if not self.conditioned:  # min-marginals at these costs start from these buckets
            from autoshard.search.marginals import Buckets  # it builds on this class

            self.earlier, self.last = self.last, Buckets(tuple(unary), tuple(backs), roots)
        for step, parts in zip(reversed(self.steps), reversed(backs), strict=True):
            choice[step.var] = self._back(step.var, [(f, t) for f, t, _ in parts], choice)
        return sum(roots.values())

    @staticmethod
    def _back(var: int, parts: list[tuple[tuple[int, ...], np.ndarray]], choice: np.ndarray) -> int:
        """``argmin`` over ``var`` of its bucket's sum with every other variable at ``choice``: the same
        entries, added in the same order, as the table :meth:`_eliminate` reduced, so the same first minimum."""
        column: np.ndarray | None = None
        for fscope, arr in parts:
            line = arr[tuple(slice(None) if w == var else int(choice[w]) for w in fscope)]
            column = line if column is None else column + line
        assert column is not None
        return int(np.argmin(column))

    def reduced(
        self, var: int, parts: Sequence[tuple[tuple[int, ...], np.ndarray]], keep: Sequence[int]
    ) -> np.ndarray:
        """``min`` of the sum of ``parts`` over every variable of theirs outside ``keep``, as a table over
        ``keep`` in increasing order; the parts added in their order, as :meth:`_back` adds them (the same
        sums to the bit: :func:`~autoshard.search.minplus.reduced`)."""
        return reduced(self.sizes, var, parts, keep)

    def solve(self, unary: Sequence[np.ndarray] | None = None) -> tuple[tuple[int, ...], float]:
        """Optimal choice and objective for these unary costs (default: the form's own)."""
        if unary is None:  # the form's own costs: solved once (the budgeted path asks again in its sweep)
            if self._own is None:
                self._own = self.solve(self.form.unary)
            return self._own
        choice = np.zeros(len(self.sizes), dtype=np.int64)
        total = math.fsum(self._solve_tree(t, unary, choice) for t in self.trees)
        if self.plan is not None:
            total += self._solve_ve(unary, choice)
        return tuple(int(c) for c in choice), total

    def min_marginals(self, unary: Sequence[np.ndarray] | None = None) -> list[np.ndarray]:
        """``mm[i][s]``: the least objective of a plan with node ``i`` at strategy ``s`` (for all i, s at once;
        :func:`~autoshard.search.marginals.min_marginals`, about three solves)."""
        from autoshard.search.marginals import min_marginals  # it builds on this class

        return min_marginals(self, self.form.unary if unary is None else unary)


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
    0 where finite and ``inf`` where forbidden.  That problem is reduced first (:mod:`~autoshard.search.reduce`:
    with 0/inf pairs nearly every node folds; LLaMA-3-70B on 16 x 8 x 8: 149 nodes to none in 0.03 s, where
    eliminating it whole needed a table over the cap) and the rest eliminated.  Raises
    :class:`FactorCapExceeded` on high treewidth."""
    from autoshard.search.reduce import reduce_problem  # reduce builds on the problem records, not on this

    assert problem.memory is not None, "min_memory_plan needs a memory model"
    form = pairwise_form(problem)
    unary = tuple(
        np.where(np.isfinite(u), m, np.inf) for u, m in zip(form.unary, problem.memory, strict=True)
    )
    edges = tuple(Edge(a, b, np.where(np.isfinite(f), 0.0, np.inf)) for (a, b), f in form.pairs.items())
    least = SearchProblem(unary, edges, problem.names)
    try:
        red = reduce_problem(least)
    except InfeasibleError:  # no finite plan at all: the elimination says so with an inf optimum
        return ExactSolver(pairwise_form(least), max_factor_size).solve()
    plan, value = ExactSolver(pairwise_form(red.problem), max_factor_size).solve()
    return red.expand(plan), value + red.cost_offset
