"""A binding memory budget: Lagrangian bound, a plan that fits, and Lagrangian fixing of strategies.

Input: an :class:`~autoshard.search.exact.ExactSolver` over a reduced problem with a memory budget ``L``.
Output: a :class:`Lagrange` record (best fitting plan, proven lower bound, the multiplier that gave it) and
keep masks of the strategies that can still be part of a plan cheaper than the best one found.

Relaxation.  For ``lambda >= 0`` every plan ``x`` that fits satisfies::

    cost(x)  >=  cost(x) + lambda * (mem(x) - L)  >=  min_y [cost(y) + lambda * mem(y)] - lambda * L  =: g(lambda)

so ``g`` is a lower bound, computed by one exact solve with unary costs ``c + lambda * m``; each minimiser
that fits is a plan.  ``g`` is concave and piecewise linear; its maximum sits where the minimiser's memory
crosses ``L``, found by bisection on ``lambda`` (geometric: the scale of seconds per byte is unknown).

Fixing (exact).  With the min-marginals ``mm[i][s]`` of the relaxed objective (the least value of
``cost + lambda * mem`` over plans with ``x_i = s``), every fitting plan with ``x_i = s`` costs at least
``mm[i][s] - lambda * L``.  When that exceeds the cost ``U`` of the best fitting plan, no optimal plan uses
``s``: it goes.  The best plan itself always stays.  On LLaMA-3-8B with a tight budget this keeps ~1 in 9
strategies, and the reduction that follows (dominance, folding) shrinks what CP-SAT sees accordingly.

Example::

    >>> import numpy as np
    >>> from autoshard.search.exact import ExactSolver
    >>> from autoshard.search.problem import SearchProblem, pairwise_form
    >>> p = SearchProblem((np.array([0.0, 1.0, 5.0]),), (), ("a",), memory=(np.array([9.0, 5.0, 1.0]),),
    ...                   memory_limit=6.0)
    >>> ex = ExactSolver(pairwise_form(p))
    >>> lag = lagrangian_sweep(ex, p, Lagrange((2,), 5.0, 0.0, 0.0), lam0=0.1)
    >>> lag.plan, lag.cost, round(lag.bound, 6)         # plan 1 fits; no plan costs less than 0.75
    ((1,), 1.0, 0.75)
    >>> fixing_masks(ex, p, lag)[0].tolist()            # strategy 2 costs at least 3.75 > 1: it goes
    [True, True, False]
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from autoshard.search.exact import ExactSolver
from autoshard.search.problem import SearchProblem, evaluate, memory_of

__all__ = ["MAX_SOLVES", "Lagrange", "fixing_masks", "lagrangian_sweep"]

#: Exact solves one sweep may spend; bisection usually stops well before (the bracket closes).
MAX_SOLVES = 30

#: Relative tolerance that keeps float rounding from fixing away a strategy of an equally good plan.
_SLACK = 1e-9


@dataclass(slots=True)
class Lagrange:
    """Best fitting plan (reduced space) and its cost, the best bound ``g(lam)`` and its ``lam``."""

    plan: tuple[int, ...]
    cost: float
    bound: float
    lam: float
    solves: int = 0

    def closed(self) -> bool:
        return self.cost - self.bound <= _SLACK * max(abs(self.cost), 1e-300)


def lagrangian_sweep(
    ex: ExactSolver, problem: SearchProblem, lag: Lagrange, lam0: float, deadline: float = math.inf
) -> Lagrange:
    """Maximise ``g(lambda)`` by bisection from ``lam0``, improving ``lag`` in place (and returning it).

    ``deadline`` (a ``time.perf_counter`` value) only guards against pathological graphs: the number of
    solves, not the clock, ends a normal sweep, so the result does not depend on the machine's speed.
    """
    assert problem.memory is not None and problem.memory_limit is not None
    memory, limit = problem.memory, problem.memory_limit

    def probe(lam: float) -> bool:
        unary = [c + lam * m for c, m in zip(ex.form.unary, memory, strict=True)]
        plan, value = ex.solve(unary)
        lag.solves += 1
        if value - lam * limit > lag.bound:
            lag.bound, lag.lam = value - lam * limit, lam
        fits = memory_of(problem, plan) <= limit
        cost = evaluate(problem, plan)
        if fits and cost < lag.cost:
            lag.plan, lag.cost = plan, cost
        return fits

    lo, hi = 0.0, lam0
    while lag.solves < MAX_SOLVES and not probe(hi):
        lo, hi = hi, hi * 4.0
    while (
        lag.solves < MAX_SOLVES
        and not lag.closed()
        and hi > lo * (1 + 1e-6)
        and time.perf_counter() < deadline
    ):
        mid = math.sqrt(lo * hi) if lo > 0 else hi / 4.0
        lo, hi = (lo, mid) if probe(mid) else (mid, hi)
    return lag


def fixing_masks(
    ex: ExactSolver, problem: SearchProblem, lag: Lagrange, ceiling: float = math.inf
) -> list[np.ndarray]:
    """Per node, the strategies that some fitting plan costing at most ``min(lag.cost, ceiling)`` may use
    (see the module docstring).  ``ceiling`` is the cost of a better plan known elsewhere."""
    assert problem.memory is not None and problem.memory_limit is not None
    unary = [c + lag.lam * m for c, m in zip(ex.form.unary, problem.memory, strict=True)]
    marginals = ex.min_marginals(unary)
    upper = min(lag.cost, ceiling)
    shift = lag.lam * problem.memory_limit
    ceiling = upper + shift + _SLACK * (abs(upper) + shift)
    keep = [mm <= ceiling for mm in marginals]
    for i, s in enumerate(lag.plan):
        keep[i][s] = True  # rounding aside, its own marginal is at most its cost: keep it in any case
    return keep
