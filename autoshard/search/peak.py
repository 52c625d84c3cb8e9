"""A memory budget with a peak term: ``sum_i memory[i] + max_i peak[i] <= L``, solved exactly by thresholds.

Input: a :class:`~autoshard.search.problem.SearchProblem` with ``peak`` and a budget, and the plain solver
(:func:`~autoshard.search.solve.solve`).  Output: a :class:`~autoshard.search.problem.Solution` whose plan
meets the budget *with* its peak, optimal when every solve it made was.

For a threshold ``t`` let ``P(t)`` be the problem without the peak, with every strategy whose peak exceeds
``t`` forbidden and the budget lowered to ``L - t``.  A plan fits the original problem iff it fits
``P(t)`` for ``t`` = its own peak, so the optimum is ``min_t OPT(P(t))`` over the distinct peak values ``t``
at or above the floor ``f`` (the least peak any plan has: each node's least, maximised).  Two steps:

1. the relaxation: no strategy forbidden, budget ``L - f`` (every plan holds at least ``f``).  Its optimum
   is a lower bound; if its plan fits with its own peak, it is optimal (the usual case: the largest
   temporary is small next to the budget, and one solve answers);
2. otherwise every threshold, smallest first, until ``L - t`` is below the least memory of the rest; the
   cheapest plan found is optimal, and the least lower bound over thresholds is the proven bound.

The solvers underneath see plain problems (masks and a budget), CP-SAT included.

Example::

    >>> import numpy as np
    >>> from autoshard.search.problem import SearchProblem
    >>> from autoshard.search.solve import solve
    >>> p = SearchProblem((np.array([0.0, 1.0]), np.array([0.0, 1.0])), (), ("a", "b"),
    ...                   memory=(np.array([4.0, 1.0]), np.array([4.0, 1.0])), memory_limit=9.0,
    ...                   peak=(np.array([2.0, 0.0]), np.array([0.0, 0.0])))
    >>> s = solve(p); s.choice, s.objective                       # a at 0 would need 4 + 4 + 2 = 10 > 9
    ((1, 0), 1.0)
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from collections.abc import Callable

import numpy as np

from autoshard.errors import InfeasibleError
from autoshard.search.exact import FactorCapExceeded, min_memory_plan
from autoshard.search.problem import (
    SearchProblem,
    Solution,
    format_bytes,
    memory_lower_bound,
    memory_of,
    peak_floor,
    relative_gap,
)
from autoshard.search.run import BoundExceeded

__all__ = ["at_threshold", "solve_with_peak", "thresholds"]


def solve_with_peak(
    problem: SearchProblem, solve: Callable[..., Solution], ceiling: float = math.inf, **kwargs
) -> Solution:
    """The best plan under ``memory + max peak <= limit`` (module docstring); ``solve`` solves plain problems.

    ``ceiling`` (mesh-search pruning) reaches only the first, relaxed solve: it has every strategy, so its
    optimum without the budget is the whole problem's; the threshold problems mask strategies out."""
    start = time.perf_counter()
    plain = dataclasses.replace(problem, peak=None)
    limit = problem.memory_limit
    if limit is None or problem.peak is None:
        return solve(plain, **kwargs)
    floor = peak_floor(problem)
    if memory_lower_bound(problem) > limit:
        raise _too_big(problem, floor)
    try:
        relaxed = solve(
            dataclasses.replace(plain, memory_limit=limit - floor),
            ceiling=ceiling,
            peak=problem.peak,
            **kwargs,
        )
    except InfeasibleError as e:
        raise _too_big(problem, floor) from e
    if memory_of(problem, relaxed.choice) <= limit:
        return dataclasses.replace(relaxed, seconds=time.perf_counter() - start)
    log = [
        *relaxed.log,
        f"peak: the relaxed plan's largest peak overshoots; thresholds from {format_bytes(floor)}",
    ]
    best: Solution | None = None
    bounds: list[float] = []
    optimal = True
    least = memory_lower_bound(plain)
    stopped = False
    for t in thresholds(problem, floor):
        if limit - t < least:
            break  # higher thresholds leave less budget still
        sub = at_threshold(plain, problem.peak, t, limit)
        if sub is None or memory_lower_bound(sub) > limit - t:
            continue
        try:  # the best plan so far is the ceiling: a threshold proven no cheaper stops at its bound
            found = solve(sub, ceiling=math.inf if best is None else best.objective, **kwargs)
        except InfeasibleError:
            continue
        except BoundExceeded as e:
            bounds.append(e.bound)
            continue
        bounds.append(found.lower_bound)
        optimal = optimal and found.optimal
        if best is None or found.objective < best.objective:
            best = found
        if not relaxed.optimal:
            # The relaxation's bound is all the thresholds could prove here short of closing its gap; each
            # further threshold is another Lagrangian solve (the 405B stage: ~5 relaxed solves) looking for a
            # cheaper plan only, so the first plan that fits with its peak is kept, with that bound.
            stopped = True
            break
    if best is None:
        raise _too_big(problem, floor)
    bound = relaxed.lower_bound if stopped else max(relaxed.lower_bound, min(bounds))
    optimal = optimal and not stopped
    log.append(f"peak: {len(bounds)} thresholds solved; best {best.objective:.6g} s")
    return dataclasses.replace(
        best,
        lower_bound=min(bound, best.objective),
        gap=relative_gap(best.objective, min(bound, best.objective)),
        optimal=optimal,
        method=f"{best.method}+peak",
        seconds=time.perf_counter() - start,
        log=tuple(log),
    )


def thresholds(problem: SearchProblem, floor: float) -> list[float]:
    assert problem.peak is not None
    values = np.unique(np.concatenate([p.ravel() for p in problem.peak]))
    return [float(v) for v in values if v >= floor]


def at_threshold(
    plain: SearchProblem, peak: tuple[np.ndarray, ...], t: float, limit: float
) -> SearchProblem | None:
    """``P(t)``: strategies with a peak above ``t`` forbidden, budget ``limit - t`` (None if a node has none)."""
    masks = []
    for i, p in enumerate(peak):
        mask = p <= t
        given = plain.allowed[i] if plain.allowed is not None else None
        if given is not None:
            mask = mask & given
        if not mask.any():
            return None
        masks.append(mask)
    return dataclasses.replace(plain, allowed=tuple(masks), memory_limit=limit - t)


def _too_big(problem: SearchProblem, floor: float) -> InfeasibleError:
    limit = problem.memory_limit
    assert limit is not None
    need = memory_lower_bound(problem)
    with contextlib.suppress(FactorCapExceeded):  # the least sum any plan needs + the least peak: tighter
        need = max(need, min_memory_plan(dataclasses.replace(problem, peak=None))[1] + floor)
    over = max(need - limit, 0.0)
    # a floor of 0 B says nothing (new-user trial: an MLP's "largest temporary alone at least 0 B")
    temporary = f"; the largest temporary alone at least {format_bytes(floor)}" if floor > 0 else ""
    return InfeasibleError(
        f"no plan fits the memory budget of {format_bytes(limit)} per device: every plan needs at least "
        f"{format_bytes(need)} ({format_bytes(over)} over{temporary}). Fix: more devices (a larger mesh "
        "shards more), allow fsdp, recompute activations, or raise the memory limit."
    )
