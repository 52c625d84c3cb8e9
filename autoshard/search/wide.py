"""A memory budget on a problem too wide to eliminate with its memory terms: the Lagrangian dual with each
relaxed problem reduced on its own, and fitting plans from its minimisers by neighbourhood re-solves.

Input: a :class:`~autoshard.search.run.Run` whose current problem has a budget and whose exact elimination
would build tables past the cap (memory keeps nodes from folding: the 405B-shaped LLaMA's pipeline stage on
8 x 16 x 8 at 128K tokens).  Output: a :class:`~autoshard.search.problem.Solution`: proven optimal when the
dual closes or fixing closes its gap (step 4), else the best fitting plan found with the proven bound and gap.

Without the budget the same problem folds to a core of a dozen nodes (the rotary-embedding ops of one layer)
and is eliminated in about a second, so each multiplier ``lambda`` costs one reduction and one elimination of
``cost + lambda * memory`` (:func:`_relaxed_by_reduction`).  What is cheap goes first:

1. the least-memory plan (memory as the only cost: the pair costs become 0 / inf and fold away): decides
   feasibility in milliseconds and is the first fitting plan;
2. multipliers from ``scale / budget`` downwards (``scale``: the cheapest conceivable plan), so the
   unbudgeted problem, the widest relaxation (memory ties keep its strategies from being dominated: 3.5e9
   table entries on 128 x 16 x 8 against 7e6 at ``lambda = 3e-9``), is solved only when nothing over the
   budget shows up above it; a minimiser over the budget proves the budget binds;
3. the cutting-plane dual (:func:`~autoshard.search.budget.dual_search`), then the over-budget minimisers'
   fitting neighbours (:mod:`~autoshard.search.neighbourhood`; with peak terms, re-solved with them), then
   more probes if the better plan left a gap worth them;
4. the duality gap closed exactly where it can be (:mod:`~autoshard.search.diffusion`): ``cost + lambda *
   memory`` reparametrised by min-sum diffusion, every strategy and pair that no fitting plan cheaper than
   the best can use forbidden, what is left reduced and eliminated over (memory, cost) Pareto sets, per
   peak threshold when there are peak terms; below a tenth of the gap first (cheap), then the whole gap,
   where a residual too wide for the Pareto tables goes to CP-SAT (one worker, warm-started, a
   deterministic work limit: :data:`RESIDUAL_WORK`), then the ladder's other rungs for their bounds;
5. CP-SAT on the whole problem only when its model is small enough to pay (:data:`CPSAT_MAX_PAIRS`).

Measured on the 405B stage (PP 16 pinned, 16 microbatches): selective recomputation 11.6 % -> 0.22 % proven
gap, full 1.24 % -> 0.80 %; the plan the dual brackets first (greedy repair) was the weak side, not the bound.
Then the duality gap itself (0.088 %: no plan between the two minimisers that bracket the budget) closed by
step 4: proven optimal, 321.0233 s against the 321.0243 s plan the neighbourhoods found, in ~1 s CPU.
Under the causal pricing (selective): the ladder proves 237.188 s; the whole gap leaves 818 strategies on
one peak threshold, whose optimum CP-SAT proves in 0.65 s CPU: 237.58197 s optimal (was a 0.166 % gap).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Literal

import numpy as np

from autoshard.search.budget import Lagrange, Relaxed, dual_search
from autoshard.search.diffusion import Reparametrised, exact_below, reparametrise
from autoshard.search.exact import ExactSolver, FactorCapExceeded, min_memory_plan
from autoshard.search.neighbourhood import improve
from autoshard.search.peak import at_threshold, thresholds
from autoshard.search.problem import (
    SearchProblem,
    Solution,
    evaluate,
    memory_infeasible_error,
    memory_lower_bound,
    memory_of,
    pairwise_form,
    peak_floor,
    relative_gap,
)
from autoshard.search.reduce import Certificates, reduce_problem
from autoshard.search.repair import repair
from autoshard.search.run import Run, run_ilp, trivial_lower_bound

__all__ = [
    "CPSAT_MAX_PAIRS",
    "RESIDUAL_WORK",
    "least_memory",
    "trivial_lower_bound",
    "with_budget_by_reduction",
]

#: Edge-pair variables above which CP-SAT is not tried after the Lagrangian path: its model alone (one
#: boolean per pair) takes tens of seconds to build there and it did not improve the bound of the
#: 405B-shaped LLaMA's problems (650k pairs on 128 x 16 x 8: 18 s of model building, no plan in 60 s).
CPSAT_MAX_PAIRS = 200_000

#: With peak terms, fixing is first tried for plans up to these shares of the gap above the best plan without
#: its peak, one after another: fitting with the peak usually costs a little more (the 405B stage: 0.005 s
#: of a 0.28 s gap), and each share widens what fixing keeps (the whole gap: 971 strategies, too many to
#: solve).  A share that proves no fitting plan below it raises the bound to there, and the next is tried;
#: the first that is not proven ends the ladder.  The 405B stage (PP 16, selective, causal pricing), CPU
#: after the one diffusion (1.1 s): 0.1, 0.3 and 0.45 of its 1.07 s gap proven empty in 0.14, 0.16 and
#: 0.31 s (bound 236.51 -> 237.19 s, gap 0.45 -> 0.17 %); 0.6 as well but in 0.93 s (gap 0.14 %); 1.0 not
#: (666 strategies left, over the Pareto elimination's caps).
_EARLY_ROOMS = (0.1, 0.3, 0.45)

#: CP-SAT's deterministic time units (search/ilp.py, one worker) at most per peak threshold for what fixing
#: at the whole gap leaves too wide for the Pareto elimination (at most diffusion._MAX_STRATEGIES
#: strategies).  A work count, not the clock: the same problem gives the same answer under any load.  The
#: 405B stage (PP 16, selective, causal pricing): one threshold left, 818 strategies, proven in 0.54 units
#: (0.65 s CPU, warm-started from the incumbent), about a tenth of this.
RESIDUAL_WORK = 5.0


def _relaxed_by_reduction(problem: SearchProblem, max_factor: float) -> Relaxed:
    """``lambda`` -> the exact minimiser of ``cost + lambda * memory`` on ``problem`` (no budget), found by
    reducing that unbudgeted problem (every node folds or is dominated as without a budget) and eliminating
    what is left; None when even that is too wide at this ``lambda``.  Each reduction first rechecks the
    previous multiplier's dominance removals (same nodes and strategies, other costs: ``reduce_problem``'s
    ``hint``, each removal proven again here); LLaMA-3-70B's zigzag layout Z_2: 0.65 -> 0.61 s CPU, the same
    bound; the 405B-shaped LLaMA with PP 16: the same objective.

    A node of degree 2 is folded when its table (``S_a x S_b x S_v``) is within ``max_factor``, the largest
    table the elimination after it may build: folding is the elimination step that table would be (exact
    either way), made before the order is chosen, where the reduction's own cap (1e6) left it to the
    elimination.  On the 405B stage (PP 16, selective) the first multiplier's problem then keeps 12 nodes
    instead of 15 and its elimination 2.5e8 table entries instead of 4.7e8 (1.13 -> 0.60 s CPU); the other
    multipliers fold alike; the same minimisers, bound and plan."""
    memory = problem.memory
    assert memory is not None
    last: list[Certificates] = [()]  # the previous multiplier's dominance removals: rechecked first
    fold_cap = int(max_factor)

    def relaxed(lam: float) -> tuple[tuple[int, ...], float] | None:
        costs = tuple(c + lam * m for c, m in zip(problem.node_costs, memory, strict=True))
        free = dataclasses.replace(problem, node_costs=costs, memory=None, memory_limit=None)
        red = reduce_problem(free, hint=last[0], fold_cap=fold_cap)
        last[0] = red.dominated
        try:
            plan, value = ExactSolver(pairwise_form(red.problem), max_factor).solve()
        except FactorCapExceeded:
            return None
        return red.expand(plan), value + red.cost_offset

    return relaxed


def with_budget_by_reduction(
    run: Run,
    method: Literal["auto", "exact", "ilp", "propagate"],
    num_workers: int,
    max_factor: float,
    hint: Sequence[int] | None,
    peak: tuple[np.ndarray, ...] | None = None,
) -> Solution:
    """A budget on a problem too wide to eliminate with its memory terms: the Lagrangian dual, each relaxed
    problem reduced on its own (:func:`_relaxed_by_reduction`), its minimisers over the budget turned into
    fitting plans by exact neighbourhood re-solves (:mod:`~autoshard.search.neighbourhood`).

    Order, cheapest first: the least-memory plan (a reduction with memory as the cost: milliseconds) decides
    feasibility and is the first fitting plan; ``hint`` (e.g. the plan of another recomputation policy of the
    same graph) adds a line; the multipliers are probed from ``cost / budget`` downwards, so the unbudgeted
    problem (the widest relaxation) is solved only when nothing over the budget shows up above it.  Proven
    optimal when the dual closes the gap; otherwise the best fitting plan with the dual's bound, which CP-SAT
    (``"auto"``) tries to improve when its model is small enough to pay (:data:`CPSAT_MAX_PAIRS`)."""
    rp = run.current
    assert rp.memory_limit is not None
    least, least_mem = least_memory(rp, max_factor)
    if not least_mem <= rp.memory_limit:
        off = math.fsum(r.memory_offset for r in run.stages)
        raise memory_infeasible_error(run.problem, memory_lower_bound(run.problem), least_mem + off)
    relaxed = _relaxed_by_reduction(rp, max_factor)
    lag = Lagrange(least, evaluate(rp, least), trivial_lower_bound(rp), 0.0)
    here = None if hint is None else run.restrict(hint)
    seeds = () if here is None or None in here else (tuple(int(x) for x in here if x is not None),)
    for seed in seeds:
        if memory_of(rp, seed) <= rp.memory_limit and evaluate(rp, seed) < lag.cost:
            lag.plan, lag.cost = seed, evaluate(rp, seed)
    # the scale of the multiplier: seconds of the cheapest conceivable plan per byte of budget (the
    # least-memory plan's cost, often 50x that, would start far above the crossing)
    scale = lag.bound if lag.bound > 0 else lag.cost
    lam0 = max(scale, 1e-12) / max(rp.memory_limit, 1.0)
    # The probe count ends the search (the crossing is reached in a few; budget.MAX_SOLVES caps it), never
    # the clock, so that a loaded machine does not change the result.  Each relaxed solve
    # is a reduction and an elimination (~1 s on the 405B stage): stop once no multiplier can prove more than
    # 5 % of the gap left.
    dual_search(
        relaxed, rp, lag, lam0, seeds=seeds, tolerance=0.05,
        descend=True, ceiling=run.ceiling - run.offset(),
    )  # fmt: skip
    run.prune(lag.bound + run.offset())
    fits = memory_of(rp, lag.plan) <= rp.memory_limit
    if not lag.binding and lag.solves and lag.lam == 0.0 and fits and lag.closed():
        # the minimiser at lambda = 0 fits: the optimum without the budget
        run.log.append("exact (reduced without the budget): the optimum without the budget fits")
        return dataclasses.replace(
            run.finish(lag.plan, lag.bound + run.offset(), True, "exact:reduce"), budget_binding=False
        )
    starts = [x for x in seeds if memory_of(rp, x) > rp.memory_limit] + lag.over[-2:]
    for over in starts:  # the cheapest plans over the budget (and the hint): their fitting neighbours
        for fixed in (improve(rp, over, lag.plan), repair(rp, over)):
            if fixed is not None and evaluate(rp, fixed) < lag.cost:
                lag.plan, lag.cost = fixed, evaluate(rp, fixed)
    best = run.expand(lag.plan)
    early: tuple[tuple[int, ...] | None, bool] | None = None
    below = -math.inf  # fixing proved that no plan fitting with its peak costs less (reduced space)
    refined = False  # the dual refined (once: a second go costs, rarely proves)
    rep: Reparametrised | None = None
    rungs: list[float] = []  # the early fixing's thresholds (:data:`_EARLY_ROOMS`)
    if peak is not None and lag.over and not lag.closed():
        refined = True
        # the dual refined on the plan without its peak, then fixing just above that plan's cost: where a
        # plan that fits with its peak lies there, fixing finds and proves it without _fit_peak's re-solves
        dual_search(
            relaxed, rp, lag, lag.lam or lam0, seeds=(lag.over[-1],),
            tolerance=0.05, ceiling=run.ceiling - run.offset(),
        )  # fmt: skip
        run.prune(lag.bound + run.offset())
        best = run.expand(lag.plan)
        gap = lag.cost - lag.bound
        rep = reparametrise(run.problem, lag.lam) if lag.lam > 0.0 and gap > 0.0 else None
        rungs = [lag.cost + share * gap for share in _EARLY_ROOMS] if rep is not None else []
        early, below = _ladder(run, lag.lam, best, peak, rep, rungs[:1], below, RESIDUAL_WORK)
    if early is not None and early[1] and early[0] is not None:
        best = early[0]
        lag.cost = evaluate(run.problem, best) - run.offset()
    elif peak is not None:
        best = _fit_peak(run, peak, [run.expand(x) for x in starts], best)
        lag.cost = evaluate(run.problem, best) - run.offset()
    if not refined and lag.over and not lag.closed():  # the primal moved: probe on to 5 % of the gap left
        dual_search(
            relaxed, rp, lag, lag.lam or lam0, seeds=(lag.over[-1],),
            tolerance=0.05, ceiling=run.ceiling - run.offset(),
        )  # fmt: skip
        run.prune(lag.bound + run.offset())
        if peak is None and lag.cost + run.offset() < evaluate(run.problem, best):
            best = run.expand(lag.plan)  # a probe's minimiser fit and beat it (with peak terms: kept out)
        lag.cost = evaluate(run.problem, best) - run.offset()
    proven = early is not None and early[1] and early[0] is not None
    if proven:
        lag.bound = lag.cost  # fixing proved it: no plan that fits with its peak is cheaper
    elif not lag.closed() and lag.lam > 0.0 and not (rungs and early is None and rungs[0] >= lag.cost):
        # (skipped when the first rung, above this plan, was left too wide for CP-SAT: this keeps as much)
        # at the whole gap; what fixing leaves too wide for the Pareto elimination goes to CP-SAT
        found = _close_by_fixing(run, lag.lam, best, peak, rep=rep, work=RESIDUAL_WORK)
        if found is not None and found[0] is not None:
            best, proven = found[0], found[1]
            lag.cost = evaluate(run.problem, best) - run.offset()
            if proven:  # no fitting plan is cheaper (with peak terms: fitting with its own peak)
                lag.bound = lag.cost
    if not proven and early is not None and len(rungs) > 1:  # the rest of the ladder, for its bounds
        early, below = _ladder(run, lag.lam, best, peak, rep, rungs[1:], below)
        if early is not None and early[1] and early[0] is not None:
            best, proven = early[0], True
            lag.cost = lag.bound = evaluate(run.problem, best) - run.offset()
    if lag.bound < below <= lag.cost:  # (a plan below it does not fit with its peak: the bound says nothing)
        lag.bound = below
    bound = lag.bound + run.offset()
    run.log.append(
        f"lagrangian by reduction: {lag.solves} relaxed solves"
        + (f" ({lag.failed} too wide)" if lag.failed else "")
        + f", best fitting plan {lag.cost + run.offset():.6g} s, bound {bound:.6g} s "
        f"(gap {relative_gap(lag.cost + run.offset(), bound):.3%})"
    )
    binding = True if lag.binding else None
    if lag.closed():
        how = "exact:fixing" if proven else "exact:lagrangian"
        return dataclasses.replace(run.finish_original(best, bound, True, how), budget_binding=binding)
    pairs = sum(e.cost.size for e in rp.edges)
    if method != "exact" and pairs > CPSAT_MAX_PAIRS:
        run.log.append(
            f"cp-sat not run: its model would hold {pairs} edge variables (over {CPSAT_MAX_PAIRS}), more "
            "than it proves in the time limit; the gap above is what is proven"
        )
    if method == "exact" or pairs > CPSAT_MAX_PAIRS:
        return dataclasses.replace(
            run.finish_original(best, bound, False, "exact:lagrangian"), budget_binding=binding
        )
    return run_ilp(run, lag.plan, num_workers, floor=lag.bound, fallback=best)


def _fit_peak(
    run: Run, peak: tuple[np.ndarray, ...], starts: list[tuple[int, ...]], best: tuple[int, ...]
) -> tuple[int, ...]:
    """The cheapest plan found that fits with its own peak (original nodes): the neighbourhoods of the
    over-budget plans re-solved with the peak terms (exactly, by :func:`solve` on each small neighbourhood);
    ``best`` itself when it fits so, or when nothing found does (the caller's thresholds then decide)."""
    plain = run.problem
    assert plain.memory_limit is not None
    floor = peak_floor(dataclasses.replace(plain, peak=peak))
    full = dataclasses.replace(plain, peak=peak, memory_limit=plain.memory_limit + floor)
    if memory_of(full, best) <= plain.memory_limit + floor:
        return best  # it fits with its peak already: the neighbourhoods were searched without the peak
    from autoshard.search.solve import solve  # the whole solver on each small neighbourhood

    upper, found = math.inf, None
    for over in starts:
        plan = improve(full, over, best, upper=upper, solver=solve)
        if plan is not None:
            found, upper = plan, evaluate(full, plan)
    return found if found is not None else best


def _ladder(
    run: Run,
    lam: float,
    best: tuple[int, ...],
    peak: tuple[np.ndarray, ...] | None,
    rep: Reparametrised | None,
    rungs: Sequence[float],
    below: float,
    work: float = 0.0,
) -> tuple[tuple[tuple[int, ...] | None, bool] | None, float]:
    """Fixing below each of ``rungs`` (reduced-space costs, rising) in turn, on one diffusion ``rep``:
    ``(the last rung's answer, the highest rung proven empty)`` (``below`` when none is); it stops at a
    rung not proven (answer None) or one that finds and proves the cheapest fitting plan.  ``work``: as
    :func:`_close_by_fixing`'s."""
    early: tuple[tuple[int, ...] | None, bool] | None = None
    for upper in rungs:
        early = _close_by_fixing(run, lam, best, peak, upper=upper + run.offset(), rep=rep, work=work)
        if early is None or early[0] is not None:
            break  # not proven, or the cheapest fitting plan found and proven
        below = upper  # proven: nothing that fits with its peak costs less than ``upper``
    return early, below


def _close_by_fixing(
    run: Run,
    lam: float,
    best: tuple[int, ...],
    peak: tuple[np.ndarray, ...] | None,
    upper: float | None = None,
    rep: Reparametrised | None = None,
    work: float = 0.0,
) -> tuple[tuple[int, ...] | None, bool] | None:
    """The duality gap closed where it can be (:mod:`~autoshard.search.diffusion`): the cheapest plan on
    the original nodes that fits (with its own peak, when there are peak terms) and whether that is proven;
    None when ``best`` does not fit with its peak (fixing needs a fitting plan's cost as its threshold).
    ``upper`` instead of ``best``'s cost: only plans below it are looked for (``best`` need not fit):
    ``(None, True)`` when none is, proven (``upper`` is then a lower bound), None when not proven.

    With peak terms, by thresholds as :mod:`~autoshard.search.peak` does: every plan fits ``P(t)`` for ``t``
    its own peak, so the optimum is the least of :func:`exact_below` over the thresholds; each ``P(t)``'s
    reparametrised bound rises by ``lam * (t - floor)`` over the relaxation's, so all but the lowest few are
    closed by the bound alone."""
    plain = run.problem
    assert plain.memory_limit is not None
    subs: list[tuple[SearchProblem | None, float]] = [(plain, 0.0)]  # (P(t), how much its bound rises)
    if peak is not None:
        floor = peak_floor(dataclasses.replace(plain, peak=peak))
        full = dataclasses.replace(plain, peak=peak, memory_limit=plain.memory_limit + floor)
        assert full.memory_limit is not None
        if upper is None and memory_of(full, best) > full.memory_limit:
            return None
        least = memory_lower_bound(plain)  # thresholds that leave less budget than that fit nothing
        subs = [
            (at_threshold(plain, peak, t, full.memory_limit), lam * (t - floor))
            for t in thresholds(full, floor)
            if full.memory_limit - t >= least
        ]
    if rep is None:  # once: each P(t) masks strategies and lowers the budget by t - floor
        rep = reparametrise(plain, lam)
    known = upper is None  # ``best`` fits: it is the answer unless something cheaper is found
    upper = evaluate(plain, best) if upper is None else upper
    run.log.append(
        f"reparametrised fixing (search/diffusion.py): bound {rep.bound:.6g} s, plans below {upper:.6g} s"
    )
    proven = True
    for sub, lift in subs:
        if sub is None:
            continue  # a node has no strategy under this threshold
        found, done = exact_below(sub, lam, upper, run.log, rep, lift, work, best)
        if found is not None and evaluate(plain, found) < upper:
            best, upper, known = found, evaluate(plain, found), True
        if not done:  # one threshold left open leaves the whole open: the rest would cost without proving
            proven = False
            break
    run.log.append(
        "reparametrised fixing: "
        + ("optimal" if proven and known else "nothing fits below" if proven else "not proven")
        + f" at {upper:.6g} s"
        + (f" over {len(subs)} peak thresholds" if peak is not None else "")
    )
    if not known:
        return (None, True) if proven else None
    return best, proven


def least_memory(problem: SearchProblem, max_factor: float) -> tuple[tuple[int, ...], float]:
    """The least-memory finite plan; by reduction (memory as the only cost) when the graph is too wide."""
    try:
        return min_memory_plan(problem, max_factor_size=max_factor)
    except FactorCapExceeded:
        pass
    assert problem.memory is not None
    costs = tuple(
        np.where(np.isfinite(c), m, np.inf) for c, m in zip(problem.node_costs, problem.memory, strict=True)
    )
    edges = tuple(
        dataclasses.replace(e, cost=np.where(np.isfinite(e.cost), 0.0, np.inf)) for e in problem.edges
    )
    free = dataclasses.replace(problem, node_costs=costs, edges=edges, memory=None, memory_limit=None)
    red = reduce_problem(free)
    plan, _ = ExactSolver(pairwise_form(red.problem), max_factor).solve()
    full = red.expand(plan)
    return full, memory_of(problem, full)
