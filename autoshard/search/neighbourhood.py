"""Fitting plans from the Lagrangian's minimisers by exact re-solves of small neighbourhoods.

Input: a :class:`~autoshard.search.problem.SearchProblem` with a memory budget, a plan over it (a minimiser of
``cost + lambda * memory`` just below the best multiplier) and the best plan known to fit.
Output: the cheapest plan found that fits and costs less than that one, or ``None``.  A heuristic for the
*upper* bound only (large-neighbourhood search): what the solver states as proven is still the dual's lower
bound, so a better plan only narrows the stated gap, and every plan returned is checked against the budget.

Why.  Identical layers share one strategy per position, so one choice in the layer moves ``N`` layers'
memory at once and the plans' (memory, cost) frontier has steps of gigabytes: the two minimisers that bracket
the budget are far apart, and their cheapest fitting neighbour sits in between.  On the 405B-shaped LLaMA's
pipeline stage (8 x 16 x 8, selective recomputation) the minimiser over the budget differs from the fitting
one in the parameters' layouts only (FSDP or not): the activations are already where they should be.

Neighbourhoods of an over-budget plan ``x`` (every node outside keeps ``x``'s strategy), tried in turn:

* ``differ``: the nodes where ``x`` and the best fitting plan differ (the fitting plan is inside, so the
  result is never worse than it);
* ``differ+saving``: and the nodes whose strategy in ``x`` holds more than their least memory;
* ``saving+neighbours``: the nodes that could save memory and everything adjacent to them (an FSDP weight
  and the gathered copy its consumer reads).

Each neighbourhood is a budgeted problem of a few dozen small domains once the fixed nodes fold
(:func:`~autoshard.search.reduce.reduce_problem`), solved exactly by enumeration or by elimination over
(memory, cost) Pareto sets (:mod:`~autoshard.search.pareto`); a neighbourhood too large for either is skipped.

Example::

    >>> import numpy as np
    >>> from autoshard.search.problem import SearchProblem
    >>> p = SearchProblem((np.array([0.0, 1.0]), np.array([0.0, 3.0]), np.array([0.0, 0.5])), (),
    ...                   ("a", "b", "c"), memory=(np.array([5.0, 1.0]), np.array([5.0, 1.0]),
    ...                   np.array([2.0, 0.0])), memory_limit=8.0)
    >>> improve(p, over=(0, 0, 0), fitting=(1, 1, 0))           # a and c save 6 bytes for 1.5 s
    (1, 0, 1)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import numpy as np

from autoshard.errors import AutoshardError, InfeasibleError
from autoshard.search.brute import brute_force
from autoshard.search.pareto import pareto_plan
from autoshard.search.problem import SearchProblem, Solution, evaluate, memory_of
from autoshard.search.reduce import reduce_problem

__all__ = ["improve", "neighbourhoods"]

#: Plans a neighbourhood may hold to be enumerated outright (the rest goes to the Pareto elimination).
_ENUMERATE = 20_000


def neighbourhoods(
    problem: SearchProblem, over: Sequence[int], fitting: Sequence[int]
) -> list[tuple[str, frozenset[int]]]:
    """The node sets to re-solve around ``over`` (module docstring), smallest first, without repeats."""
    assert problem.memory is not None
    differ = {i for i in range(problem.num_nodes) if over[i] != fitting[i]}
    saving = set()
    for i, m in enumerate(problem.memory):
        finite = np.isfinite(problem.node_costs[i])
        if finite.any() and float(m[over[i]]) > float(m[finite].min()):
            saving.add(i)
    if problem.peak is not None:  # with peak terms, the nodes holding more than the least peak any plan has
        floor = max(float(np.min(p)) for p in problem.peak)
        saving |= {i for i, p in enumerate(problem.peak) if float(p[over[i]]) > floor}
    adjacent = set(saving)
    for e in problem.edges:
        if e.u in saving or e.v in saving:
            adjacent.update((e.u, e.v))
    out: list[tuple[str, frozenset[int]]] = []
    for name, nodes in (
        ("differ", differ),
        ("differ+saving", differ | saving),
        ("saving+neighbours", adjacent),
    ):
        key = frozenset(nodes)
        if key and all(key != seen for _, seen in out):
            out.append((name, key))
    return out


def _solve_within(
    problem: SearchProblem,
    base: Sequence[int],
    free: frozenset[int],
    upper: float,
    solver: Callable[..., Solution] | None = None,
) -> tuple[int, ...] | None:
    """The cheapest fitting plan that keeps ``base`` outside ``free``, if one costs less than ``upper``."""
    masks = []
    for i, size in enumerate(problem.sizes):
        mask = np.zeros(size, dtype=bool)
        if i in free:
            given = None if problem.allowed is None else problem.allowed[i]
            mask[:] = True if given is None else given
        else:
            mask[base[i]] = True
        masks.append(mask)
    sub = dataclasses.replace(problem, allowed=tuple(masks))
    if solver is not None:  # e.g. with peak terms: the full solver on the small problem
        try:
            plan = solver(sub, method="exact").choice
        except AutoshardError:
            return None
        return _checked(problem, plan, upper)
    try:
        red = reduce_problem(sub)
    except InfeasibleError:
        return None  # the fixed part alone breaks the budget
    if math.prod(red.problem.sizes) <= _ENUMERATE:
        try:
            found: tuple[int, ...] | None = brute_force(red.problem, max_assignments=_ENUMERATE).choice
        except InfeasibleError:
            return None
    else:
        found = pareto_plan(red.problem, upper=upper - red.cost_offset)
    if found is None:
        return None
    return _checked(problem, red.expand(found), upper)


def _checked(problem: SearchProblem, plan: tuple[int, ...], upper: float) -> tuple[int, ...] | None:
    """``plan`` when it fits the budget (peak included) and costs less than ``upper``."""
    limit = problem.memory_limit
    assert limit is not None
    if memory_of(problem, plan) > limit or not evaluate(problem, plan) < upper:
        return None
    return plan


def improve(
    problem: SearchProblem,
    over: Sequence[int],
    fitting: Sequence[int],
    upper: float | None = None,
    solver: Callable[..., Solution] | None = None,
) -> tuple[int, ...] | None:
    """The cheapest fitting plan found in the neighbourhoods of ``over`` that beats ``fitting`` (or
    ``upper``, the cost of a better fitting plan known elsewhere); ``None`` when none does.  ``solver``
    (:func:`~autoshard.search.solve.solve`) solves each neighbourhood instead of the reduction and
    enumeration / Pareto elimination here: needed when ``problem`` has peak terms."""
    best: tuple[int, ...] | None = None
    cost = evaluate(problem, fitting) if upper is None else upper
    for _, free in neighbourhoods(problem, over, fitting):
        found = _solve_within(problem, over, free, cost, solver)
        if found is not None:
            best, cost = found, evaluate(problem, found)
    return best
