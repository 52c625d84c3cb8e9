"""Solver dispatch: reduce, solve exactly where possible, CP-SAT where a memory budget binds.

Input: a :class:`~autoshard.search.problem.SearchProblem`.  Output: a
:class:`~autoshard.search.problem.Solution` on the original nodes, with an honest ``optimal`` flag, a proven
``lower_bound`` and ``gap``, and a log of what ran and why.

``method="auto"``:

1. :func:`~autoshard.search.reduce.reduce_problem` prunes, folds fixed nodes and eliminates memory-free
   nodes of degree <= 2 (exact).
2. No budget: exact tree DP / variable elimination.  If the treewidth makes a table exceed the size cap,
   CP-SAT with a propagation warm start instead.
3. Budget: the exact optimum without the budget; if it fits, it is optimal under the budget too.  Otherwise
   the least-memory plan decides feasibility (InfeasibleError stating the least memory needed), a short
   Lagrangian sweep (exact solves of ``cost + lambda * memory``) gives a feasible plan and a lower bound, and
   CP-SAT, warm-started from that plan, closes the gap within the time limit.

``"exact"`` never calls CP-SAT (under a binding budget it returns the Lagrangian plan and bound);
``"ilp"`` always does; ``"propagate"`` returns the propagation plan with a trivial lower bound.

Example::

    >>> import numpy as np
    >>> from autoshard.search.problem import Edge, SearchProblem
    >>> p = SearchProblem((np.array([0.0, 3.0]), np.array([3.0, 0.0])),
    ...                   (Edge(0, 1, np.array([[0.0, 2.0], [2.0, 0.0]])),), ("a", "b"))
    >>> s = solve(p); s.choice, s.objective, s.optimal
    ((0, 1), 2.0, True)
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from autoshard.errors import AutoshardError, InfeasibleError
from autoshard.search.exact import MAX_FACTOR_SIZE, ExactSolver, FactorCapExceeded, min_memory_plan
from autoshard.search.problem import (
    SearchProblem,
    Solution,
    evaluate,
    format_bytes,
    memory_infeasible_error,
    memory_lower_bound,
    memory_of,
    pairwise_form,
    relative_gap,
)
from autoshard.search.propagate import propagate
from autoshard.search.reduce import Reduction, reduce_problem

__all__ = ["Method", "solve", "trivial_lower_bound"]

Method = Literal["auto", "exact", "ilp", "propagate"]

#: Exact solves the Lagrangian sweep may spend before CP-SAT takes over.
_LAGRANGE_STEPS = 12


@dataclass(slots=True)
class _Run:
    """What one call of :func:`solve` has found so far (reduced-problem choices)."""

    problem: SearchProblem
    red: Reduction
    start: float
    time_limit: float
    log: list[str] = field(default_factory=list)

    def left(self) -> float:
        return self.time_limit - (time.perf_counter() - self.start)

    def finish(self, reduced_choice: Sequence[int], bound: float, optimal: bool, method: str) -> Solution:
        """Expand to the original nodes; ``bound`` is a lower bound on the *original* objective."""
        choice = self.red.expand(reduced_choice)
        objective = evaluate(self.problem, choice)
        if not math.isfinite(objective):
            raise _no_finite_plan(self.problem, choice)
        limit = self.problem.memory_limit
        assert limit is None or memory_of(self.problem, choice) <= limit * (1 + 1e-12), (
            "plan breaks the budget"
        )
        bound = objective if optimal else min(bound, objective)
        return Solution(
            choice=choice,
            objective=objective,
            lower_bound=bound,
            gap=relative_gap(objective, bound),
            optimal=optimal,
            method=method,
            seconds=time.perf_counter() - self.start,
            log=tuple(self.log),
        )


def trivial_lower_bound(problem: SearchProblem) -> float:
    """Every node and every edge at its own cheapest allowed entry: a valid bound, usually loose."""
    form = pairwise_form(problem)
    return math.fsum(float(u.min()) for u in form.unary) + math.fsum(
        float(f.min()) for f in form.pairs.values()
    )


def _no_finite_plan(problem: SearchProblem, choice: Sequence[int]) -> InfeasibleError:
    """Name where even the optimum breaks (arc consistency passed, so the cause is a cycle of constraints).

    Every plan of an infeasible component costs ``inf``, the optimum included; its ``inf`` edges show where.
    """
    parent = list(range(problem.num_nodes))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for e in problem.edges:
        parent[find(e.u)] = find(e.v)
    broken = [e for e in problem.edges if not math.isfinite(float(e.cost[choice[e.u], choice[e.v]]))]
    bad = {find(e.u) for e in broken}
    names = [problem.names[i] for i in range(problem.num_nodes) if find(i) in bad]
    shown = ", ".join(names[:12]) + (f" and {len(names) - 12} more" if len(names) > 12 else "")
    where = ", ".join(f"{problem.names[e.u]} -> {problem.names[e.v]}" for e in broken[:6])
    return InfeasibleError(
        f"no finite-cost plan exists for the nodes {shown}: every combination of their strategies includes "
        f"an impossible conversion or a non-dividing shard (the cheapest plan still breaks at {where}). Fix: "
        "a mesh whose axis sizes divide these tensors' dims, or strategies that allow replication."
    )


def _exact_label(ex: ExactSolver) -> str:
    return "exact:reduce" if ex.method == "none" else f"exact:{ex.method}"


def _exact_solver(run: _Run, max_factor_size: float) -> ExactSolver | None:
    try:
        return ExactSolver(pairwise_form(run.red.problem), max_factor_size)
    except FactorCapExceeded as e:
        run.log.append(f"exact: {e}; treewidth too high, using CP-SAT")
        return None


def _fits(problem: SearchProblem, choice: Sequence[int]) -> bool:
    ok = math.isfinite(evaluate(problem, choice))
    return ok and (problem.memory_limit is None or memory_of(problem, choice) <= problem.memory_limit)


def _ilp(
    run: _Run, hint: Sequence[int | None] | None, num_workers: int, floor: float = -math.inf
) -> Solution:
    """CP-SAT on the reduced problem; ``floor`` is a lower bound on the reduced objective known already."""
    from autoshard.search.ilp import solve_ilp  # lazy: ortools pulls in pandas (~0.5 s of import)

    rp = run.red.problem
    if hint is None or all(h is None for h in hint):
        hint = propagate(rp)
        run.log.append("hint: propagation plan")
    res = solve_ilp(rp, time_limit=max(0.01, run.left()), num_workers=num_workers, hint=hint)
    run.log.extend(res.log)
    bound = max(res.lower_bound, floor) + run.red.cost_offset
    full_hint = [h for h in hint if h is not None]
    hint_ok = len(full_hint) == rp.num_nodes and _fits(rp, full_hint)
    if res.choice is not None and (not hint_ok or evaluate(rp, res.choice) <= evaluate(rp, full_hint)):
        return run.finish(res.choice, bound, res.optimal, "cp-sat")
    if hint_ok:
        run.log.append(f"cp-sat ({res.status}) did not beat the warm start; returning the warm start")
        return run.finish(full_hint, bound, False, "warm-start")
    raise InfeasibleError(
        f"CP-SAT found no plan within the time limit ({run.time_limit:.0f} s) and did not prove "
        "infeasibility either. Fix: raise time_limit, or the memory limit."
    )


@dataclass(slots=True)
class _Lagrange:
    """Best plan that fits the budget (reduced space) and the best Lagrangian bound on the reduced optimum."""

    plan: tuple[int, ...]
    cost: float
    bound: float

    def closed(self) -> bool:
        return self.cost - self.bound <= 1e-9 * max(abs(self.cost), 1e-300)


def _lagrange(ex: ExactSolver, rp: SearchProblem, lag: _Lagrange, lam0: float, run: _Run) -> _Lagrange:
    """Sweep ``lambda``: each exact min of cost + lambda * (memory - limit) is a lower bound, and each
    minimiser that fits the budget a plan."""
    assert rp.memory is not None and rp.memory_limit is not None
    memory, limit = rp.memory, rp.memory_limit

    def probe(lam: float) -> bool:
        unary = [c + lam * m for c, m in zip(ex.form.unary, memory, strict=True)]
        plan, value = ex.solve(unary)
        lag.bound = max(lag.bound, value - lam * limit)
        fits = memory_of(rp, plan) <= limit
        cost = evaluate(rp, plan)
        if fits and cost < lag.cost:
            lag.plan, lag.cost = plan, cost
        return fits

    lo, hi, steps = 0.0, lam0, 0
    while steps < _LAGRANGE_STEPS and not probe(hi):
        lo, hi, steps = hi, hi * 4.0, steps + 1
    while steps < _LAGRANGE_STEPS and not lag.closed() and run.left() > 0.5 * run.time_limit:
        mid = math.sqrt(lo * hi) if lo > 0 else hi / 4.0
        lo, hi = (lo, mid) if probe(mid) else (mid, hi)
        steps += 1
    run.log.append(
        f"lagrangian: {steps + 1} exact solves, best fitting plan {lag.cost:.6g} s, bound {lag.bound:.6g} s "
        f"(reduced problem)"
    )
    return lag


def _with_budget(run: _Run, ex: ExactSolver, method: Method, num_workers: int, max_factor: float) -> Solution:
    rp, off = run.red.problem, run.red.memory_offset
    assert rp.memory_limit is not None
    plan, value = ex.solve()
    used = memory_of(rp, plan) + off
    if used <= rp.memory_limit + off:
        run.log.append(
            f"exact: the optimum without the budget fits ({format_bytes(used)} of "
            f"{format_bytes(rp.memory_limit + off)}), so it is optimal under the budget too"
        )
        return run.finish(plan, value + run.red.cost_offset, True, _exact_label(ex))
    least, least_mem = min_memory_plan(rp, max_factor_size=max_factor)
    if not least_mem <= rp.memory_limit:
        raise memory_infeasible_error(run.problem, memory_lower_bound(run.problem), least_mem + off)
    lam0 = max(value, 1e-12) / max(used, 1.0)
    lag = _lagrange(ex, rp, _Lagrange(least, evaluate(rp, least), value), lam0, run)
    if method == "exact" or lag.closed():
        return run.finish(lag.plan, lag.bound + run.red.cost_offset, lag.closed(), "exact:lagrangian")
    return _ilp(run, lag.plan, num_workers, floor=lag.bound)


def solve(
    problem: SearchProblem,
    *,
    method: Method = "auto",
    time_limit: float = 60.0,
    num_workers: int = 2,
    hint: Sequence[int] | None = None,
    max_factor_size: float = MAX_FACTOR_SIZE,
) -> Solution:
    """The best plan for ``problem`` within ``time_limit`` seconds (see the module docstring for the methods).

    Raises InfeasibleError when no finite plan fits (the message names the nodes or the least memory needed)
    and AnnotationConflictError (an AnnotationError and an InfeasibleError) when annotations conflict.
    """
    start = time.perf_counter()
    if method == "propagate":
        sol = _propagate(problem, start)
        if sol is not None:
            return sol
    # Eliminating memory-free nodes shrinks the CP-SAT model; without one, tree DP / VE does it faster.
    red = reduce_problem(problem, eliminate_free=problem.memory_limit is not None or method == "ilp")
    run = _Run(problem, red, start, time_limit, log=list(red.log))
    if method == "propagate":
        run.log.insert(0, "propagate: the plan has inf cost or breaks the budget; solving exactly instead")
        method = "auto"
    if method == "ilp":
        return _ilp(run, None if hint is None else red.restrict(hint), num_workers)
    ex = _exact_solver(run, max_factor_size)
    if ex is None:
        if method == "exact":
            raise AutoshardError(
                "method='exact' cannot solve this graph: " + run.log[-1] + ". Use method='auto' or 'ilp'."
            )
        return _ilp(run, None if hint is None else red.restrict(hint), num_workers)
    run.log.append(f"exact: {ex.method}, width {ex.width}, largest table {ex.largest_factor} entries")
    if red.problem.memory_limit is not None:
        return _with_budget(run, ex, method, num_workers, max_factor_size)
    plan, value = ex.solve()
    return run.finish(plan, value + red.cost_offset, True, _exact_label(ex))


def _propagate(problem: SearchProblem, start: float) -> Solution | None:
    """The propagation plan as a Solution, or None when it is not a valid plan (inf or over budget)."""
    choice = propagate(problem)
    objective = evaluate(problem, choice)
    limit = problem.memory_limit
    if not math.isfinite(objective) or (limit is not None and memory_of(problem, choice) > limit):
        return None
    bound = min(trivial_lower_bound(problem), objective)
    return Solution(
        choice=choice,
        objective=objective,
        lower_bound=bound,
        gap=relative_gap(objective, bound),
        optimal=False,
        method="propagate",
        seconds=time.perf_counter() - start,
        log=(
            "propagate: greedy breadth-first plan from the annotations; lower bound: cheapest entry per term",
        ),
    )
