"""A binding memory budget: Lagrangian bound, a plan that fits, and Lagrangian fixing of strategies.

Input: an :class:`~autoshard.search.exact.ExactSolver` over a reduced problem with a memory budget ``L``.
Output: a :class:`Lagrange` record (best fitting plan, proven lower bound, the multiplier that gave it) and
keep masks of the strategies that can still be part of a plan cheaper than the best one found.

Relaxation.  For ``lambda >= 0`` every plan ``x`` that fits satisfies::

    cost(x)  >=  cost(x) + lambda * (mem(x) - L)  >=  min_y [cost(y) + lambda * mem(y)] - lambda * L  =: g(lambda)

so ``g`` is a lower bound, computed by one exact solve with unary costs ``c + lambda * m``; each minimiser
that fits is a plan.  ``g`` is concave and piecewise linear; its maximum sits where the minimiser's memory
crosses ``L``, found by cutting planes on ``lambda`` (:func:`dual_search`).

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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from autoshard.search.exact import ExactSolver
from autoshard.search.problem import SearchProblem, evaluate, memory_of

__all__ = [
    "MAX_SOLVES",
    "Lagrange",
    "Relaxed",
    "below_masks",
    "dual_search",
    "fixing_masks",
    "lagrangian_sweep",
    "relaxed_marginals",
]

#: Exact solves one sweep may spend; the cutting planes usually stop well before.
MAX_SOLVES = 30

#: Relative tolerance that keeps float rounding from fixing away a strategy of an equally good plan.
_SLACK = 1e-9

#: A minimiser of ``cost + lambda * memory`` and that value, for one ``lambda``; None when that relaxed
#: problem could not be solved exactly (too wide at this multiplier): the search then stops where it is.
Relaxed = Callable[[float], tuple[tuple[int, ...], float] | None]

#: A starting plan's line whose crossing with the rising line lies beyond this many times ``lam0`` is not
#: probed first: ``lam0``, then ``4 * lam0`` are (at most :data:`_FAR_PROBES`), until a minimiser fits
#: (see :func:`dual_search`).
_FAR = 4.0
_FAR_PROBES = 2

#: Multipliers tried below ``lam0``, each a quarter of the last, before ``lambda = 0`` when ``descend`` asks
#: for a minimiser over the budget (the rising line) without solving the unbudgeted problem first.
_DESCENT = 4


@dataclass(slots=True)
class Lagrange:
    """Best fitting plan (reduced space) and its cost, the best bound ``g(lam)`` and its ``lam``."""

    plan: tuple[int, ...]
    cost: float
    bound: float
    lam: float
    solves: int = 0
    over: list[tuple[int, ...]] = field(default_factory=list)  # probed minimisers over the budget
    failed: int = 0  # probes whose relaxed problem could not be solved

    @property
    def binding(self) -> bool:
        """Whether the budget provably binds: a minimiser of ``cost + lambda * memory`` (``lambda >= 0``) over
        the budget means no optimum without the budget fits it (were ``x0`` one, the minimiser ``y`` would
        have ``cost(y) >= cost(x0)``, hence ``mem(y) <= mem(x0) <= L``)."""
        return bool(self.over)

    def closed(self) -> bool:
        return self.cost - self.bound <= _SLACK * max(abs(self.cost), 1e-300)


def lagrangian_sweep(
    ex: ExactSolver,
    problem: SearchProblem,
    lag: Lagrange,
    lam0: float,
    seeds: Sequence[tuple[int, ...]] = (),
    ceiling: float = math.inf,
    first: float | None = None,
    tolerance: float = 0.0,
    known: Mapping[float, tuple[tuple[int, ...], float]] | None = None,
) -> Lagrange:
    """Maximise ``g(lambda)`` from ``lam0`` with exact solves on ``ex``, improving ``lag`` in place (and
    returning it); see :func:`dual_search`.  ``known``: relaxed solves the caller already made on this
    problem, by multiplier (taken as they are, not solved again)."""
    assert problem.memory is not None

    def relaxed(lam: float) -> tuple[tuple[int, ...], float] | None:
        if known and lam in known:
            return known[lam]
        return ex.solve([c + lam * m for c, m in zip(ex.form.unary, problem.memory, strict=True)])  # type: ignore[arg-type]

    return dual_search(relaxed, problem, lag, lam0, seeds, tolerance, ceiling=ceiling, first=first)


def dual_search(
    relaxed: Relaxed,
    problem: SearchProblem,
    lag: Lagrange,
    lam0: float,
    seeds: Sequence[tuple[int, ...]] = (),
    tolerance: float = 0.0,
    descend: bool = False,
    ceiling: float = math.inf,
    first: float | None = None,
) -> Lagrange:
    """Maximise ``g(lambda)``; ``relaxed(lam)`` returns a minimiser of ``cost + lam * memory`` and its value.

    Cutting planes (Kelley's method in one dimension): every plan ``x`` gives the line
    ``cost(x) + mu * (mem(x) - L)``, which is at least ``g(mu)`` for every ``mu`` and equal to it where ``x``
    minimises the relaxation.  The lowest line of a plan over the budget (rising) and of one under it
    (falling) cross at the only place ``max g`` can still be above what is proven; probe there: if ``g``
    reaches the crossing, that is ``max g``; otherwise the new minimiser's line replaces the one on its side
    and the crossing drops.  Finitely many plans, so it ends: on LLaMA-3-70B on 16 x 8 x 8 it takes 5-6
    probes where bisection took 23-24, reaching the same bound and plan; on the 405B-shaped LLaMA's stage
    problem 5.  The first lines are free: ``lag.plan`` (fits) and ``seeds`` (e.g. the optimum without the
    budget, else it is probed at ``lambda = 0``); without a fitting one, ``lam0`` is multiplied by 4 until
    the minimiser fits.  A starting plan far dearer than the relaxation's minimisers (the least-memory plan:
    2,670 s on LLaMA-3-70B on 16 x 8 x 8 where they cost 10-15 s) crosses the rising line far out (350 x
    ``lam0`` there), where the probe finds a poor fitting plan; when the crossing lies beyond ``_FAR * lam0``,
    ``lam0`` and ``4 * lam0`` are probed first, unless ``descend`` probed ``lam0`` already (70B's
    balanced-bound and contiguous solves: 4 -> 3 probes, the same bound, multiplier and plan).  Cutting
    planes are exact from any lines: only the probes depend on this.
    ``tolerance > 0`` stops early once the crossing, the most any multiplier can still prove, is within
    ``tolerance`` x the remaining gap of the bound reached (the bound stays a true one; the caller that states
    the gap rather than fixing strategies by it saves the last, confirming probes).  That gap is measured only
    once a probe's minimiser fits: a starting plan (the least-memory one, an incumbent) was never compared with
    a relaxation, so its cost says nothing of what the sweep can still find; a gap anchored on it (a
    least-memory plan at 176.9 s where the sweep finds 21-27 s) let the stop fire before any probe and hand
    that plan back.
    ``descend``: without a line over the budget, probe ``lam0``, ``lam0 / 4``, ... before ``lambda = 0``: the
    unbudgeted problem is the widest relaxation (memory ties keep its strategies from being dominated), and
    any minimiser over the budget at some ``lambda >= 0`` proves the budget binds (see
    :attr:`Lagrange.binding`).
    ``ceiling``: stop once the bound reaches it (the caller only asks whether a plan beats it; no plan does).
    ``first``: a multiplier probed before the cutting planes (a similar problem's best, e.g. the uniform
    recomputation policy's for the per-block search's intervals): with a ceiling, one probe there often
    proves the bound; without, its line cuts the search short.  Only the number of probes depends on it.
    The probe count (``MAX_SOLVES``), never the clock, ends the search: the same problem gives the same plan
    and bound on any machine load.
    """
    assert problem.memory is not None and problem.memory_limit is not None
    limit = problem.memory_limit
    lines: dict[bool, tuple[float, float] | None] = {True: None, False: None}  # fits -> (cost, mem)
    minimiser_fits = [False]  # whether some probe's minimiser fits (only then may ``tolerance`` stop early)

    def probe(lam: float) -> tuple[float, float, bool] | None:
        found = relaxed(lam)
        if found is None:
            lag.failed += 1
            return None
        plan, value = found
        lag.solves += 1
        if value - lam * limit > lag.bound:
            lag.bound, lag.lam = value - lam * limit, lam
        mem, cost = memory_of(problem, plan), evaluate(problem, plan)
        fits = mem <= limit
        if not fits:
            lag.over.append(plan)
        minimiser_fits[0] |= fits
        if fits and cost < lag.cost:
            lag.plan, lag.cost = plan, cost
        return cost, mem, fits

    def keep(lam: float, line: tuple[float, float], fits: bool) -> None:
        old = lines[fits]
        if old is None or _at(line, lam, limit) < _at(old, lam, limit):
            lines[fits] = line

    for plan in (lag.plan, *seeds):
        mem, cost = memory_of(problem, plan), evaluate(problem, plan)
        if math.isfinite(cost):
            keep(lam0, (cost, mem), mem <= limit)
    down = [lam0 / 4.0**k for k in range(_DESCENT)] if descend else []
    for lam in [*down, 0.0]:  # a minimiser over the budget: a rising line
        if lines[False] is not None:
            break
        got = probe(lam)
        if got is not None:
            keep(lam, got[:2], got[2])
    lam = lam0

    def going() -> bool:
        return lag.solves < MAX_SOLVES and lag.bound < ceiling

    def far() -> bool:
        """Whether the only falling line is a starting plan's whose crossing lies beyond ``_FAR * lam0``."""
        over, under = lines[False], lines[True]
        if descend or first is not None or minimiser_fits[0] or over is None or under is None:
            return False  # descend: lam0 was probed already
        if over[1] <= under[1]:
            return False
        return lag.solves < solves0 + _FAR_PROBES and _crossing(over, under) > _FAR * lam0

    solves0 = lag.solves

    while (lines[True] is None or far()) and going():
        got = probe(lam)
        if got is None:
            break
        keep(lam, got[:2], got[2])
        if got[2]:
            break
        lam *= 4.0
    if first is not None and first > 0.0 and math.isfinite(first) and not lag.closed() and going():
        got = probe(first)
        if got is not None:
            keep(first, got[:2], got[2])
    while not lag.closed() and going():
        over, under = lines[False], lines[True]
        if over is None or under is None or over[1] <= under[1]:
            break
        lam = _crossing(over, under)
        if not lam > 0.0 or not math.isfinite(lam):
            break
        peak = _at(over, lam, limit)
        if minimiser_fits[0] and peak - lag.bound <= tolerance * (lag.cost - lag.bound):
            break
        got = probe(lam)
        if got is None:
            break
        cost, mem, fits = got
        if cost + lam * (mem - limit) >= peak - _SLACK * max(abs(peak), 1e-300):
            break  # g reaches the crossing: no lambda bounds higher
        keep(lam, (cost, mem), fits)
    return lag


def _crossing(over: tuple[float, float], under: tuple[float, float]) -> float:
    """Where a rising line (a plan over the budget) and a falling one cross."""
    return (under[0] - over[0]) / (over[1] - under[1])


def _at(line: tuple[float, float], lam: float, limit: float) -> float:
    """A plan's line ``cost + lam * (mem - L)`` at ``lam``."""
    return line[0] + lam * (line[1] - limit)


def relaxed_marginals(ex: ExactSolver, problem: SearchProblem, lag: Lagrange) -> list[np.ndarray]:
    """Min-marginals of ``cost + lag.lam * memory`` (about three solves): what :func:`fixing_masks` and
    :func:`below_masks` compare, computed once for any number of thresholds."""
    assert problem.memory is not None
    return ex.min_marginals([c + lag.lam * m for c, m in zip(ex.form.unary, problem.memory, strict=True)])


def below_masks(
    marginals: Sequence[np.ndarray], problem: SearchProblem, lam: float, upper: float
) -> list[np.ndarray]:
    """Per node, the strategies that some fitting plan costing at most ``upper`` may use, from the
    min-marginals of ``cost + lam * memory`` (:func:`relaxed_marginals`; see the module docstring)."""
    assert problem.memory_limit is not None
    shift = lam * problem.memory_limit
    ceiling = upper + shift + _SLACK * (abs(upper) + shift)
    return [mm <= ceiling for mm in marginals]


def fixing_masks(
    ex: ExactSolver,
    problem: SearchProblem,
    lag: Lagrange,
    ceiling: float = math.inf,
    marginals: Sequence[np.ndarray] | None = None,
) -> list[np.ndarray]:
    """Per node, the strategies that some fitting plan costing at most ``min(lag.cost, ceiling)`` may use
    (see the module docstring).  ``ceiling`` is the cost of a better plan known elsewhere; ``marginals``:
    :func:`relaxed_marginals` of ``lag`` when the caller has them."""
    assert problem.memory is not None and problem.memory_limit is not None
    if marginals is None:
        marginals = relaxed_marginals(ex, problem, lag)
    keep = below_masks(marginals, problem, lag.lam, min(lag.cost, ceiling))
    for i, s in enumerate(lag.plan):
        keep[i][s] = True  # rounding aside, its own marginal is at most its cost: keep it in any case
    return keep
