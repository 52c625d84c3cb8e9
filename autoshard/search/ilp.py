"""CP-SAT model of the search problem, for when a memory budget couples all nodes (or treewidth is high).

Input: a :class:`~autoshard.search.problem.SearchProblem` (usually already reduced), an optional hint.
Output: an :class:`IlpResult`; its objective is recomputed in float64 by ``evaluate`` on the returned choice.

Formulation.  Nodes ``i`` with strategies ``s``: ``c[i, s]`` node cost, ``m[i, s]`` memory, ``A[i]`` the
strategies with finite cost allowed by the mask.  Node pairs ``e = (u, v)``, ``u < v`` (parallel edges summed,
orientation normalised): ``F[e, s, t]`` indexed by ``(s_u, s_v)``; ``P[e]`` the finite pairs inside
``A[u] x A[v]``.  Edges whose matrix is constant on ``A[u] x A[v]`` only add a constant and get no variables.

    minimise    sum_{i, s in A[i]} C[i, s] x[i, s] + sum_{e, (s, t) in P[e]} G[e, s, t] y[e, s, t]
    subject to
    (a) one-hot:            sum_{s in A[i]} x[i, s] = 1                          for every node i
    (b) source marginal:    sum_{t : (s, t) in P[e]} y[e, s, t] = x[u, s]         for every e, s in A[u]
    (c) target marginal:    sum_{s : (s, t) in P[e]} y[e, s, t] = x[v, t]         for every e, t in A[v]
    (d) forbidden options:  x[i, s] = 0 for s not in A[i];  y[e, s, t] = 0 for (s, t) not in P[e]
                            (by omission: those variables are never created)
    (e) memory budget:      sum_{i, s in A[i]} M[i, s] x[i, s] <= L
    x, y binary.

Integer data.  (f) objective: ``C = round(k (c - min_s c))``, ``G = round(k (F - min F))`` with one scale
``k = resolution / (largest shifted finite cost)``, so the largest cost has ~1e9 units; the constants removed
are added back, and the reported lower bound subtracts the worst rounding error ``0.5 (nodes + pairs) / k``
so it stays a true bound.  (e) memory: ``M = (m - min_s m) / g``, ``L = floor((limit - sum_i min_s m) / g)``
with ``g`` the gcd of the byte counts when they are integers (exact); otherwise ``M = ceil(k_m (m - min m))``
and ``L`` floored, which is conservative, so a plan CP-SAT accepts truly fits.

Why this shape: the marginal-consistency constraints (b)-(c) make the LP relaxation the local-polytope
relaxation, tight on trees and nearly so on transformer graphs; with one-hot x and the ``max_lp`` subsolver
CP-SAT proves optimality, while the usual linearisation (``y >= x_u + x_v - 1``) and the default portfolio do
not (the project's ARCHITECTURE.md, "Search").  (g) a warm-start hint (a full plan: x and the y it implies)
comes from exact DP/VE or the Lagrangian sweep in ``solve``, or from propagation.

Workers (measured on 2 shared cores, hinted): the portfolio is ``max_lp`` plus ``no_lp`` (fast feasible
solutions).  An 8-block transformer DAG at 16 strategies proved optimal in 15 s this way, 16-28 s with
``max_lp`` alone, 35 s with one worker, and not within 60 s with the default portfolio or with
``interleave_search`` (deterministic batches); under a binding budget (8 blocks x 8 strategies) 4.9 s,
6.7 s, 14.5 s, and a 0.1 % gap after 60 s for the default portfolio.  The seed is fixed.

(h) Determinism.  One worker is deterministic; two race, and when several plans tie at the optimum, which
one they return depends on thread timing (measured: a 60-node, 7-strategy problem with small integer costs
gave two different optimal plans in four runs).  So once CP-SAT proves the optimum, a second solve picks
the canonical plan among the optimal ones: the integer objective is pinned (``<=`` the proven optimum) and
the new objective is a tie-break weight, pseudo-random 20-bit integers per strategy from a fixed seed,
warm-started from the racing plan.  A tie-break optimum is unique unless two optimal plans' weight sums
collide, so once proven it does not depend on which worker won: the same inputs give the same plan.
Measured on those tie-heavy problems: 1-2.5x the time of the first solve (it is tiny on what the
dispatcher hands CP-SAT after Lagrangian fixing).  If the tie-break is not proven in the time left, the
racing plan is returned and the log says so; a run that stops at the time limit (FEASIBLE) is not
canonicalised.  Rejected: tie-break terms folded into the first objective (one solve, but the integer
weights must then be scaled below the cost resolution, losing precision on large models); pinning the
objective and taking one worker's first plan (deterministic, but slower than the racing solve itself:
up to 18 s against 1 s); a lexicographic objective (overflows 64-bit weights beyond ~20 nodes).

Example::

    >>> import numpy as np
    >>> from autoshard.search.problem import Edge, SearchProblem
    >>> p = SearchProblem((np.array([0.0, 3.0]), np.array([3.0, 0.0])),
    ...                   (Edge(0, 1, np.array([[0.0, 2.0], [2.0, 0.0]])),), ("a", "b"))
    >>> solve_ilp(p, time_limit=10).choice
    (0, 1)
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import reduce

import numpy as np
from ortools.sat.python import cp_model

from autoshard.errors import InfeasibleError
from autoshard.search.exact import MAX_FACTOR_SIZE, FactorCapExceeded, min_memory_plan
from autoshard.search.problem import (
    SearchProblem,
    evaluate,
    memory_infeasible_error,
    memory_lower_bound,
    pairwise_form,
)

__all__ = ["DEFAULT_SUBSOLVERS", "IlpResult", "memory_floor", "solve_ilp"]

#: Worker portfolio: ``max_lp`` is the one that proves optimality here (see the module docstring).
DEFAULT_SUBSOLVERS: tuple[str, ...] = ("max_lp", "no_lp", "default_lp", "core", "quick_restart")

_RESOLUTION = 1e9

#: (h) Tie-break weights: pseudo-random integers below this bound, drawn from a fixed seed.
_TIE_BREAK_WEIGHT = 1 << 20
_TIE_BREAK_SEED = 20261123

#: CP-SAT's probing level and lazy LP constraints for the residual problems of reparametrised fixing
#: (``solve_ilp(residual=True)``).
#: Measured (one worker, CPU s / deterministic units) on the 405B stage's residual (PP 16, selective: 63
#: nodes, 818 strategies, warm-started from the incumbent): defaults 2.9 / 4.9; probing off 1.27 / 1.01;
#: probing off and constraints in the LP up front 0.54 / 0.54 (not warm-started: 1.31 -> 1.24 s; the
#: residual below 237.445 s: 1.02 -> 0.92 s).  Presolve off as well was slower (0.79 s).
_RESIDUAL_PROBING = 0
_RESIDUAL_LAZY_LP = False


@dataclass(frozen=True, slots=True)
class IlpResult:
    """CP-SAT's answer: ``choice`` is None when no plan was found in the time limit."""

    choice: tuple[int, ...] | None
    objective: float
    lower_bound: float
    optimal: bool
    status: str
    seconds: float
    log: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class _Pair:
    u: int
    v: int
    cost: np.ndarray  # (S_u, S_v), inf where forbidden


class _Model:
    """Builds the CP-SAT model, one method per constraint family (letters as in the module docstring)."""

    def __init__(self, problem: SearchProblem, resolution: float) -> None:
        self.problem = problem
        form = pairwise_form(problem)
        self.unary = form.unary
        self.pairs = [_Pair(u, v, f) for (u, v), f in sorted(form.pairs.items())]
        self.model = cp_model.CpModel()
        self.x: list[dict[int, cp_model.IntVar]] = []
        self.y: list[dict[tuple[int, int], cp_model.IntVar]] = []
        self.offset = 0.0
        self.terms: list[tuple[cp_model.IntVar, float]] = []
        self.scale = 1.0
        self.resolution = resolution
        self.objective: list[tuple[cp_model.IntVar, int]] = []

    def build(self) -> None:
        self.add_node_vars()
        self.add_edge_vars()
        self.add_memory()
        self.add_objective()

    def add_node_vars(self) -> None:
        # (a) one-hot x[i, s] over the allowed finite strategies; (d) the others are never created.
        for i, c in enumerate(self.unary):
            allowed = np.flatnonzero(np.isfinite(c))
            if allowed.size == 0:
                raise InfeasibleError(
                    f"graph node {self.problem.names[i]}: every allowed strategy has infinite cost"
                )
            base = float(c[allowed].min())
            self.offset += base
            xs = {int(s): self.model.new_bool_var(f"x[{i},{s}]") for s in allowed}
            self.model.add_exactly_one(xs.values())
            self.terms.extend((xs[s], float(c[s]) - base) for s in xs)
            self.x.append(xs)

    def add_edge_vars(self) -> None:
        for k, pair in enumerate(self.pairs):
            su, sv = list(self.x[pair.u]), list(self.x[pair.v])
            sub = pair.cost[np.ix_(su, sv)]
            finite = np.isfinite(sub)
            if not finite.any():
                u, v = self.problem.names[pair.u], self.problem.names[pair.v]
                raise InfeasibleError(f"nodes {u} and {v}: every pair of their allowed strategies costs inf")
            base = float(sub[finite].min())
            self.offset += base
            ys: dict[tuple[int, int], cp_model.IntVar] = {}
            if finite.all() and float(sub.max()) == base:
                self.y.append(ys)  # constant matrix: a constant, no variables
                continue
            rows: list[list[cp_model.IntVar]] = [[] for _ in su]
            cols: list[list[cp_model.IntVar]] = [[] for _ in sv]
            for a, b in zip(*np.nonzero(finite), strict=True):
                ys[(su[a], sv[b])] = var = self.model.new_bool_var(f"y[{k},{su[a]},{sv[b]}]")
                rows[a].append(var)
                cols[b].append(var)
                self.terms.append((var, float(sub[a, b]) - base))
            # (b) source marginal sum_t y[e, s, t] = x[u, s];  (c) target marginal sum_s y[e, s, t] = x[v, t]
            for a, s in enumerate(su):
                self.model.add(sum(rows[a]) == self.x[pair.u][s])
            for b, t in enumerate(sv):
                self.model.add(sum(cols[b]) == self.x[pair.v][t])
            self.y.append(ys)

    def add_memory(self) -> None:
        # (e) sum M[i, s] x[i, s] <= L, integer data exact (gcd) or rounded conservatively.
        p = self.problem
        if p.memory is None or p.memory_limit is None:
            return
        mins = [float(p.memory[i][list(xs)].min()) for i, xs in enumerate(self.x)]
        rows = [(xs, p.memory[i][list(xs)] - mins[i]) for i, xs in enumerate(self.x)]
        room = p.memory_limit - math.fsum(mins)
        if room < 0:
            raise _MemoryInfeasible()
        coeffs, rhs = _integer_memory([r for _, r in rows], room)
        expr = [
            c * var
            for (xs, _), cs in zip(rows, coeffs, strict=True)
            for var, c in zip(xs.values(), cs, strict=True)
            if c
        ]
        self.model.add(sum(expr) <= rhs)

    def add_objective(self) -> None:
        # (f) integer objective, largest shifted finite cost = `resolution` units.
        largest = max((c for _, c in self.terms), default=0.0)
        self.scale = self.resolution / largest if largest > 0 else 1.0
        terms = [(var, round(c * self.scale)) for var, c in self.terms]
        terms = [(var, c) for var, c in terms if c > 0]
        self.objective = terms
        if terms:
            self.model.minimize(
                cp_model.LinearExpr.weighted_sum([v for v, _ in terms], [c for _, c in terms])
            )

    def add_hint(self, hint: Sequence[int | None]) -> int:
        # (g) warm start: x and the y implied by the hinted plan; returns how many nodes were hinted.
        hinted = 0
        for i, xs in enumerate(self.x):
            if hint[i] is not None and hint[i] in xs:
                hinted += 1
                for s, var in xs.items():
                    self.model.add_hint(var, s == hint[i])
        for pair, ys in zip(self.pairs, self.y, strict=True):
            hu, hv = hint[pair.u], hint[pair.v]
            if hu is not None and hv is not None and (hu, hv) in ys:
                for (a, b), var in ys.items():
                    self.model.add_hint(var, a == hu and b == hv)
        return hinted

    @property
    def rounding_slack(self) -> float:
        """Worst total rounding error of the integer objective, in seconds."""
        return 0.5 * (len(self.x) + len(self.pairs)) / self.scale


class _MemoryInfeasible(Exception):
    """Internal: even the least-memory option of every node together exceeds the budget."""


def _integer_memory(rows: list[np.ndarray], room: float) -> tuple[list[list[int]], int]:
    """Integer coefficients and right-hand side for ``sum rows . x <= room`` that never accept a plan that
    does not fit: exact (divided by the gcd) for integral byte counts, else scaled and rounded up."""
    flat = np.concatenate(rows) if rows else np.zeros(0)
    total = float(flat.sum()) + room
    if np.all(flat == np.round(flat)) and total < 2**53:
        ints = [r.astype(np.int64) for r in rows]
        g = reduce(math.gcd, (int(v) for r in ints for v in r if v), 0) or 1
        return [[int(v) // g for v in r] for r in ints], math.floor(room) // g
    k = _RESOLUTION / max(room, float(flat.max(initial=0.0)), 1.0)
    return [[math.ceil(float(v) * k) for v in r] for r in rows], math.floor(room * k)


def memory_floor(
    problem: SearchProblem, *, max_factor_size: float = MAX_FACTOR_SIZE
) -> tuple[float, float | None]:
    """A lower bound on any finite plan's memory, and the least-memory plan's memory when computable."""
    floor = memory_lower_bound(problem)
    try:
        _, least = min_memory_plan(problem, max_factor_size=max_factor_size)
    except FactorCapExceeded:
        return floor, None
    return floor, (least if math.isfinite(least) else None)


def _configure(solver: cp_model.CpSolver, time_limit: float, num_workers: int, seed: int) -> None:
    params = solver.parameters
    params.max_time_in_seconds = max(0.01, time_limit)
    params.num_workers = num_workers
    params.random_seed = seed
    if num_workers == 1:
        params.linearization_level = 2  # the single worker is then max_lp
    else:
        params.subsolvers.extend(DEFAULT_SUBSOLVERS[:num_workers])


def solve_ilp(
    problem: SearchProblem,
    *,
    time_limit: float = 60.0,
    num_workers: int = 2,
    hint: Sequence[int | None] | None = None,
    seed: int = 0,
    resolution: float = _RESOLUTION,
    work_limit: float | None = None,
    residual: bool = False,
) -> IlpResult:
    """Solve with CP-SAT under a hard ``time_limit`` (seconds); InfeasibleError when proven infeasible.

    With several workers the returned plan is made canonical (see the module docstring, (h)).
    ``work_limit``: CP-SAT's deterministic time limit (its own work units, not the clock): with one worker
    and ``time_limit=math.inf`` the answer then does not depend on the machine's load.  ``residual``:
    tuned for what reparametrised fixing leaves (search/diffusion.py: a few hundred strategies, a warm
    start): no presolve probing, every LP constraint in the LP from the start (:data:`_RESIDUAL_PROBING`).
    """
    start = time.perf_counter()
    m = _Model(problem, resolution)
    try:
        m.build()
    except _MemoryInfeasible:
        floor, least = memory_floor(problem)
        raise memory_infeasible_error(problem, floor, least) from None
    hinted = m.add_hint(hint) if hint is not None else 0
    solver = cp_model.CpSolver()
    _configure(solver, time_limit - (time.perf_counter() - start), num_workers, seed)
    if work_limit is not None:
        solver.parameters.max_deterministic_time = work_limit
    if residual:
        solver.parameters.cp_model_probing_level = _RESIDUAL_PROBING
        solver.parameters.add_lp_constraints_lazily = _RESIDUAL_LAZY_LP
    status = solver.solve(m.model)
    name = solver.status_name(status)
    log = [
        f"cp-sat: {len(m.model.proto.variables)} vars, {len(m.model.proto.constraints)} constraints, "
        f"{hinted} of {len(m.x)} nodes hinted, {num_workers} workers, seed {seed}",
        f"cp-sat: {name} in {solver.wall_time:.2f} s ({solver.deterministic_time:.2f} work units), "
        f"{solver.num_conflicts} conflicts, {solver.num_branches} branches",
    ]
    _raise_if_infeasible(problem, m, status)
    bound = _bound(m, solver)
    choice = None
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        choice = _read_choice(m, solver)
        if num_workers > 1 and status == cp_model.OPTIMAL:
            left = time_limit - (time.perf_counter() - start)
            choice = _canonical(m, solver, choice, left, num_workers, seed, log)
    return IlpResult(
        choice=choice,
        objective=math.inf if choice is None else evaluate(problem, choice),
        lower_bound=bound,
        optimal=status == cp_model.OPTIMAL,
        status=name,
        seconds=time.perf_counter() - start,
        log=tuple(log),
    )


def _read_choice(m: _Model, solver: cp_model.CpSolver) -> tuple[int, ...]:
    return tuple(next(s for s, var in xs.items() if solver.value(var)) for xs in m.x)


def _canonical(
    m: _Model,
    solver: cp_model.CpSolver,
    raced: tuple[int, ...],
    time_left: float,
    num_workers: int,
    seed: int,
    log: list[str],
) -> tuple[int, ...]:
    """(h) Among the plans at the proven optimal integer objective, the one with the least tie-break weight;
    ``raced`` (the racing workers' plan) when that is not proven in time."""
    if m.objective:
        expr = cp_model.LinearExpr.weighted_sum([v for v, _ in m.objective], [c for _, c in m.objective])
        m.model.add(expr <= round(solver.objective_value))
    rng = np.random.default_rng(_TIE_BREAK_SEED)
    variables, weights = [], []
    for xs in m.x:
        drawn = rng.integers(0, _TIE_BREAK_WEIGHT, size=max(xs) + 1)
        for s, var in xs.items():
            variables.append(var)
            weights.append(int(drawn[s]))
    m.model.minimize(cp_model.LinearExpr.weighted_sum(variables, weights))
    m.model.clear_hints()
    m.add_hint(raced)
    again = cp_model.CpSolver()
    _configure(again, time_left, num_workers, seed)
    status = again.solve(m.model)
    if status != cp_model.OPTIMAL:
        log.append(f"cp-sat: tie-break {again.status_name(status)}; keeping the racing workers' plan")
        return raced
    log.append(f"cp-sat: tie-break among the optimal plans proven in {again.wall_time:.2f} s")
    return _read_choice(m, again)


def _raise_if_infeasible(problem: SearchProblem, m: _Model, status: cp_model.CpSolverStatus) -> None:
    if status == cp_model.MODEL_INVALID:
        raise AssertionError(f"invalid CP-SAT model: {m.model.validate()}")
    if status != cp_model.INFEASIBLE:
        return
    if problem.memory_limit is not None:
        floor, least = memory_floor(problem)
        raise memory_infeasible_error(problem, floor, least, "CP-SAT proved it")
    raise InfeasibleError("no finite-cost plan exists (CP-SAT proved it): the inf-cost options exclude all")


def _bound(m: _Model, solver: cp_model.CpSolver) -> float:
    """A true lower bound on the float objective: CP-SAT's bound minus the worst rounding error."""
    bound = solver.best_objective_bound
    if not math.isfinite(bound):
        return -math.inf
    return max(0.0, bound / m.scale + m.offset - m.rounding_slack)
