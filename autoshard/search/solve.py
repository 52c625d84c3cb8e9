"""Solver dispatch: reduce, solve exactly where possible, CP-SAT where a memory budget binds.

Input: a :class:`~autoshard.search.problem.SearchProblem`.  Output: a
:class:`~autoshard.search.problem.Solution` on the original nodes, with an honest ``optimal`` flag, a proven
``lower_bound`` and ``gap``, and a log of what ran and why.

``method="auto"``:

1. :func:`~autoshard.search.reduce.reduce_problem` prunes, folds fixed nodes, eliminates memory-free
   nodes of degree <= 2 and drops dominated strategies (all exact).
2. No budget: exact tree DP / variable elimination (cutset conditioning when a table would exceed the size
   cap).  If even that fails, the reduction again with degree-2 folds past their default cap (LLaMA-tiny's
   2x2x2 floor: 43 nodes left -> 5); only then CP-SAT with a propagation warm start.
3. Budget: the exact optimum without the budget; if it fits, it is optimal under the budget too.  Otherwise
   the least-memory plan decides feasibility (InfeasibleError stating the least memory needed), a
   Lagrangian sweep (:mod:`~autoshard.search.budget`: exact solves of ``cost + lambda * memory``) gives a
   fitting plan and a lower bound, Lagrangian fixing drops the strategies no plan cheaper than that one can
   use (first no plan within a tenth of the gap above the bound, then three tenths: :func:`_climb`, whose
   Pareto elimination is then small), the problem is reduced again, and its exact optimum is returned if it
   fits; otherwise elimination over (memory, cost) Pareto sets (:mod:`~autoshard.search.pareto`) solves
   what is left exactly, and only when its tables grow too large does CP-SAT, warm-started from the
   Lagrangian plan and told its bound, close the gap within the time limit.
4. Budget, and the budgeted problem too wide to eliminate (its memory terms keep nodes from folding: the
   405B-shaped LLaMA's pipeline stage on 8 x 16 x 8): the same Lagrangian dual with each relaxed problem
   ``cost + lambda * memory`` reduced and eliminated on its own (no budget, so it folds); proven optimal
   when the dual closes, else its best fitting plan and bound, which CP-SAT then tries to improve.
5. ``ceiling``: once every term at its cheapest, the optimum without the budget, or the Lagrangian bound
   under it reaches it, :class:`~autoshard.search.run.BoundExceeded` instead of the rest of the budgeted
   solve (the mesh search's pruning, the recompute-count search's intervals, a recomputation policy that
   cannot beat another's plan: LLaMA-3-70B's full recomputation by the first of these, in milliseconds);
   with ``multiplier`` too, first of all its Lagrangian bound, on any path (:mod:`~autoshard.search.hinted`).

``"exact"`` never calls CP-SAT (under a binding budget it returns the Lagrangian plan and its proven gap);
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

import dataclasses
import math
import time
from collections.abc import Mapping, Sequence
from typing import Literal

import numpy as np

from autoshard.errors import AutoshardError, InfeasibleError
from autoshard.search.brute import brute_force
from autoshard.search.budget import Lagrange, below_masks, fixing_masks, lagrangian_sweep, relaxed_marginals
from autoshard.search.exact import MAX_FACTOR_SIZE, ExactSolver, min_memory_plan
from autoshard.search.hinted import Probe, probe_first
from autoshard.search.pareto import pareto_below, pareto_plan
from autoshard.search.problem import (
    SearchProblem,
    Solution,
    evaluate,
    format_bytes,
    memory_infeasible_error,
    memory_lower_bound,
    memory_of,
)
from autoshard.search.reduce import WIDE_FOLD, Certificates, reduce_problem
from autoshard.search.run import (
    BoundExceeded,
    Run,
    exact_label,
    exact_solver,
    propagated,
    run_ilp,
    trivial_lower_bound,
)
from autoshard.search.wide import with_budget_by_reduction

__all__ = ["BoundExceeded", "Method", "solve", "trivial_lower_bound"]

Method = Literal["auto", "exact", "ilp", "propagate"]

_Hints = tuple[float | None, Sequence[int] | None, bool | None]  # multiplier, incumbent, probe_hint's fit


#: Rounds of Lagrangian sweep + fixing + reduction before CP-SAT takes over.  A second round can only
#: gain where the first one's reduction (dominance, folding) changed the structure; on the LLaMA budgets
#: measured it fixed nothing more, so two rounds bound the cost (~30 small exact solves each).
_FIXING_ROUNDS = 2

#: Plans the budgeted path enumerates outright once Lagrangian fixing has shrunk the problem (~0.1 s).
_MAX_ENUMERATION = 200_000

#: Without a ceiling the sweep stops once the most any multiplier can still prove is within this share of
#: the remaining gap (``dual_search(tolerance=)``): its bound stays a true one and only serves fixing, which
#: the last, confirming probes barely strengthen.  LLaMA-3-70B on 16 x 8 x 8 (selective recomputation): 4
#: probes instead of 7, 5,523 strategies fixed instead of 5,524, the same Pareto elimination and optimum
#: (3 probes since dual_search's far-start rule).  It stops only once a probe's minimiser fits.
_DUAL_TOLERANCE = 0.1

#: Shares of the Lagrangian gap (best fitting plan's cost minus the bound) tried, one after another, as the
#: ceiling of fixing before the whole gap (:func:`_climb`): a lower ceiling fixes far more strategies, so
#: the Pareto elimination that follows is small.  LLaMA-3-70B on 16 x 8 x 8 (selective recomputation): the
#: optimum lies at 0.07 of the gap; fixing at the whole gap leaves 1,227 of 6,715 strategies and a Pareto
#: step of 3e6 entries (0.5 s CPU); at 0.1 of it, 685 strategies and a Pareto elimination of milliseconds
#: (the selective solve 1.0 -> 0.83 s CPU).  A rung proven empty raises the bound to it.
_RUNGS = (0.1, 0.3)

#: ``dominance_search=False`` searches dominance after all where the hinted removals leave a table over this
#: (2x LLaMA-3-70B's ranking solve's 8.3e6 entries, 6.3e6 after a search): wider tables cost more than it.
_HINTED_TABLE = 2**24


def _fits_unconstrained(run: Run, ex: ExactSolver) -> Solution | None:
    """The exact optimum without the budget, as the answer when it fits (then it is optimal under it too)."""
    rp = run.current
    assert rp.memory_limit is not None
    plan, value = ex.solve()
    if memory_of(rp, plan) > rp.memory_limit:
        run.prune(value + run.offset())  # the optimum without the budget bounds the one under it
        return None
    off = math.fsum(r.memory_offset for r in run.stages)
    run.log.append(
        f"exact: the optimum without the budget fits ({format_bytes(memory_of(rp, plan) + off)} of "
        f"{format_bytes(rp.memory_limit + off)}), so it is optimal under the budget too"
    )
    return dataclasses.replace(
        run.finish(plan, value + run.offset(), True, exact_label(ex)), budget_binding=False
    )


def _with_budget(
    run: Run, ex: ExactSolver, method: Method, num_workers: int, max_factor: float, hints: _Hints
) -> Solution:
    """Unconstrained optimum if it fits; else rounds of Lagrangian sweep, fixing and reduction, then
    enumeration or CP-SAT on what is left; the multiplier of the best bound goes with the answer.
    ``hints``: ``solve``'s ``multiplier`` and ``incumbent``."""
    lam: list[float] = []  # the multiplier of the best bound so far
    found = _budgeted(run, ex, method, num_workers, max_factor, hints, lam)
    return dataclasses.replace(found, multiplier=lam[-1]) if lam else found


def _budgeted(
    run: Run,
    ex: ExactSolver,
    method: Method,
    num_workers: int,
    max_factor: float,
    hints: _Hints,
    lam: list[float],
) -> Solution:
    first, incumbent, fits = hints
    known = probe_first(run, ex, first, fits) if first is not None else {}
    done = _fits_unconstrained(run, ex)
    if done is not None:
        return done
    rp = run.current
    assert rp.memory_limit is not None
    least, least_mem = min_memory_plan(rp, max_factor_size=max_factor)
    if not least_mem <= rp.memory_limit:
        off = math.fsum(r.memory_offset for r in run.stages)
        raise memory_infeasible_error(run.problem, memory_lower_bound(run.problem), least_mem + off)
    best = run.start_plan(run.expand(least), incumbent)  # the best fitting plan so far (original nodes)
    bound = -math.inf  # a proven lower bound on the original objective
    for round_ in range(_FIXING_ROUNDS):
        lag = _sweep(run, ex, best, max_factor, first, known)
        known = {}  # the next round sweeps another reduction
        if run.offset() + lag.cost < evaluate(run.problem, best):
            best = run.expand(lag.plan)
        if lag.bound + run.offset() > bound:
            lam.append(lag.lam)
        bound = max(bound, lag.bound + run.offset())
        run.prune(bound)  # the caller's ceiling (mesh search, recompute-k search): proven no better
        upper = evaluate(run.problem, best)
        if upper - bound <= 1e-9 * abs(upper):
            return run.finish_original(best, bound, True, "exact:lagrangian")
        marginals = relaxed_marginals(ex, run.current, lag)
        if round_ == 0:  # is the optimum near the bound? (_RUNGS)
            climbed = _climb(run, lag, marginals, bound, upper)
            if isinstance(climbed, Solution):
                return climbed
            bound = climbed
        keep = fixing_masks(ex, run.current, lag, ceiling=upper - run.offset(), marginals=marginals)
        fixed = sum(int((~k).sum()) for k in keep)
        run.log.append(
            f"lagrangian fixing: {fixed} of {sum(run.current.sizes)} strategies cannot beat that plan"
        )
        red = reduce_problem(dataclasses.replace(run.current, allowed=tuple(keep)))
        run.stages.append(red)
        run.log.extend(red.log)
        plans_left = math.prod(run.current.sizes)
        if plans_left <= _MAX_ENUMERATION:
            # What fixing leaves is often tiny (LLaMA-3-8B: a few nodes, no edges): enumerating it is exact,
            # deterministic and spares the CP-SAT import.
            run.log.append(f"enumerating the {plans_left} plans left")
            found = brute_force(run.current, max_assignments=_MAX_ENUMERATION).choice
            return run.finish(found, bound, True, "exact:enumeration")
        pareto = pareto_plan(run.current, upper=upper - run.offset(), lam=lag.lam)
        if pareto is not None:  # what fixing leaves is small: exact elimination over (memory, cost) sets
            run.log.append("exact: variable elimination over (memory, cost) Pareto sets (search/pareto.py)")
            return run.finish(pareto, bound, True, "exact:pareto")
        solver = exact_solver(run, max_factor)
        if solver is None:
            break
        ex = solver
        done = _fits_unconstrained(run, ex)
        if done is not None:
            return done
        if fixed == 0:
            break
    if method == "exact":
        return run.finish_original(best, bound, False, "exact:lagrangian")
    return run_ilp(run, run.restrict(best), num_workers, floor=bound - run.offset(), fallback=best)


def _climb(
    run: Run, lag: Lagrange, marginals: list[np.ndarray], bound: float, upper: float
) -> Solution | float:
    """The optimum when it lies within the first :data:`_RUNGS` of the gap above ``bound``, else the bound
    raised to the highest rung proven empty (all on the original objective).

    For a rung ``T``, fixing keeps only the strategies some fitting plan costing at most ``T`` may use; the
    cheapest fitting plan of what is left, when it costs at most ``T``, is the optimum (every plan that
    cheap survived), and an empty answer proves no plan costs at most ``T``.  Each rung is exact; a rung
    the Pareto elimination cannot finish ends the climb (the caller fixes at ``upper`` as before)."""
    rp = run.current
    for share in _RUNGS:
        rung = bound + share * (upper - bound)
        keep = below_masks(marginals, rp, lag.lam, rung - run.offset())
        if rp.allowed is not None:
            keep = [k if a is None else k & a for k, a in zip(keep, rp.allowed, strict=True)]
        try:
            red = reduce_problem(dataclasses.replace(rp, allowed=tuple(keep)))
        except InfeasibleError:  # a node with no strategy left, or what is left cannot fit: none that cheap
            plan, proven = None, True
        else:
            run.stages.append(red)
            top = rung - run.offset()
            plan, proven = pareto_below(run.current, upper=top, lam=lag.lam)
            if plan is not None and evaluate(run.current, plan) <= top:
                run.log.extend(red.log)
                run.log.append(
                    f"exact: the optimum lies within {share:g} of the Lagrangian gap: fixing kept "
                    f"{sum(int(k.sum()) for k in keep)} strategies, Pareto sets (search/pareto.py) found it"
                )
                return run.finish(plan, rung, True, "exact:pareto")
            run.stages.pop()
        if not proven or plan is not None:
            break  # over the tables' caps, or rounding: the whole gap decides
        bound = rung
        run.log.append(f"exact: no fitting plan costs at most {rung:.6g} s (fixing below it, Pareto sets)")
        run.prune(bound)
    return bound


def _sweep(
    run: Run,
    ex: ExactSolver,
    best: tuple[int, ...],
    max_factor: float,
    first: float | None = None,
    known: Mapping[float, tuple[tuple[int, ...], float]] | None = None,
) -> Lagrange:
    """Lagrangian sweep on the current problem, starting from ``best`` (original nodes) where that plan
    survived the reductions, else from the current least-memory plan; ``first``: a multiplier to probe
    before the cutting planes; ``known``: relaxed solves already made on this problem, by multiplier."""
    rp = run.current
    here = run.carry(best)
    start = tuple(s for s in here if s is not None)
    fits = len(start) == rp.num_nodes and memory_of(rp, start) <= (rp.memory_limit or 0.0)
    if not (fits and math.isfinite(evaluate(rp, start))):
        start, _ = min_memory_plan(rp, max_factor_size=max_factor)
    plan, value = ex.solve()
    lag = Lagrange(start, evaluate(rp, start), value, 0.0)
    lam0 = max(value, 1e-12) / max(memory_of(rp, plan), 1.0)
    ceiling = run.ceiling - run.offset()
    tolerance = 0.0 if math.isfinite(ceiling) else _DUAL_TOLERANCE  # a ceiling wants the highest bound
    # no clock: the probe count (budget.MAX_SOLVES) ends the sweep, so the plan does not depend on machine load
    lagrangian_sweep(ex, rp, lag, lam0, (plan,), ceiling, first, tolerance, known)
    run.log.append(
        f"lagrangian: {lag.solves} exact solves, best fitting plan {lag.cost:.6g} s, bound {lag.bound:.6g} s "
        f"(reduced problem)"
    )
    return lag


def solve(
    problem: SearchProblem,
    *,
    method: Method = "auto",
    time_limit: float = 60.0,
    num_workers: int = 2,
    hint: Sequence[int] | None = None,
    max_factor_size: float = MAX_FACTOR_SIZE,
    ceiling: float = math.inf,
    peak: tuple[np.ndarray, ...] | None = None,
    multiplier: float | None = None,
    dominated: Certificates = (),
    incumbent: Sequence[int] | None = None,
    dominance_search: bool = True,
) -> Solution:
    """The best plan for ``problem`` within ``time_limit`` seconds (see the module docstring for the methods).

    ``ceiling``: under a budget, raise :class:`BoundExceeded` as soon as the cheapest term-by-term sum, the
    optimum without the budget (when it does not fit), or the Lagrangian bound (lower bounds on the optimum
    under it) is at least this, instead of solving on under the budget.

    ``multiplier``: a Lagrange multiplier of the budget to probe first (a similar problem's
    :attr:`Solution.multiplier`); only the number of exact solves depends on it.  With a ``ceiling`` its
    bound is tried first, so BoundExceeded may come where no plan fits at all (the caller drops both alike).

    ``dominated``: a similar problem's :attr:`Solution.dominated` (same nodes and strategies, other costs),
    checked and applied before the reduction's own dominance search; only its speed depends on it.
    ``dominance_search=False``: the first reduction applies only those removals unless what they leave is
    wide (``reduce_problem(search=)``, :data:`_HINTED_TABLE`); only the speed depends on it.

    ``incumbent``: a plan of this problem (a similar one's optimum); under a binding budget the Lagrangian
    sweep starts from it when it fits (:meth:`Run.start_plan`).  Only the work depends on it.

    ``peak``: the peak terms of the problem this one relaxes (:mod:`~autoshard.search.peak` lowered the
    budget by their floor and dropped them); the neighbourhood search then looks for plans that fit with
    their own peak, which the relaxation's answer must do to be the answer.

    Raises InfeasibleError when no finite plan fits (the message names the nodes or the least memory needed)
    and AnnotationConflictError (an AnnotationError and an InfeasibleError) when annotations conflict.
    """
    if problem.peak is not None:  # a max term in the budget: thresholds over plain solves (search/peak.py)
        from autoshard.search.peak import solve_with_peak

        kwargs = dict(
            method=method,
            time_limit=time_limit,
            num_workers=num_workers,
            hint=hint,
            multiplier=multiplier,
            dominated=dominated,
            incumbent=incumbent,
            dominance_search=dominance_search,
        )
        return solve_with_peak(problem, solve, max_factor_size=max_factor_size, ceiling=ceiling, **kwargs)
    start = time.perf_counter()
    if method == "propagate":
        sol = propagated(problem, start)
        if sol is not None:
            return sol
    if problem.memory is not None and problem.memory_limit is not None:
        # No plan needs less than every node at its least memory: when even that is over the budget, say so
        # now rather than after two exact solves (the planner then retries with recomputation).
        floor = memory_lower_bound(problem)
        if floor > problem.memory_limit:
            raise memory_infeasible_error(problem, floor, None)
        if math.isfinite(ceiling):  # every term at its cheapest: milliseconds, before any reduction
            cheapest = trivial_lower_bound(problem)
            if math.isfinite(cheapest) and cheapest >= ceiling:
                raise BoundExceeded(cheapest, ceiling)
    # Folding free nodes creates the pair matrices on which dominance prunes most (the LLaMA problems
    # reduce to nothing), and it shrinks the CP-SAT model.
    red = reduce_problem(problem, hint=dominated, search=dominance_search)
    run = Run(problem, [red], start, time_limit, log=list(red.log), ceiling=ceiling)
    if method == "propagate":
        run.log.insert(0, "propagate: the plan has inf cost or breaks the budget; solving exactly instead")
        method = "auto"
    if method == "ilp":
        return run_ilp(run, None if hint is None else red.restrict(hint), num_workers)
    # the hinted bound first where the budgeted problem is too wide to eliminate as it is (search/hinted.py)
    probe = Probe(run, multiplier, dominated, dominance_search, max_factor_size)
    ex = exact_solver(run, max_factor_size, probe)
    if not dominance_search and (ex is None or ex.largest_factor > _HINTED_TABLE):  # wide: search after all
        red = reduce_problem(problem, hint=dominated)
        probe.run = run = Run(problem, [red], start, time_limit, log=list(red.log), ceiling=ceiling)
        ex = exact_solver(run, max_factor_size, probe)
    if ex is None and red.problem.memory_limit is None:  # folds over the default cap: often exact after all
        red = reduce_problem(problem, hint=dominated, fold_cap=WIDE_FOLD)  # (LLaMA-tiny on 2x2x2: 47 -> 2 s)
        log = [*run.log[:-1], run.log[-1].replace("using CP-SAT", f"folding up to {WIDE_FOLD:.0e}"), *red.log]
        probe.run = run = Run(problem, [red], start, time_limit, log=log, ceiling=ceiling)
        ex = exact_solver(run, max_factor_size, probe)
    if ex is None and red.problem.memory_limit is not None:
        # Memory terms keep nodes from folding, so the budgeted problem's treewidth is high; each relaxed
        # problem (cost + lambda * memory, no budget) still reduces and solves exactly.
        return with_budget_by_reduction(run, method, num_workers, max_factor_size, hint, peak)
    if ex is None:
        if method == "exact":
            raise AutoshardError(
                "method='exact' cannot solve this graph: " + run.log[-1] + ". Use method='auto' or 'ilp'."
            )
        return run_ilp(run, None if hint is None else red.restrict(hint), num_workers)
    run.log.append(f"exact: {ex.describe()}")
    if red.problem.memory_limit is not None:
        return _with_budget(
            run, ex, method, num_workers, max_factor_size, (multiplier, incumbent, probe.fits)
        )
    plan, value = ex.solve()
    return run.finish(plan, value + red.cost_offset, True, exact_label(ex))
