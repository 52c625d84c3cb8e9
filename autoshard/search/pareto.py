"""Exact optimum under a memory budget by variable elimination over Pareto sets of (memory, cost).

Input: a :class:`~autoshard.search.problem.SearchProblem` with a memory model and budget ``L`` (usually what
Lagrangian fixing left: a few dozen nodes, few edges) and ``upper``, the cost of a plan known to fit.
Output: the cheapest plan that fits, or None when the tables would grow past the caps (the caller then
hands the problem to CP-SAT).

Why.  The objective is a sum of unary and pairwise costs; the budget couples every node through one sum of
unary memories.  Variable elimination (:mod:`~autoshard.search.exact`) carries, per assignment of a
separator, the least cost of the eliminated part.  Under a budget one number is not enough: a dearer
partial plan that needs less memory may be the one that fits.  So each table entry holds the **Pareto set**
of ``(memory, cost)`` pairs of the eliminated part: the pairs no other partial plan beats in both.  A pair
dominated in both can be swapped for its dominator in any completion without breaking the budget or raising
the cost, so dropping it keeps an optimum (multi-objective bucket elimination; the classic dynamic program
for multiple-choice knapsacks is the case without edges).

Pruning (exact).  A full plan's cost and memory are sums over the factors alive at any moment, each at the
plan's assignment; so a pair whose cost plus every other factor's least cost exceeds ``upper`` (or whose
memory plus every other factor's least memory exceeds ``L``) belongs to no plan that fits and beats the
known one: it goes.  This keeps the sets small where the Lagrangian bound is close.  With a multiplier
``lam >= 0`` (the Lagrangian sweep's), the same holds for ``cost + lam * memory``: a plan that fits and
beats ``upper`` has it at most ``upper + lam * L``, and each other factor adds at least its own least
value of it; the combined test is much sharper than the two apart when the budget binds (Mixtral-8x7B).

Tables are numpy arrays ``[*separator sizes, K]`` padded with ``inf``; one step combines its factors by
broadcasting, filters each row (sort by memory, keep the points whose cost beats every earlier one) and
keeps, per point, the flat index it came from, so the plan is read back by one pass in reverse.  Memory
is summed in float64, exact for byte counts below 2**53; the plan returned is checked by
:func:`~autoshard.search.problem.memory_of` against the budget, and None is returned if rounding let a
plan through that does not fit.

Example::

    >>> import numpy as np
    >>> from autoshard.search.problem import SearchProblem
    >>> p = SearchProblem((np.array([0.0, 1.0, 5.0]), np.array([0.0, 2.0])), (), ("a", "b"),
    ...                   memory=(np.array([9.0, 5.0, 1.0]), np.array([4.0, 1.0])), memory_limit=10.0)
    >>> pareto_plan(p, upper=7.0)       # (0, 0) needs 13 > 10 bytes; (1, 0): cost 1, 9 bytes, the best that fits
    (1, 0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from autoshard.search.order import greedy_order
from autoshard.search.problem import SearchProblem, evaluate, memory_of, pairwise_form

__all__ = ["MAX_ENTRIES", "MAX_TOTAL_WORK", "MAX_WORK", "pareto_below", "pareto_plan"]

#: Entries of one combined table (separator x eliminated strategies x the points of every factor) above
#: which the elimination gives up and CP-SAT takes the problem (~0.2 s of numpy at this size).
MAX_ENTRIES = 4_000_000

#: Entries of all slices of one step together, and of all steps together: beyond, CP-SAT is the better bet
#: (~2 s and ~6 s of numpy), so the elimination never costs much more than the CP-SAT solve it replaces.
MAX_WORK = 64_000_000
MAX_TOTAL_WORK = 192_000_000

#: Relative slack on the cost prune, so float rounding never drops the plan that matches ``upper``.
_SLACK = 1e-9


@dataclass(frozen=True, slots=True)
class _Factor:
    scope: tuple[int, ...]  # sorted variables
    mem: np.ndarray  # [*sizes of scope, K]
    cost: np.ndarray  # [*sizes of scope, K]
    origin: int  # the step that built it, -1 for a cost term of the problem


@dataclass(frozen=True, slots=True)
class _Record:
    var: int  # -1 for the final merge of the components
    rest: tuple[int, ...]
    parts: tuple[_Factor, ...]
    arg: np.ndarray  # [*sizes of rest, K]: flat index into (var's strategies, K of each part)


@dataclass(frozen=True, slots=True)
class _Bounds:
    """What every factor not in a step adds at least (cost, memory, ``cost + lam * memory``), the budget,
    the cost to beat, and the multiplier."""

    other_cost: float
    other_mem: float
    other_lag: float
    limit: float
    ceiling: float
    lam: float


class _TooLarge(Exception):
    pass


def pareto_plan(problem: SearchProblem, *, upper: float, lam: float = 0.0) -> tuple[int, ...] | None:
    """The cheapest plan of ``problem`` within its memory budget; None when a table would pass
    :data:`MAX_ENTRIES`, or when no plan fits at a cost of at most ``upper`` (a fitting plan's cost).

    ``lam >= 0`` (a Lagrange multiplier of the budget, e.g. the sweep's) sharpens the prune; any value is
    exact, a good one prunes most."""
    return pareto_below(problem, upper=upper, lam=lam)[0]


def pareto_below(
    problem: SearchProblem, *, upper: float, lam: float = 0.0
) -> tuple[tuple[int, ...] | None, bool]:
    """:func:`pareto_plan` telling its two Nones apart: ``(plan, True)``; ``(None, True)`` when no plan fits
    at a cost of at most ``upper`` (proven: every prune is exact, so an empty final set is a proof, which
    reparametrised fixing uses as a bound); ``(None, False)`` when a table would pass the caps, or float
    rounding let through a plan that the exact sums reject.  The memory prune allows the budget a relative
    :data:`_SLACK`, so rounding in the fractional (re-weighted) memories never drops a plan that fits."""
    assert problem.memory is not None and problem.memory_limit is not None
    form = pairwise_form(problem)
    sizes = [u.size for u in form.unary]
    if not sizes:  # reductions folded every node: the empty plan (a budget is never negative)
        return (), True
    factors = [
        _Factor((i,), np.asarray(m, dtype=np.float64)[:, None], u[:, None], -1)
        for i, (u, m) in enumerate(zip(form.unary, problem.memory, strict=True))
    ]
    factors += [
        _Factor((a, b), np.zeros((*f.shape, 1)), f[..., None], -1) for (a, b), f in form.pairs.items()
    ]
    adj: list[set[int]] = [set() for _ in sizes]
    for a, b in form.pairs:
        adj[a].add(b)
        adj[b].add(a)
    limit = float(problem.memory_limit)
    ceiling = upper + _SLACK * abs(upper)
    order = greedy_order(range(len(sizes)), adj, sizes, "min-fill")
    try:
        steps = [(s.var, s.rest) for s in order]
        records, final = _eliminate(
            factors, steps, sizes, _Bounds(0.0, 0.0, 0.0, limit + _SLACK * abs(limit), ceiling, max(lam, 0.0))
        )
    except _TooLarge:
        return None, False
    best = int(np.argmin(final.cost))
    if not math.isfinite(float(final.cost[best])):
        return None, True
    choice = _read_back(records, best, sizes)
    if memory_of(problem, choice) > limit or not evaluate(problem, choice) <= ceiling:
        return None, False  # float rounding let through a plan the exact sums reject: let CP-SAT decide
    return choice, True


def _least(f: _Factor, lam: float) -> tuple[float, float, float]:
    """The least cost, memory and ``cost + lam * memory`` among a factor's finite points (lower bounds of
    its term)."""
    finite = np.isfinite(f.cost)
    if not finite.any():
        return math.inf, math.inf, math.inf
    cost, mem = f.cost[finite], f.mem[finite]
    return float(cost.min()), float(mem.min()), float((cost + lam * mem).min())


def _eliminate(
    factors: list[_Factor], steps: list[tuple[int, tuple[int, ...]]], sizes: list[int], given: _Bounds,
) -> tuple[list[_Record], _Factor]:  # fmt: skip
    """Eliminate along ``steps``, then merge what is left (one Pareto set per connected component)."""
    alive = dict(enumerate(factors))
    lam = given.lam
    least = {k: _least(f, lam) for k, f in alive.items()}
    records: list[_Record] = []

    work = 0

    def step(keys: list[int], var: int, rest: tuple[int, ...]) -> _Factor:
        nonlocal work
        parts = tuple(alive.pop(k) for k in keys)
        full = {var, *rest} - {-1}
        work += math.prod(sizes[w] for w in full) * math.prod(p.cost.shape[-1] for p in parts)
        if work > MAX_TOTAL_WORK:
            raise _TooLarge
        for k in keys:
            least.pop(k)
        bounds = _Bounds(
            math.fsum(c for c, _, _ in least.values()),
            math.fsum(m for _, m, _ in least.values()),
            math.fsum(v for _, _, v in least.values()),
            given.limit,
            given.ceiling,
            lam,
        )
        made, arg = _combine(parts, var, rest, sizes, bounds, len(records))
        records.append(_Record(var, rest, parts, arg))
        key = len(factors) + len(records)
        alive[key], least[key] = made, _least(made, lam)
        return made

    made = None
    for var, rest in steps:
        made = step([k for k, f in alive.items() if var in f.scope], var, rest)
    while len(alive) > 1:  # one Pareto set per connected component: merge them two at a time, smallest first
        pair = sorted(alive, key=lambda k: (alive[k].cost.shape[-1], k))[:2]
        made = step(pair, -1, ())
    assert made is not None and len(alive) == 1
    return records, made


def _combine(
    parts: tuple[_Factor, ...], var: int, rest: tuple[int, ...], sizes: list[int], bounds: _Bounds,
    origin: int,
) -> tuple[_Factor, np.ndarray]:  # fmt: skip
    """Sum ``parts`` over every assignment, minimise out ``var`` (-1: none) keeping the Pareto points; in
    slices along the first variable of ``rest`` so the scratch stays under :data:`MAX_ENTRIES`."""
    full = tuple(sorted((var, *rest))) if var >= 0 else ()
    ks = [p.cost.shape[-1] for p in parts]
    total = math.prod(sizes[w] for w in full) * math.prod(ks)
    if total > MAX_WORK:
        raise _TooLarge
    if not rest or total <= MAX_ENTRIES:
        return _combine_rows(parts, var, rest, full, sizes, bounds, origin)
    if total // sizes[rest[0]] > MAX_ENTRIES:
        raise _TooLarge
    head = rest[0]
    local = [1 if w == head else sizes[w] for w in range(len(sizes))]
    pieces = []
    for value in range(sizes[head]):  # fix the first separator variable: its own sub-table per value
        sliced = tuple(_slice(p, head, value) for p in parts)
        pieces.append(_combine_rows(sliced, var, rest, full, local, bounds, origin))
    width = max(f.cost.shape[-1] for f, _ in pieces)
    pad = [(0, 0)] * len(rest)

    def grow(a: np.ndarray, fill: float) -> np.ndarray:
        return np.pad(a, [*pad, (0, width - a.shape[-1])], constant_values=fill)

    made = _Factor(
        rest,
        np.concatenate([grow(f.mem, np.inf) for f, _ in pieces], axis=0),
        np.concatenate([grow(f.cost, np.inf) for f, _ in pieces], axis=0),
        origin,
    )
    return made, np.concatenate([grow(a, -1) for _, a in pieces], axis=0)


def _slice(p: _Factor, var: int, value: int) -> _Factor:
    """``p`` with ``var`` fixed to ``value`` (kept as an axis of size 1)."""
    if var not in p.scope:
        return p
    axis = p.scope.index(var)
    return _Factor(p.scope, np.take(p.mem, [value], axis=axis), np.take(p.cost, [value], axis=axis), p.origin)


def _combine_rows(
    parts: tuple[_Factor, ...], var: int, rest: tuple[int, ...], full: tuple[int, ...], sizes: list[int],
    bounds: _Bounds, origin: int,
) -> tuple[_Factor, np.ndarray]:  # fmt: skip
    ks = [p.cost.shape[-1] for p in parts]
    cost: np.ndarray | float = 0.0
    mem: np.ndarray | float = 0.0
    for j, p in enumerate(parts):
        shape = [sizes[w] if w in p.scope else 1 for w in full] + [
            k if i == j else 1 for i, k in enumerate(ks)
        ]
        cost = cost + p.cost.reshape(shape)
        mem = mem + p.mem.reshape(shape)
    cost, mem = np.asarray(cost), np.asarray(mem)
    lead = tuple(sizes[w] for w in rest)
    cost = np.broadcast_to(cost, (*(sizes[w] for w in full), *ks))
    mem = np.broadcast_to(mem, cost.shape)
    if var >= 0:  # the eliminated strategies join the points: (*rest, var, K_1, ..) -> (*rest, points)
        cost = np.moveaxis(cost, full.index(var), len(full) - 1)
        mem = np.moveaxis(mem, full.index(var), len(full) - 1)
    cost, mem = cost.reshape(*lead, -1), mem.reshape(*lead, -1)
    with np.errstate(invalid="ignore"):
        bad = ~(cost + bounds.other_cost <= bounds.ceiling) | ~(mem + bounds.other_mem <= bounds.limit)
        if bounds.lam > 0.0:  # a plan that fits and costs at most the ceiling has cost + lam * mem <= this
            reach = bounds.ceiling + bounds.lam * bounds.limit
            bad |= ~(cost + bounds.lam * mem + bounds.other_lag <= reach + _SLACK * abs(reach))
    source = None  # where each point came from, when the rows are compacted first
    live = max(1, int((~bad).sum(axis=-1).max(initial=0)))
    if live < cost.shape[-1] // 2:  # the prunes left few points per row: sort only those
        # (stable: the points kept in their order, so the sort below ties as it would on the whole row)
        source = np.argsort(bad, axis=-1, kind="stable")[..., :live]
        cost, mem = np.take_along_axis(cost, source, -1), np.take_along_axis(mem, source, -1)
        bad = np.take_along_axis(bad, source, -1)  # the padding of short rows
    cost = np.where(bad, np.inf, cost)
    mem = np.where(bad, np.inf, mem)
    order = np.lexsort((cost, mem), axis=-1)  # by memory, then cost
    cs, ms = np.take_along_axis(cost, order, -1), np.take_along_axis(mem, order, -1)
    before = np.minimum.accumulate(cs, axis=-1)
    before = np.concatenate([np.full((*lead, 1), np.inf), before[..., :-1]], axis=-1)
    keep = cs < before  # cheaper than every point that needs no more memory
    width = max(1, int(keep.sum(axis=-1).max(initial=0)))
    pos = np.argsort(~keep, axis=-1, kind="stable")[..., :width]
    kept = np.take_along_axis(keep, pos, -1)
    out_cost = np.where(kept, np.take_along_axis(cs, pos, -1), np.inf)
    out_mem = np.where(kept, np.take_along_axis(ms, pos, -1), np.inf)
    picked = np.take_along_axis(order, pos, -1)
    if source is not None:
        picked = np.take_along_axis(source, picked, -1)
    arg = np.where(kept, picked, -1)
    return _Factor(rest, out_mem, out_cost, origin), arg


def _read_back(records: list[_Record], best: int, sizes: list[int]) -> tuple[int, ...]:
    """The assignment behind point ``best`` of the final merge, following each step's source indices."""
    choice = [0] * len(sizes)
    want: dict[int, int] = {len(records) - 1: best}  # the last record made the final factor
    for k in reversed(range(len(records))):
        rec = records[k]
        flat = int(rec.arg[(*(choice[w] for w in rec.rest), want[k])])
        assert flat >= 0, "a kept point always names its source"
        shape = ([sizes[rec.var]] if rec.var >= 0 else []) + [p.cost.shape[-1] for p in rec.parts]
        coords = [int(c) for c in np.unravel_index(flat, shape)]
        if rec.var >= 0:
            choice[rec.var] = coords.pop(0)
        for part, point in zip(rec.parts, coords, strict=True):
            if part.origin >= 0:
                want[part.origin] = point
    return tuple(choice)
