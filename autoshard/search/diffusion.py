"""Closing the Lagrangian's duality gap: a tight reparametrisation, reduced-cost fixing, an exact re-solve.

Input: a :class:`~autoshard.search.problem.SearchProblem` with a memory budget ``L`` (too wide to eliminate
with its memory terms), a multiplier ``lam >= 0`` and a plan known to fit, of cost ``U``.
Output: a :class:`Fixed` record — the problem with every strategy and strategy pair that no fitting plan
cheaper than ``U`` can use forbidden, and the bound that proved it — which the full solver then solves
exactly (it is small: the 405B-shaped LLaMA's stage problem keeps 1 in 5 strategies and 1 in 80 pairs):
enumerated, eliminated over (memory, cost) Pareto sets, or, past those tables' caps, by CP-SAT with one
worker and a deterministic work limit (:func:`exact_below`'s ``work``).

Why.  The dual bound ``g(lam) = min_x [cost(x) + lam * mem(x)] - lam * L`` can sit below the optimum (the
plans' memory moves in steps of gigabytes: a duality gap).  Fixing strategies by their min-marginals would
close it, but the relaxed problem is solved by reduction (folding, dominance), which gives no min-marginals.
A *reparametrisation* gives them factor by factor: moving an amount ``d(s)`` from a node's cost to every
entry of row ``s`` of an edge's matrix changes no plan's total, and min-sum diffusion (Kovalevsky and
Koval; T. Werner, "A linear programming approach to max-sum problem: a review", IEEE TPAMI 2007) repeats
it, node by node, until each node's cost equals the average of itself and its edges' row minima.  Then

    LB = sum over factors f of min theta_f  -  lam * L

is a lower bound on every fitting plan's cost (each factor is at least its minimum, and ``mem(x) <= L``),
it rises to the linear-programming bound of the relaxation, and for every fitting plan ``x`` of cost at
most ``U`` the factors' excesses ``theta_f(x) - min theta_f`` sum to at most ``U - LB``.  So a strategy or a
strategy pair whose own excess is larger belongs to no such plan: it is forbidden (the plan of cost ``U``
always survives).  On the 405B stage the LP bound equals the relaxed optimum to 1e-13 after ~60 sweeps
(0.1 s), the gap ``U - LB`` is 0.09 %, and fixing leaves 1,012 of 5,190 strategies and 7,090 of 570,194
pairs, which the budgeted exact path (Lagrangian fixing, Pareto elimination) then solves to optimality.

Example::

    >>> import numpy as np
    >>> from autoshard.search.problem import Edge, SearchProblem
    >>> p = SearchProblem((np.array([0.0, 1.0, 5.0]), np.array([0.0, 1.0])),
    ...                   (Edge(0, 1, np.array([[0.0, 1.0], [1.0, 0.0], [0.0, 0.0]])),), ("a", "b"),
    ...                   memory=(np.array([9.0, 5.0, 1.0]), np.array([2.0, 1.0])), memory_limit=7.0)
    >>> f = fix_by_diffusion(p, lam=0.5, upper=2.0)         # (1, 1): cost 2, memory 6 fits
    >>> [m.tolist() for m in f.problem.allowed]  # type: ignore[union-attr]  # a at 2 alone costs 5: it goes
    [[True, True, False], [True, True]]
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from autoshard.errors import InfeasibleError
from autoshard.search.brute import brute_force
from autoshard.search.pareto import pareto_below
from autoshard.search.problem import Edge, SearchProblem, pairwise_form
from autoshard.search.reduce import Reduction, reduce_problem

__all__ = ["Fixed", "Reparametrised", "exact_below", "fix", "fix_by_diffusion", "reparametrise"]

#: Sweeps of min-sum diffusion at most; it stops earlier once a sweep raises the bound by less than
#: :data:`_STALL` relative.  Any sweep count gives a sound bound; a looser one only lets fixing keep a
#: little more.  The 405B stage under the causal pricing (1.5e6 pair entries, ~4 ms a sweep): 1e-12 took
#: 249 sweeps (1.03 s CPU); 1e-9 stops near 110, its bound 3e-5 s below (fixing thresholds: 0.1-0.5 s).
_SWEEPS = 300
_STALL = 1e-9

#: Relative slack on the fixing threshold: the reparametrised entries are sums of ``lam * memory`` terms of
#: up to 1e5 s, so rounding must not forbid a strategy of a plan that matches ``upper``.
_SLACK = 1e-9

#: Rounds of fixing and reduction before the exact solve (the 405B stage: the second round halves the
#: strategies again, a third changes little).
_ROUNDS = 3

#: Plans left that are enumerated outright rather than eliminated over Pareto sets.
_ENUMERATE = 20_000

#: Strategies left above which neither the Pareto elimination nor CP-SAT is tried: the elimination gives up
#: at its table caps after seconds (the 405B stage under full recomputation: 1,612 left at a 0.94 % gap;
#: solved at 469 at 0.09 %); CP-SAT's model takes seconds to build and solve there (the same stage at its
#: whole gap: 1,209-1,717 strategies on each of 13 peak thresholds, 1-3 s CPU each, 28 s in all, where the
#: selective stage's one residual of 818 strategies took 0.65 s).
_MAX_STRATEGIES = 1_000


@dataclass(frozen=True, slots=True)
class Reparametrised:
    """A problem's ``cost + lam * memory`` moved between its factors (no plan's total changes) so that the
    sum of the factors' minima, ``bound + lam * L``, is as high as diffusion gets it."""

    unary: tuple[np.ndarray, ...]
    pairs: dict[tuple[int, int], np.ndarray]
    bound: float  # sum of the factors' minima - lam * L: no fitting plan costs less
    slack: float  # absolute rounding allowance of the sums above


@dataclass(frozen=True, slots=True)
class Fixed:
    """``problem`` with the strategies (masks) and pairs (``inf``) that cannot beat ``upper`` forbidden."""

    problem: SearchProblem | None  # None: a node has no strategy left, so no plan is at most ``upper``
    bound: float  # the reparametrisation's lower bound on every fitting plan's cost
    kept: int  # strategies left
    total: int  # strategies before
    pairs_kept: int
    pairs_total: int


def _diffuse(unary: list[np.ndarray], pairs: dict[tuple[int, int], np.ndarray]) -> None:
    """Min-sum diffusion in place: each node's cost and its edges' row minima made equal (module docstring)."""
    touching: list[list[tuple[tuple[int, int], bool]]] = [[] for _ in unary]
    for a, b in pairs:
        touching[a].append(((a, b), True))
        touching[b].append(((a, b), False))
    last = -math.inf
    for _ in range(_SWEEPS):
        for i, u in enumerate(unary):
            if not touching[i]:
                continue
            rows = [pairs[k].min(axis=1) if first else pairs[k].min(axis=0) for k, first in touching[i]]
            share = (u + sum(rows)) / (len(rows) + 1)
            finite = np.isfinite(share)
            for (k, first), row in zip(touching[i], rows, strict=True):
                move = np.where(finite, share - np.where(finite, row, 0.0), 0.0)
                pairs[k] += move[:, None] if first else move[None, :]
            unary[i] = np.where(finite, share, np.inf)
        now = _total(unary, pairs)
        if now - last <= _STALL * max(abs(now), 1.0):
            break
        last = now


def _total(unary: Sequence[np.ndarray], pairs: dict[tuple[int, int], np.ndarray]) -> float:
    return math.fsum(float(u.min()) for u in unary) + math.fsum(float(p.min()) for p in pairs.values())


def reparametrise(problem: SearchProblem, lam: float) -> Reparametrised:
    """Min-sum diffusion of ``cost + lam * memory`` on ``problem`` (module docstring)."""
    assert problem.memory is not None and problem.memory_limit is not None
    form = pairwise_form(problem)
    unary = [
        u + lam * np.asarray(m, dtype=np.float64) for u, m in zip(form.unary, problem.memory, strict=True)
    ]
    pairs = {k: np.array(v, dtype=np.float64) for k, v in form.pairs.items()}
    _diffuse(unary, pairs)
    shift = lam * problem.memory_limit
    scale = math.fsum(abs(float(u.min())) for u in unary) + math.fsum(
        abs(float(p.min())) for p in pairs.values()
    )
    return Reparametrised(tuple(unary), pairs, _total(unary, pairs) - shift, _SLACK * (scale + shift))


def fix(problem: SearchProblem, rep: Reparametrised, upper: float, lift: float = 0.0) -> Fixed:
    """``problem`` (the nodes and strategies ``rep`` was made on, with its own masks and budget) with what no
    fitting plan of cost at most ``upper`` can use forbidden.  ``lift``: how much the bound rises for this
    problem (a budget lowered by ``d`` bytes lifts it by ``lam * d``)."""
    form = pairwise_form(problem)
    room = upper - (rep.bound + lift) + rep.slack + _SLACK * abs(upper)
    with np.errstate(invalid="ignore"):
        keep = tuple(
            np.isfinite(u) & np.isfinite(c) & (u - u.min() <= room)
            for u, c in zip(rep.unary, form.unary, strict=True)
        )
        ok = {k: np.isfinite(p) & (p - p.min() <= room) for k, p in rep.pairs.items()}
    edges = tuple(Edge(a, b, np.where(ok[(a, b)], mat, np.inf)) for (a, b), mat in form.pairs.items())
    empty = any(not k.any() for k in keep)  # a node left with nothing: no plan is at most ``upper``
    fixed = (
        None
        if empty
        else dataclasses.replace(problem, node_costs=tuple(form.unary), edges=edges, allowed=keep)
    )
    return Fixed(
        fixed,
        rep.bound + lift,
        sum(int(k.sum()) for k in keep),
        sum(problem.sizes),
        sum(int(v.sum()) for v in ok.values()),
        sum(v.size for v in ok.values()),
    )


def fix_by_diffusion(problem: SearchProblem, lam: float, upper: float) -> Fixed:
    """:func:`fix` on :func:`reparametrise`'s result: what of ``problem`` a fitting plan of cost at most
    ``upper`` may use, ``lam`` the budget's multiplier."""
    return fix(problem, reparametrise(problem, lam), upper)


def exact_below(
    problem: SearchProblem, lam: float, upper: float, log: list[str], rep: Reparametrised | None = None,
    lift: float = 0.0, work: float = 0.0, hint: Sequence[int] | None = None,
) -> tuple[tuple[int, ...] | None, bool]:  # fmt: skip
    """The cheapest plan of ``problem`` (a budget, no peak terms) that fits and costs less than ``upper``,
    and whether that is proven: ``(None, True)`` when none does.  Rounds of fixing and reduction (each
    reduction folds what fixing freed and makes the pairs the next diffusion fixes by), then enumeration
    or elimination over (memory, cost) Pareto sets.  ``rep``/``lift``: a reparametrisation made already
    (of a relaxation of ``problem``, lifted as :func:`fix` says).  ``work > 0``: what is left too wide for
    the Pareto elimination goes to CP-SAT, one worker, at most ``work`` of its deterministic time units
    (:func:`_by_cpsat`), warm-started from ``hint`` (a plan of ``problem``) where fixing kept it."""
    stages: list[Reduction] = []
    current, offset = problem, 0.0
    for _ in range(_ROUNDS):
        fixed = fix(current, rep if rep is not None else reparametrise(current, lam), upper - offset, lift)
        rep, lift = None, 0.0
        if fixed.problem is None or fixed.bound > upper - offset + _SLACK * abs(upper):
            return None, True  # the bound alone: nothing here beats ``upper``
        if stages:
            log.append(f"reparametrised fixing: {fixed.kept} of {fixed.total} strategies left")
        try:
            red = reduce_problem(fixed.problem)
        except InfeasibleError:
            return None, True  # nothing that could beat ``upper`` fits
        stages.append(red)
        offset += red.cost_offset
        if red.problem.num_nodes == current.num_nodes and sum(red.problem.sizes) == sum(current.sizes):
            current = red.problem
            break
        current = red.problem
        if math.prod(current.sizes) <= _ENUMERATE:
            break
    if math.prod(current.sizes) <= _ENUMERATE:
        try:
            choice: tuple[int, ...] = brute_force(current, max_assignments=_ENUMERATE).choice
        except InfeasibleError:
            return None, True
    else:
        left = sum(current.sizes)
        found, proven = (
            pareto_below(current, upper=upper - offset, lam=lam) if left <= _MAX_STRATEGIES else (None, False)
        )
        if found is None and not proven and work > 0.0 and left <= _MAX_STRATEGIES:
            start: list[int | None] | None = None
            if hint is not None:
                start = list(hint)
                for red in stages:
                    start = red.restrict(start)
            found, proven = _by_cpsat(current, upper - offset, work, log, start)
        elif found is None and not proven:
            log.append(f"reparametrised fixing: {left} strategies left, too many to eliminate")
        if found is None:  # nothing at most ``upper`` fits (proven), or too large (not)
            return None, proven
        choice = found
    for red in reversed(stages):
        choice = red.expand(choice)
    return choice, True


def _by_cpsat(
    problem: SearchProblem, upper: float, work: float, log: list[str], hint: Sequence[int | None] | None
) -> tuple[tuple[int, ...] | None, bool]:
    """What fixing left, too wide for the Pareto elimination, by CP-SAT (search/ilp.py): one worker, no clock,
    at most ``work`` deterministic time units, so the answer does not depend on the machine's load.  Its
    optimum is proven to its integer resolution (ilp.py (f)): the bound it reports is the integer bound less
    the worst rounding of every term, which the log gives; a plan is returned as optimal only when it costs
    at most ``upper``, "nothing below" only when that bound is above ``upper``, else nothing is claimed."""
    from autoshard.search.ilp import solve_ilp  # lazy: ortools' import costs ~0.3 s

    if not problem.sizes:  # reductions folded every node: the empty plan (as pareto_below)
        return (), True
    try:
        res = solve_ilp(
            problem, time_limit=math.inf, num_workers=1, hint=hint, work_limit=work, residual=True
        )
    except InfeasibleError:
        log.append(
            f"reparametrised fixing: cp-sat proved that nothing left fits ({sum(problem.sizes)} strategies)"
        )
        return None, True
    log.extend(res.log)
    allowance = _SLACK * abs(upper)
    if not res.optimal:
        log.append(f"reparametrised fixing: cp-sat stopped at {work:g} work units ({res.status}), not proven")
        return None, False
    assert res.choice is not None
    log.append(
        f"reparametrised fixing: cp-sat optimum of the {sum(problem.sizes)} strategies left "
        f"{res.objective:.9g} s (proven to {res.objective - res.lower_bound:.2g} s, its integer rounding)"
    )
    if res.lower_bound > upper + allowance:
        return None, True  # nothing left costs at most ``upper``
    if res.objective <= upper + allowance:
        return res.choice, True
    return None, False  # the optimum lies within the rounding of ``upper``: nothing claimed
