"""Recomputation per repeated block: ``k`` of the ``N`` identical blocks recompute, the other ``N - k`` keep
every activation (Megatron's "recompute the first k layers"), searched exactly under a memory budget.

Input: two :class:`~autoshard.problem.build.BuiltProblem` of one capture and one policy ``p``, built with
``CostOptions.recompute_share`` 0 and 1, and a solver.  Output: the count ``k`` and the plan of the cheapest
mixed problem, or None when no mixed plan beats the incumbent.

Identical layers share their strategies (``build``), so a plan is ``(x, k)``: one strategy per node and a
count.  Every cost term is affine in the share ``k / N`` at fixed ``x``: a recomputed block's nodes add their
forward to backward (``costs.node_compute``), its inner moves are re-issued (``build``, ``fanout``), and it
keeps fewer activations (``recompute.node_memory_total``); the working set (one block re-run at a time) and
the temporaries do not depend on ``k`` once ``k >= 1``.  So the problem at ``k`` is the share-0 problem plus
``k / N`` times the difference, node by node and edge by edge (:func:`share_problem`; a test checks it
equals a build at that share), and each ``k`` is a plain problem for the solvers.

Search over ``k`` (exact): at fixed ``x`` cost grows with ``k`` and memory falls, so for an interval
``a..b`` the problem with ``a``'s costs and ``b``'s memory is a relaxation of every ``k`` in it.  Branch and
bound over intervals, starting from ``k0..N-1``, where ``k0`` (:func:`least_fitting`) is the least ``k``
whose per-node memory floor fits (a bisection over cheap sums: below it nothing fits, and an interval
reaching down there has costs too low to bound anything).  An interval whose relaxation's Lagrangian
bound (:mod:`autoshard.search.budget`) reaches the best plan found (or the incumbent, the best uniform
policy's) is dropped (the solver is given it as ``ceiling`` and stops at the first bound that reaches
it), one where nothing fits is dropped, the rest are halved; a single ``k`` is solved exactly.  No better
plan is missed.  LLaMA-3-70B on 16 x 8 x 8 (80 blocks): one pruned solve for selective (the best uniform
policy's multiplier is probed first, ``solve(multiplier=)``: its interval is dropped after its reduction
and that one exact solve), none for full, the last policy, whose every count steps slower than the plan
found (``mix_policies(unwanted=)``; its interval took a second exact solve, 0.18 s CPU); the halving from
``1..N-1`` took 8 full solves and 16 s.  Each interval's reduction is most of it: dominance depends on the
values, so the uniform policy's reduction cannot stand in, but its removals, re-checked on the interval's
costs, do most of the work (``solve(dominated=)``: 0.24 -> 0.10 s CPU each), and the rough bound's
reduction stops there (``dominance_search=False``: the search for more costs more than it spares the one or
two exact probes on the wider tables; 70B: both intervals 0.46 -> 0.35 s CPU, the same bounds).  After
:data:`MAX_INTERVALS` interval solves for one policy the search stops, and the plan it found is not claimed
optimal (``Solution.optimal`` False): it stops by work, never by the clock, so the plan does not depend on
machine load.  Without a binding budget recomputation never pays and nothing here runs.

Mixing two non-trivial policies (some blocks selective, some full) is not searched: each policy is mixed
with none.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping

import numpy as np

from autoshard.errors import InfeasibleError
from autoshard.problem.build import BuiltProblem
from autoshard.problem.costs import Recompute
from autoshard.search import BoundExceeded, Edge, SearchProblem, Solution

__all__ = [
    "MAX_INTERVALS",
    "best_count",
    "best_share",
    "least_fitting",
    "mix_policies",
    "relaxed_problem",
    "share_problem",
]

#: Intervals of ``k`` one policy's branch and bound may solve before it stops (its plan then not claimed
#: optimal).  Halving ``1..N-1`` down to single counts with nothing pruned takes about ``2 log2 N`` of them
#: (14 for N = 80); LLaMA-3-70B on 16 x 8 x 8 needs one per policy.  A count, not a deadline: the same
#: problem gives the same plan on any machine load.
MAX_INTERVALS = 64


def _between(a: np.ndarray, b: np.ndarray, t: float) -> np.ndarray:
    """``a + t (b - a)`` where both are finite; ``inf`` where either forbids."""
    finite = np.isfinite(a) & np.isfinite(b)
    return np.where(finite, a + t * (np.where(finite, b, 0.0) - np.where(finite, a, 0.0)), np.inf)


def share_problem(zero: BuiltProblem, whole: BuiltProblem, k: int) -> BuiltProblem:
    """The problem with the first ``k`` of ``N`` blocks recomputed under ``whole``'s policy."""
    n = whole.num_blocks
    if not 0 <= k <= n or zero.num_blocks != n:
        raise ValueError(f"k = {k} must lie in 0..{n} and both problems must have {n} blocks")
    t = k / n
    problem = _shared(zero.problem, whole.problem, t)
    options = dataclasses.replace(whole.options, recompute_share=t)
    return dataclasses.replace(whole, problem=problem, options=options)


def _shared(p0: SearchProblem, p1: SearchProblem, t: float, memory_at: float | None = None) -> SearchProblem:
    """Costs at share ``t``, memory at ``memory_at`` (default ``t``), of the pair of builds at 0 and 1."""
    same = p0.sizes == p1.sizes and [(e.u, e.v) for e in p0.edges] == [(e.u, e.v) for e in p1.edges]
    if not same or p0.memory is None or p1.memory is None:
        raise ValueError("share_problem needs two builds of one capture with one policy (share 0 and 1)")
    m = t if memory_at is None else memory_at
    return dataclasses.replace(
        p1,
        node_costs=tuple(_between(a, b, t) for a, b in zip(p0.node_costs, p1.node_costs, strict=True)),
        edges=tuple(
            Edge(a.u, a.v, _between(a.cost, b.cost, t)) for a, b in zip(p0.edges, p1.edges, strict=True)
        ),
        memory=tuple(a + m * (b - a) for a, b in zip(p0.memory, p1.memory, strict=True)),
    )


def relaxed_problem(zero: BuiltProblem, whole: BuiltProblem, a: int, b: int) -> BuiltProblem:
    """A relaxation valid for every ``k`` in ``a..b``: costs at ``a`` (the least), memory at ``b`` (the least).

    At fixed strategies cost grows and memory falls with ``k``, so this problem's optimum bounds from below
    the optimum at every such ``k``, and when no plan fits it, none fits at any such ``k``."""
    low = share_problem(zero, whole, a)
    n = whole.num_blocks
    return dataclasses.replace(low, problem=_shared(zero.problem, whole.problem, a / n, b / n))


def least_fitting(p0: SearchProblem, p1: SearchProblem, n: int) -> int:
    """The least ``k >= 1`` at which every node at its least memory (and the least peak) fits the budget;
    ``n`` when none below ``n`` does.  Below it no plan fits: ``memory_lower_bound`` falls with ``k`` when
    every strategy's memory does (checked; else 1, no shortcut), so a bisection finds it."""
    limit = p1.memory_limit
    if limit is None or p0.memory is None or p1.memory is None:
        return 1
    if any(bool(np.any((b > a) & np.isfinite(a))) for a, b in zip(p0.memory, p1.memory, strict=True)):
        return 1  # a strategy that holds more when recomputed: the bound need not fall with k
    # memory_lower_bound at share k, from arrays built once: which strategies are finite (the same at every
    # share), the least peak (share-independent), and each node's memory at 0 and its change to 1
    # finite at every share where finite at both ends (_between), and allowed
    masks = p1.allowed or (None,) * len(p1.node_costs)
    finite = [
        np.isfinite(a) & np.isfinite(b) & (True if m is None else m)
        for a, b, m in zip(p0.node_costs, p1.node_costs, masks, strict=True)
    ]
    peaks = p1.peak if p1.peak is not None else ()
    least = (float(p[f].min(initial=math.inf)) for p, f in zip(peaks, finite if peaks else (), strict=True))
    floor = max((x for x in least if math.isfinite(x)), default=0.0)  # as peak_floor
    low = [a[f] for a, f in zip(p0.memory, finite, strict=True)]
    step = [(b - a)[f] for a, b, f in zip(p0.memory, p1.memory, finite, strict=True)]

    def need(k: int) -> float:
        t = k / n
        return (
            math.fsum(float((a + t * d).min(initial=math.inf)) for a, d in zip(low, step, strict=True))
            + floor
        )

    lo, hi = 1, n
    while lo < hi:
        middle = (lo + hi) // 2
        if need(middle) > limit:
            lo = middle + 1
        else:
            hi = middle
    return lo


def best_count(
    p0: SearchProblem,
    p1: SearchProblem,
    n: int,
    solve: Callable[..., Solution],
    incumbent: float,
    max_intervals: int = MAX_INTERVALS,
) -> tuple[int, Solution] | None:
    """The cheapest ``(k, solution)`` with ``0 < k < n`` whose objective beats ``incumbent``, on the search
    problems at share 0 and 1 (:func:`best_share` on builds).

    Branch and bound over intervals of ``k`` (exact), from :func:`least_fitting` (below it nothing fits):
    an interval is dropped when nothing fits its relaxation (costs at its low end, memory at its high end)
    or when a lower bound of it reaches the best objective so far (``ceiling``: the solve stops at the
    first Lagrangian bound that does); otherwise it is halved, lower ``k`` first (less recomputation is
    cheaper).  A single ``k`` is solved exactly.  ``solve(problem, method=..., ceiling=...,
    dominance_search=...)`` is :func:`autoshard.search.solve` with the caller's settings; ``method`` is passed
    only as ``"exact"`` (a Lagrangian bound before the full solve), and with it ``dominance_search=False``:
    that bound usually stops after one or two exact probes, so its reduction applies only the hinted
    removals (``solve(dominated=)``) instead of searching for more (LLaMA-3-70B on 16 x 8 x 8: 0.05 s CPU
    less per interval; the same bound, as dominance only shrinks the tables).  After ``max_intervals``
    intervals it stops with what it found, not claimed optimal."""
    best: tuple[int, Solution] | None = None
    bound = incumbent
    first = least_fitting(p0, p1, n)
    intervals = [(first, n - 1)] if first < n else []
    solved = 0
    while intervals:
        if solved >= max_intervals:  # out of work: what was found, not proven best
            if best is not None:
                best = (best[0], dataclasses.replace(best[1], optimal=False))
            break
        a, b = intervals.pop()
        problem = _shared(p0, p1, a / n, b / n)
        ceiling = bound * (1 - 1e-12)
        solved += 1
        try:
            # exact solves only: the Lagrangian bound usually shows the interval cannot win (the ceiling
            # stops there), sparing CP-SAT, which is what closes a binding budget's last gap
            rough = solve(problem, method="exact", ceiling=ceiling, dominance_search=False)
        except (InfeasibleError, BoundExceeded):
            continue  # too few blocks recomputed to fit anywhere in a..b, or none of a..b beats the best
        if rough.lower_bound >= ceiling:
            continue
        if a < b:
            middle = (a + b) // 2
            intervals += [(middle + 1, b), (a, middle)]  # a..middle is popped first
            continue
        try:
            found = rough if rough.optimal else solve(problem, ceiling=ceiling)
        except (InfeasibleError, BoundExceeded):
            continue
        if found.objective < bound:
            best, bound = (a, found), found.objective
    return best


def best_share(
    zero: BuiltProblem,
    whole: BuiltProblem,
    solve: Callable[..., Solution],
    incumbent: float,
    max_intervals: int = MAX_INTERVALS,
) -> tuple[int, BuiltProblem, Solution] | None:
    """The cheapest ``(k, problem, solution)`` with ``0 < k < N`` whose objective beats ``incumbent``
    (:func:`best_count` on the two builds' problems)."""
    if zero.num_blocks != whole.num_blocks:
        raise ValueError(f"both problems must have {whole.num_blocks} blocks")
    found = best_count(zero.problem, whole.problem, whole.num_blocks, solve, incumbent, max_intervals)
    if found is None:
        return None
    k, solution = found
    return k, share_problem(zero, whole, k), solution


def mix_policies(
    uniform: Mapping[Recompute, tuple[BuiltProblem, BuiltProblem, float]],
    zero: Callable[[Recompute], tuple[BuiltProblem, BuiltProblem]],
    solve: Callable[..., Solution],
    max_intervals: int = MAX_INTERVALS,
    unwanted: Callable[[BuiltProblem, BuiltProblem], bool] | None = None,
) -> tuple[Solution, BuiltProblem, BuiltProblem, int] | None:
    """The best plan with ``k`` of ``N`` blocks under selective or full recomputation, if it beats every
    uniform policy.  ``uniform[policy]`` = (unpinned, pinned problem, objective or inf) at share 1;
    ``zero(policy)`` builds the same pair at share 0.  Returns (solution, unpinned, pinned problem, k).

    ``unwanted(pinned0, pinned1)``: whether no plan of that policy's mixed problems could be kept by the
    caller (the planner keeps a mixed plan only when its reported step beats the best plan's:
    :func:`~autoshard.planner_policy.search_counts` proves every one slower).  Then the *last* policy
    searched, when nothing was found before it, is not searched: what it would have returned the caller
    drops, and no later search depends on it, so the caller ends with the same plan.  (An earlier policy's
    find lowers the incumbent of the later ones, and a later find replaces an earlier one: skipping there
    could change what is returned.)"""
    incumbent = min(obj for _, _, obj in uniform.values())
    found = None
    policies = [
        p for p in (Recompute.SELECTIVE, Recompute.FULL) if p in uniform and uniform[p][1].num_blocks >= 2
    ]
    for policy in policies:
        free0, pinned0 = zero(policy)
        free1, pinned1, _ = uniform[policy]
        if found is None and policy is policies[-1] and unwanted is not None and unwanted(pinned0, pinned1):
            continue
        best = best_share(pinned0, pinned1, solve, incumbent, max_intervals)
        if best is None:
            continue
        k, mixed, solution = best
        incumbent = solution.objective
        free = share_problem(free0, free1, k) if free1 is not pinned1 else mixed
        found = (solution, free, mixed, k)
    return found
