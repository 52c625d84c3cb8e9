"""Exact preprocessing: shrink a search problem without changing its optimum.

Input: a :class:`~autoshard.search.problem.SearchProblem`.  Output: a :class:`Reduction`, holding a smaller
problem (no masks, one edge per node pair) and the map back: :meth:`Reduction.expand` turns a choice of the
reduced problem into a choice of the original one with the same objective (up to ``cost_offset``) and the same
memory (up to ``memory_offset``).

Steps, each exact:

1. **Arc consistency** (:func:`~autoshard.search.consistency.prune_domains`): drop a strategy with ``inf``
   node cost, outside its mask, or with no finite-cost partner left at some neighbour; repeat to a fixpoint.
   An emptied domain proves that no finite plan exists; the error names the nodes that caused it (annotated
   ones first).
2. **Parallel edges** are summed; an edge whose matrix is separable, ``F[s, t] = r[s] + c[t]`` (all zeros,
   say), is folded into the two node costs and disappears.
3. **Fixed nodes** (one strategy left) fold their edge rows into their neighbours' node costs.
4. **Free nodes** of degree <= 2 (no memory term under a budget: memory constant over their domain) are
   eliminated exactly, as variable elimination does, keeping an argmin table for back-substitution.  This is
   what the "follower" merge of XLA and Alpa does, generalised: chains collapse, and the CP-SAT model keeps
   only the nodes whose memory matters.
5. **Dominated strategies** (:mod:`~autoshard.search.dominance`): a strategy that another one of the same
   node beats (or ties) whatever the neighbours choose, and that needs no less memory under a budget, is
   dropped; duplicates merge.  Fewer strategies make new fixed nodes and separable edges, so steps 2-5
   repeat until nothing changes.  On the LLaMA-3-8B planning problem (130 nodes, 4-48 strategies) it
   drops 189 strategies and the whole problem then folds away: variable elimination would otherwise need a
   table of 3.2e7 entries.

Example::

    >>> import numpy as np
    >>> from autoshard.search.problem import Edge, SearchProblem, evaluate
    >>> p = SearchProblem((np.array([0.0, 1.0]), np.array([1.0, 0.0])),
    ...                   (Edge(0, 1, np.array([[0.0, 5.0], [5.0, 0.0]])),), ("a", "b"))
    >>> r = reduce_problem(p)
    >>> r.problem.num_nodes, r.expand(()), r.cost_offset
    (0, (0, 0), 1.0)
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from autoshard.search.consistency import prune_domains
from autoshard.search.dominance import Certificates, dominators, edge_bound, recheck
from autoshard.search.minplus import fold_min
from autoshard.search.problem import (
    Edge,
    SearchProblem,
    memory_left,
    pairwise_form,
)

__all__ = ["Certificates", "Reduction", "prune_domains", "reduce_problem"]

#: Degree-2 elimination minimises an ``S_a x S_b x S_v`` table, a slab of at most this many entries at a
#: time; a larger one is left to the solver unless ``reduce_problem(fold_cap=)`` allows it.
_MAX_FOLD_TABLE = 1_000_000
#: ``solve``'s cap where the default leaves a graph too wide to eliminate (LLaMA-tiny on 2x2x2: 43 -> 5 nodes).
WIDE_FOLD = 100_000_000


@dataclass(frozen=True, slots=True, eq=False)
class _Fold:
    """Node ``node`` was eliminated; its local strategy is ``table[local choices of nbrs]``."""

    node: int
    nbrs: tuple[int, ...]
    table: np.ndarray


@dataclass(frozen=True, slots=True, eq=False)
class Reduction:
    """A reduced problem and the map from its choices back to the original nodes and strategies.

    Attributes:
        problem: the reduced problem; its node ``k`` is original node ``kept[k]``, its strategy ``s`` is
            original strategy ``domains[kept[k]][s]``; no masks, one edge per node pair.
        kept: original index of every reduced node.
        domains: per original node, the original strategies that survived arc consistency.
        folds: eliminated nodes, in elimination order.
        cost_offset: objective(original, expand(c)) = objective(reduced, c) + cost_offset.
        memory_offset: memory(original, expand(c)) = memory(reduced, c) + memory_offset when the problem
            has a budget (without one, eliminated nodes may have any memory: it is not modelled then).
        log: one line per step, for the solver log.
        dominated: the dominance removals made (:data:`Certificates`), a hint for reducing a similar problem.
    """

    problem: SearchProblem
    kept: tuple[int, ...]
    domains: tuple[np.ndarray, ...]
    folds: tuple[_Fold, ...]
    cost_offset: float
    memory_offset: float
    log: tuple[str, ...]
    dominated: Certificates = ()

    def expand(self, choice: Sequence[int]) -> tuple[int, ...]:
        """Choice on the original problem for a choice on the reduced one."""
        local = np.zeros(len(self.domains), dtype=np.int64)
        local[list(self.kept)] = np.asarray(choice, dtype=np.int64)
        for fold in reversed(self.folds):
            local[fold.node] = fold.table[tuple(local[w] for w in fold.nbrs)]
        return tuple(int(dom[s]) for dom, s in zip(self.domains, local, strict=True))

    def restrict(self, choice: Sequence[int | None]) -> list[int | None]:
        """Reduced-problem strategies of an original choice (None where that strategy was pruned or where
        ``choice`` has None)."""
        out: list[int | None] = []
        for i in self.kept:
            hit = np.flatnonzero(self.domains[i] == choice[i]) if choice[i] is not None else np.empty(0, int)
            out.append(int(hit[0]) if hit.size else None)
        return out


def _separable(mat: np.ndarray) -> bool:
    """``mat[s, t] == r[s] + c[t]`` for all entries, none infinite (to 1e-12 of the largest entry)."""
    if not np.isfinite(mat).all():
        return False
    tol = 1e-12 * max(1.0, float(mat.max()))
    if mat.shape[0] > 1 and float(np.abs(mat[1] - mat[1, 0] - mat[0] + mat[0, 0]).max()) > tol:
        return False  # cheap rejection on two rows before the full check
    return float(np.abs(mat - mat[:, :1] - mat[:1, :] + mat[0, 0]).max()) <= tol


class _Reducer:
    """Mutable working state of :func:`reduce_problem`; all arrays are over the pruned (local) domains."""

    def __init__(self, problem: SearchProblem, eliminate_free: bool, dominance: bool, fold_cap: int) -> None:
        form = pairwise_form(problem)
        self.fold_cap = fold_cap
        live = prune_domains(problem, form)
        self.problem = problem
        self.eliminate_free = eliminate_free
        self.dominance = dominance
        self.budget = problem.memory_limit is not None
        self.dom = [np.flatnonzero(m) for m in live]
        full = [d.size == u.size for d, u in zip(self.dom, form.unary, strict=True)]
        self.unary = {i: u if full[i] else u[self.dom[i]] for i, u in enumerate(form.unary)}
        self.mem = (
            None if problem.memory is None else {i: m[self.dom[i]] for i, m in enumerate(problem.memory)}
        )
        self.adj: dict[int, set[int]] = {i: set() for i in self.unary}
        self.pairs: dict[tuple[int, int], np.ndarray] = {}
        for (a, b), mat in form.pairs.items():
            self._add_pair(a, b, mat if full[a] and full[b] else mat[np.ix_(self.dom[a], self.dom[b])])
        self.cost_offset = 0.0
        self.memory_offset = 0.0
        self.folds: list[_Fold] = []
        self.fold_refs: dict[int, list[int]] = {}  # node -> indices of the folds whose table it indexes
        self.bounds: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}  # (v, w) -> (matrix, bound)
        self.removed: list[tuple[int, np.ndarray, np.ndarray]] = []  # Certificates, as they are made
        self.counts = {
            "pruned": sum(int((~m).sum()) for m in live),
            "dominated": 0,
            "separable": 0,
            "fixed": 0,
            "free": 0,
        }

    def pair(self, a: int, b: int) -> np.ndarray:
        """Cost matrix indexed ``[s_a, s_b]``."""
        return self.pairs[(a, b)] if a < b else self.pairs[(b, a)].T

    def _add_pair(self, a: int, b: int, mat: np.ndarray) -> None:
        key, mat = ((a, b), mat) if a < b else ((b, a), mat.T)
        self.pairs[key] = self.pairs[key] + mat if key in self.pairs else mat
        self.adj[a].add(b)
        self.adj[b].add(a)

    def _drop_pair(self, a: int, b: int) -> None:
        del self.pairs[(min(a, b), max(a, b))]
        self.adj[a].discard(b)
        self.adj[b].discard(a)

    def fold_separable(self, nodes: set[int] | None = None) -> None:
        """Fold separable edges away (only those touching ``nodes`` when given)."""
        for (a, b), mat in list(self.pairs.items()):
            if nodes is not None and a not in nodes and b not in nodes:
                continue
            if _separable(mat):
                # mat[s, t] = min_t' mat[s, t'] + (mat[0, t] - min_t' mat[0, t']), both parts >= 0
                self.unary[a] = self.unary[a] + mat.min(axis=1)
                self.unary[b] = self.unary[b] + np.maximum(mat[0, :] - mat[0, :].min(), 0.0)
                self._drop_pair(a, b)
                self.counts["separable"] += 1

    def _is_free(self, v: int) -> bool:
        if not self.eliminate_free:
            return False
        return self.problem.memory_limit is None or self.mem is None or bool(np.ptp(self.mem[v]) == 0)

    def _retire(self, v: int, nbrs: tuple[int, ...], table: np.ndarray, cost: float) -> None:
        self.cost_offset += cost
        if self.mem is not None:
            self.memory_offset += float(self.mem[v][int(table.flat[0])])
        for w in nbrs:
            self.fold_refs.setdefault(w, []).append(len(self.folds))
        self.folds.append(_Fold(v, nbrs, table))
        del self.unary[v], self.adj[v]

    def try_eliminate(self, v: int) -> bool:
        """Fold ``v`` away if it is fixed, or free with degree <= 2; True when it went."""
        nbrs = tuple(sorted(self.adj[v]))
        u = self.unary[v]
        if u.size == 1:
            for w in nbrs:
                self.unary[w] = self.unary[w] + self.pair(w, v)[:, 0]
                self._drop_pair(w, v)
            self.counts["fixed"] += 1
            self._retire(v, (), np.zeros((), dtype=np.int64), float(u[0]))
            return True
        if len(nbrs) > 2 or not self._is_free(v):
            return False
        if u.size * np.prod([self.unary[w].size for w in nbrs]) > self.fold_cap:
            return False
        mats = [self.pair(w, v) for w in nbrs]  # (S_nbr, S_v) each
        rows = max(1, _MAX_FOLD_TABLE // (u.size * math.prod(m.shape[0] for m in mats[1:])))
        slabs = [
            fold_min(u, [m[lo : lo + rows], *mats[1:]]) for m in mats[:1] for lo in range(0, len(m), rows)
        ]
        arg, best = (np.concatenate(t) for t in zip(*slabs, strict=True)) if mats else fold_min(u, [])
        for w in nbrs:
            self._drop_pair(w, v)
        if len(nbrs) == 2:
            self._add_pair(nbrs[0], nbrs[1], best)
        elif len(nbrs) == 1:
            self.unary[nbrs[0]] = self.unary[nbrs[0]] + best
        self.counts["free"] += 1
        self._retire(v, nbrs, arg, float(best) if not nbrs else 0.0)
        return True

    def _shrink(self, v: int, keep: np.ndarray) -> None:
        """Restrict ``v`` to the local strategies ``keep`` (a bool mask), re-indexing everything that uses it."""
        idx = np.flatnonzero(keep)
        self.unary[v] = self.unary[v][idx]
        self.dom[v] = self.dom[v][idx]
        if self.mem is not None:
            self.mem[v] = self.mem[v][idx]
        for w in self.adj[v]:
            key = (min(v, w), max(v, w))
            old = self.pairs[key]
            self.pairs[key] = old[idx] if v < w else old[:, idx]
            kept = self.bounds.get((v, w))
            if kept is not None and kept[0] is old:  # v lost rows, w kept its columns: each pair left has
                # the same exact term, so the same bound (which pairs it filters matters, never the result)
                self.bounds[(v, w)] = (self.pairs[key], kept[1][np.ix_(idx, idx)])
        for k in self.fold_refs.get(v, ()):
            fold = self.folds[k]
            table = np.take(fold.table, idx, axis=fold.nbrs.index(v))
            self.folds[k] = _Fold(fold.node, fold.nbrs, table)

    def _bound(self, v: int, w: int, rows: np.ndarray) -> np.ndarray:
        """:func:`~autoshard.search.dominance.edge_bound` of ``v``'s rows towards ``w``, kept while that
        edge's matrix is the same object (every change to a matrix replaces it)."""
        mat = self.pairs[(min(v, w), max(v, w))]
        kept = self.bounds.get((v, w))
        if kept is None or kept[0] is not mat:
            kept = self.bounds[(v, w)] = (mat, edge_bound(rows))
        return kept[1]

    def prune_dominated(self) -> set[int]:
        """Drop dominated strategies to a fixpoint; returns the nodes that lost some."""
        changed: set[int] = set()
        queue = deque(sorted(self.unary))
        queued = dict.fromkeys(self.unary, True)
        while queue:
            v = queue.popleft()
            queued[v] = False
            if self.unary[v].size <= 1:
                continue
            nbrs = sorted(self.adj[v])
            memory = self.mem[v] if self.budget and self.mem is not None else None
            rows = [self.pair(v, w) for w in nbrs]
            by = dominators(
                self.unary[v], rows, memory, [self._bound(v, w, r) for w, r in zip(nbrs, rows, strict=True)]
            )
            if not self._drop(v, by):
                continue
            changed.add(v)
            for w in nbrs:  # their rows lost columns: they may be dominated now
                if not queued[w]:
                    queued[w] = True
                    queue.append(w)
        return changed

    def _drop(self, v: int, by: np.ndarray) -> bool:
        """Drop ``v``'s strategies where ``by`` names a dominator (else -1), recording them; True if any."""
        gone = by >= 0
        if not gone.any():
            return False
        self.counts["dominated"] += int(gone.sum())
        self.removed.append((v, self.dom[v][gone], self.dom[v][by[gone]]))
        self._shrink(v, ~gone)
        return True

    def replay(self, hint: Certificates) -> set[int]:
        """The removals of ``hint`` (a similar problem's) that hold here, each checked on this problem
        (:func:`~autoshard.search.dominance.recheck`), until none more does; the nodes that lost some.  What
        it misses, :meth:`prune_dominated` finds, on the smaller domains it leaves."""
        parts: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
        for v, s, t in hint:
            parts.setdefault(v, []).append((s, t))
        todo = {v: tuple(np.concatenate(p) for p in zip(*ps, strict=True)) for v, ps in parts.items()}
        changed: set[int] = set()
        nodes = sorted(todo)
        while nodes:
            touched: set[int] = set()
            for v in nodes:
                if v not in self.unary or self.unary[v].size <= 1:
                    continue
                rows = [self.pair(v, w) for w in sorted(self.adj[v])]
                memory = self.mem[v] if self.budget and self.mem is not None else None
                if self._drop(v, recheck(self.dom[v], self.unary[v], rows, memory, *todo[v])):
                    changed.add(v)
                    touched.update(self.adj[v])
            nodes = sorted(w for w in touched if w in todo)
        return changed

    def eliminate(self, nodes: Sequence[int]) -> None:
        """Fold away fixed and free low-degree nodes, starting from ``nodes`` and spreading to neighbours."""
        queue = deque(sorted(v for v in nodes if v in self.unary))
        queued = dict.fromkeys(self.unary, False)
        queued.update(dict.fromkeys(queue, True))
        while queue:
            v = queue.popleft()
            queued[v] = False
            if v not in self.unary:
                continue
            nbrs = list(self.adj[v])
            if self.try_eliminate(v):
                for w in sorted(nbrs):
                    if not queued[w]:
                        queued[w] = True
                        queue.append(w)

    def run(self, hint: Certificates = (), search: bool = True) -> None:
        self.fold_separable()
        self.eliminate(list(self.unary))
        changed = self.replay(hint) if hint and self.dominance else set()
        while True:
            if changed:
                self.fold_separable(changed)
                self.eliminate(sorted(changed.union(*(self.adj[v] for v in changed if v in self.adj))))
            if not (self.dominance and search):
                break
            changed = self.prune_dominated()
            if not changed:
                break


def reduce_problem(
    problem: SearchProblem,
    *,
    eliminate_free: bool = True,
    dominance: bool = True,
    hint: Certificates = (),
    search: bool = True,
    fold_cap: int | None = None,
) -> Reduction:
    """Shrink ``problem`` exactly (see the module docstring); the flags enable steps 4 and 5.  ``hint``: the
    :attr:`Reduction.dominated` of a similar problem (same nodes and strategies, other costs), checked here
    before the full dominance search (LLaMA-3-70B's per-block intervals, hinted by the uniform policy's
    solve: 0.24 -> 0.10 s CPU each, 2,833 and 3,016 removals, the same optimum).  ``search=False``: only
    the hint's removals that hold here, no dominance search of its own (still exact: fewer strategies
    dropped, larger tables later); for a problem asked one or two exact solves, where that search, most of
    a hinted reduction, costs more than the larger tables (LLaMA-3-70B's per-block intervals: ~0.07 s CPU
    less each, the same bound).  ``fold_cap``: the largest degree-2 elimination made (table entries; default
    :data:`_MAX_FOLD_TABLE`)."""
    red = _Reducer(problem, eliminate_free, dominance, _MAX_FOLD_TABLE if fold_cap is None else fold_cap)
    red.run(hint, search)
    kept = tuple(sorted(red.unary))
    local = {v: k for k, v in enumerate(kept)}
    edges = tuple(Edge(local[a], local[b], mat) for (a, b), mat in sorted(red.pairs.items()))
    labels = problem.strategy_labels
    reduced = SearchProblem(
        node_costs=tuple(red.unary[v] for v in kept),
        edges=edges,
        names=tuple(problem.names[v] for v in kept),
        memory=None if red.mem is None else tuple(red.mem[v] for v in kept),
        memory_limit=memory_left(problem, red.memory_offset, bool(kept)),
        strategy_labels=None
        if labels is None
        else tuple(tuple(labels[v][s] for s in red.dom[v]) for v in kept),
    )
    c = red.counts
    line = (
        f"reduce: {problem.num_nodes} nodes / {len(problem.edges)} edges -> {reduced.num_nodes} / {len(edges)} "
        f"(pruned {c['pruned']} strategies, {c['dominated']} dominated, folded {c['fixed']} fixed and "
        f"{c['free']} free nodes, {c['separable']} separable edges)"
    )
    found = (reduced, kept, tuple(red.dom), tuple(red.folds), red.cost_offset, red.memory_offset, (line,))
    return Reduction(*found, dominated=tuple(red.removed))
