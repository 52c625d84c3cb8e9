"""Exhaustive search, the reference the real solvers are tested against (tiny graphs only).

Input: a :class:`~autoshard.search.problem.SearchProblem` with at most ``max_assignments`` assignments.
Output: a :class:`~autoshard.search.problem.Solution` with the lexicographically first optimal choice, memory
budget and masks respected.  Assignments are enumerated in vectorised chunks, not one Python loop per plan.

Example::

    >>> import numpy as np
    >>> from autoshard.search.problem import SearchProblem
    >>> brute_force(SearchProblem((np.array([2.0, 1.0]),), (), ("a",))).choice
    (1,)
"""

from __future__ import annotations

import math
import time

import numpy as np

from autoshard.errors import InfeasibleError
from autoshard.search.problem import SearchProblem, Solution

__all__ = ["brute_force"]

_CHUNK = 1 << 16


def _domains(problem: SearchProblem) -> list[np.ndarray]:
    doms = []
    for i, c in enumerate(problem.node_costs):
        mask = None if problem.allowed is None else problem.allowed[i]
        doms.append(np.arange(c.size) if mask is None else np.flatnonzero(mask))
    return doms


def _chunk_costs(problem: SearchProblem, plans: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Objective and memory of each row of ``plans`` (shape [k, n])."""
    cost = np.zeros(plans.shape[0])
    for i, c in enumerate(problem.node_costs):
        cost += c[plans[:, i]]
    for e in problem.edges:
        cost += e.cost[plans[:, e.u], plans[:, e.v]]
    mem = np.zeros(plans.shape[0])
    if problem.memory is not None:
        for i, m in enumerate(problem.memory):
            mem += m[plans[:, i]]
    if problem.peak is not None:  # only the largest counts (SearchProblem.peak)
        mem += np.max([p[plans[:, i]] for i, p in enumerate(problem.peak)], axis=0)
    return cost, mem


def brute_force(problem: SearchProblem, *, max_assignments: int = 1_000_000) -> Solution:
    """The optimal choice by enumeration; raises InfeasibleError when no finite plan fits the budget."""
    start = time.perf_counter()
    doms = _domains(problem)
    total = math.prod(d.size for d in doms)
    if total > max_assignments:
        raise ValueError(f"{total} assignments exceed max_assignments={max_assignments}; use solve()")
    sizes = [d.size for d in doms]
    best_cost, best_plan = math.inf, None
    for lo in range(0, total, _CHUNK):
        flat = np.arange(lo, min(total, lo + _CHUNK))
        idx = np.stack(np.unravel_index(flat, sizes), axis=1) if sizes else np.zeros((flat.size, 0), int)
        plans = np.stack([d[idx[:, i]] for i, d in enumerate(doms)], axis=1) if doms else idx
        cost, mem = _chunk_costs(problem, plans)
        if problem.memory_limit is not None:
            cost = np.where(mem <= problem.memory_limit, cost, np.inf)
        k = int(np.argmin(cost))
        if cost[k] < best_cost:
            best_cost, best_plan = float(cost[k]), plans[k]
    if best_plan is None:
        raise InfeasibleError(f"no finite-cost plan fits (brute force over {total} assignments)")
    return Solution(
        choice=tuple(int(s) for s in best_plan),
        objective=best_cost,
        lower_bound=best_cost,
        gap=0.0,
        optimal=True,
        method="brute",
        seconds=time.perf_counter() - start,
        log=(f"brute force: {total} assignments",),
    )
