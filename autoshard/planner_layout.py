"""The sequence layout of context parallelism, searched with the plan instead of chosen after it.

Input: a problem built with ``CostOptions.cp_layout`` ``"auto"`` (rings priced balanced, no reordering: the
*balanced bound* B, :mod:`autoshard.problem.context`) or ``"zigzag"``, its solution, and a way to rebuild it
on another cluster and options.  Output: the problem, the solution and a note for the best (plan, layout).

Layouts.  Every plan with a given layout is priced exactly by one problem: C (``cp_layout="contiguous"``:
every ring contiguous, with its causal imbalance) or Z_a, the problem on a
:class:`~autoshard.problem.context.ZigzagCluster` for axis ``a`` (rings on ``a`` balanced, every gather,
reduce-scatter and all-to-all on ``a`` with its reordering copy, one-run ops split on ``a`` refused; rings
on other axes contiguous).  The optimum over (plan, layout) pairs is the best of their optima.

Tie rule.  On equal price (within ``TIE``, relative) the layout earlier in the order contiguous -> zigzag on
the bound's ring axis -> zigzag on the other axes wins (contiguous runs no reordering copy and refuses no
one-run op; the optimum's value does not depend on the rule).  So each later layout has only to be
*strictly* better than the best so far: it is solved with its ceiling just below it.

What the search stands on (prices: problem/context.py, problem/pricing.py, problem/arrays.py):

(F1) B(p) <= C(p) and B(p) <= Z_a(p) for every plan p: B prices each ring balanced (its least time) and each
     collective at the plain cluster's price, which a ZigzagCluster's only raises (by a copy >= 0, on
     ``a``); redistribution prices are shortest paths over those move prices, so they do not fall either,
     and B refuses nothing.  Float sums of terms that do not fall do not fall.
(F2) Dominance: for a plan p that rings over ``a`` on no node, Z_a(p) >= C(p): Z_a prices p's rings (all
     off ``a``) contiguous at C's hop prices, and the rest as in (F1).  So with C's optimum proven, Z_a can
     only be strictly better with a plan that rings on ``a``: every other p has Z_a(p) >= C(p) >= C's
     optimum >= the best so far.  Where one variable holds every ring strategy (LLaMA: the collapsed
     blocks' attention), "rings on ``a``" is that variable's choice, and Z_a's problem is solved with it
     held to its rings on ``a`` (a smaller problem); the answer is a plan of the whole Z_a problem.
(F3) Memory: B(p), C(p) and Z_a(p) hold the same bytes for every plan p.  Node and temporary figures read
     no collective price and no layout (a zigzag cluster's come from its plain cluster's cache,
     problem/shared.py), and a gathered FSDP weight's size is the largest all-gather on the path the
     emitted program runs, which codegen plans on the plain cluster whatever the layout (problem/extras.py:
     its zigzag cheapest path may gather other sizes, LLaMA-3-70B's Z_0..2 less, but is not what runs).
     So p fits the budget under Z_a iff under C iff under B, and with a budget: B's budgeted optimum is at
     most every layout's (a plan that fits under Z_a fits under B, priced no higher by F1), which makes the
     stop at the balanced bound exact; and (F2) holds among the plans that fit (such a p that rings
     nowhere on ``a`` fits under C too, so Z_a(p) >= C(p) >= C's budgeted optimum).

The search, after solving B.  When B's optimum rings on no axis, C prices it the same and it is the
optimum, layout contiguous: nothing more is solved (``"zigzag"`` asked too: a plan without a ring has no
context axis and reorders nothing).  Otherwise:

1. C (``"auto"`` only; it shares B's build cache, :mod:`autoshard.problem.shared`): the bound's own plan
   priced in C (no solve) reaching the bound makes C optimal, else C is solved;
2. Z_a for the bound's ring axis, then for the other axes, while the best is above the bound.  With C's
   optimum proven (F2 holds, under a budget too by F3), a *lower bound* first, without a rebuild: B with
   the strategies Z_a refuses masked and the ring variable held to rings on ``a``, solved under the
   budget with the best as its ceiling (the other axes first together, the ring held to any of them).  It
   is below Z_a's budgeted optimum over those plans: they fit under B iff under Z_a (F3) and B prices
   each no higher (F1); so at or above the best, Z_a is skipped.  Else Z_a is rebuilt (its build cache
   reuses every figure no collective on ``a`` prices), its bound plan priced, and last its budgeted solve
   below the best (under a binding budget it stops first at its Lagrangian bound at B's multiplier, below).

Hints.  Every budgeted solve after B probes B's Lagrange multiplier first (:attr:`Solution.multiplier`;
``solve(multiplier=)``): every layout holds B's bytes (F3), so the budget binds alike and one or two
probes prove a bound where a cold sweep takes four.  Z_a's Lagrangian bound: for ``lam >= 0`` every plan
``x`` that fits (``bytes(x) + peak(x) <= L``, ``peak(x) >= f`` the least peak any plan has) costs at least
``cost(x) + lam * bytes(x) - lam * (L - f)``, whose least value over all plans is one solve without the
budget (it reduces and eliminates where the budgeted problem is too wide: Z_a's memory terms keep nodes
from folding); at or above the best, Z_a is skipped.  The solver probes it before anything else
(:mod:`~autoshard.search.hinted`).  Hints change the work only, never the answer.

LLaMA-3-70B on 16 x 8 x 8 (selective recomputation): B 11.75705 (ring on axis 2, multiplier 4.3e-11
s/B); C solved, 11.758435 (it rings nowhere; B's plan there 12.088); Z_2 held to its ring: Lagrangian
bound 12.07 at B's multiplier, skipped; Z_0, Z_1: the masked B under the budget at least 12.66 (without
the budget 10.46: memory binds), skipped, neither built.  LLaMA-3-8B on 2 x 4 x 8 (the budget idle):
B 1.1537 (ring on axis 2), C 1.1543, Z_2 held to its ring 1.1554; Z_0, Z_1 at least 1.164, never built.

``"zigzag"`` asked solves only the zigzag problems (no C, so no dominance).  Pipelined plans are not searched
so: the stage search prices rings balanced and :func:`~autoshard.problem.context.choose_layout` picks the
layout on its plan (imbalance against reordering), because re-pricing a 405B stage under each layout cost
minutes; every stage then runs that layout.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

from autoshard.cluster import Cluster
from autoshard.errors import AnnotationError, AutoshardError, InfeasibleError, ShardingError
from autoshard.planner_steps import SearchMethod
from autoshard.problem.build import BuiltProblem
from autoshard.problem.context import (
    one_run_ops,
    ring_axis_of,
    ring_axis_of_plan,
    ring_variable,
    zigzag_axis_of,
    zigzag_cluster,
    zigzag_masks,
)
from autoshard.problem.costs import CostOptions
from autoshard.search import BoundExceeded, SearchProblem, Solution, solve
from autoshard.search.problem import evaluate, memory_of, relative_gap
from autoshard.search.reduce import Certificates
from autoshard.strategies import OpStrategy

__all__ = ["TIE", "search_layout"]

Rebuild = Callable[[Cluster, CostOptions], tuple[BuiltProblem, BuiltProblem]]
"""(cluster, options) -> (the problem as priced, the same with the user's pins)."""

TIE = 1e-12
"""Relative price difference within which two layouts tie (the earlier in the tie order wins)."""


def search_layout(
    free: BuiltProblem,
    built: BuiltProblem,
    rebuild: Rebuild,
    method: SearchMethod,
    time_limit: float,
    ceiling: float = math.inf,
) -> tuple[BuiltProblem, BuiltProblem, Solution]:
    """The best (problem, solution) over the sequence layouts (module doc), each solved by
    :func:`~autoshard.search.solve` with ``method``, ``time_limit`` and ``ceiling``; the pinned problem
    carries a note with every layout's price."""
    solution = solve(built.problem, method=method, time_limit=time_limit, ceiling=ceiling)
    asked = built.options.cp_layout
    mesh = tuple(built.cluster.mesh_shape)
    axis = _ring_axis(built, solution)
    if asked == "contiguous" or zigzag_axis_of(built.cluster) is not None or axis is None:
        return free, built, solution  # the layout was priced already, or the bound is attained without a ring
    search = _Search(built, solution, rebuild, method, time_limit, ceiling)
    if asked == "auto":
        search.contiguous()
    others = [a for a in range(len(mesh)) if mesh[a] > 1 and a != axis]
    for a in [axis, *others]:
        if search.best is not None and search.best.cost <= search.reach:
            break  # nothing is below the balanced bound
        if len(others) > 1 and a == others[0] and search.bounded(tuple(others)):
            break  # one lower bound for every other axis at once
        search.zigzag(a)
    return search.result(axis)


@dataclass(frozen=True, slots=True)
class _Found:
    """The best layout so far: its price, problems and solution."""

    cost: float
    free: BuiltProblem
    built: BuiltProblem
    solution: Solution


class _Search:
    """The layouts' problems in tie order, each against the best so far (module doc)."""

    def __init__(
        self,
        built: BuiltProblem,
        bound: Solution,
        rebuild: Rebuild,
        method: SearchMethod,
        time_limit: float,
        ceiling: float,
    ) -> None:
        self.built, self.bound, self.rebuild = built, bound, rebuild
        self.method, self.time_limit, self.ceiling = method, time_limit, ceiling
        self.options = dataclasses.replace(built.options, cp_layout="contiguous")
        self.reach = bound.lower_bound * (1 + TIE)  # B's optimum when proven, else its proven bound
        self.ring = ring_variable(built)
        self.best: _Found | None = None
        self.proven: tuple[BuiltProblem, Solution] | None = None  # C and its optimum, proven: (F2) holds
        self.prices: list[str] = []
        self.error: AutoshardError | BoundExceeded | None = None

    def _solve(self, problem: SearchProblem, top: float, incumbent: Solution | None = None) -> Solution:
        """``problem`` solved below ``top``, hinted by B's dominance removals on the nodes with B's
        strategies (the solver checks each one on ``problem``; a zigzag problem's gathers may differ), by
        B's budget multiplier (probed first: every layout holds B's bytes, F3, so the budget binds alike)
        and by ``incumbent`` (the bound's plan priced there: where the sweep starts).  Its first reduction
        applies only B's removals that hold on ``problem`` (``dominance_search=False``; the solver searches
        after all where they leave a wide table): B's search already ran on the same nodes and strategies,
        so a second one mostly rediscovers them (LLaMA-3-70B's masked bound 0.17 -> 0.11 s CPU).  Hints
        change only the work, never the answer (:func:`~autoshard.search.solve`)."""
        return solve(
            problem,
            method=self.method,
            time_limit=self.time_limit,
            ceiling=min(self.ceiling, top),
            dominated=self._hint(problem),
            multiplier=self.bound.multiplier,
            incumbent=None if incumbent is None else incumbent.choice,
            dominance_search=False,
        )

    def _hint(self, problem: SearchProblem) -> Certificates:
        """B's dominance removals on the nodes with B's strategies (the solver checks each on ``problem``)."""
        sizes = self.built.problem.sizes
        return tuple(
            c for c in self.bound.dominated if c[0] < len(sizes) and problem.sizes[c[0]] == sizes[c[0]]
        )

    def _fail(self, label: str, cluster: Cluster, error: AutoshardError | BoundExceeded) -> None:
        self.error = error
        self.prices.append(f"{label}: {_why_not(self.built, self.bound, cluster, error)}")

    def contiguous(self) -> None:
        cluster = self.built.cluster
        try:
            free, cand = self.rebuild(cluster, self.options)
            priced = _bound_plan(self.built, self.bound, cand)
            found = priced
            if found is None or found.objective > self.reach:
                found = self._solve(cand.problem, math.inf, priced)
        except (AutoshardError, BoundExceeded) as e:
            self._fail("contiguous", cluster, e)
            return
        self.prices.append(f"contiguous {found.objective:.4g} s")
        self.best = _Found(found.objective, free, cand, found)
        if found.optimal and self.ring is not None:
            self.proven = (cand, found)

    def zigzag(self, a: int) -> None:
        label, cluster = f"zigzag on axis {a}", zigzag_cluster(self.built.cluster, a)
        top = self._top()
        held = self.proven is not None  # (F2), under a budget too (F3)
        if held and self._bounded((a,), label, top):
            return
        try:
            free, cand = self.rebuild(cluster, self.options)
        except AutoshardError as e:
            self._fail(label, cluster, e)
            return
        found = priced = _bound_plan(self.built, self.bound, cand)
        if found is None or found.objective > self.reach or found.objective >= top:
            try:
                problem = cand.problem
                if held:  # (F2): only a plan that rings on a can be strictly better
                    problem = dataclasses.replace(
                        problem, allowed=zigzag_masks(self.built, (a,), self.ring, problem)
                    )
                found = self._solve(problem, top, priced)
            except BoundExceeded as e:
                if top >= self.ceiling:
                    self._fail(label, cluster, e)
                else:
                    self.prices.append(f"{label} above {top:.4g} s")
                return
            except AutoshardError as e:  # infeasible under this layout (a pin on a one-run op)
                self._fail(label, cluster, e)
                return
        ringing = f" (ring on axis {a})" if held else ""
        self.prices.append(f"{label} {found.objective:.4g} s{ringing}")
        if found.objective < top:
            self.best = _Found(found.objective, free, cand, found)

    def _top(self) -> float:
        """A later layout must be strictly below this (the tie rule)."""
        return math.inf if self.best is None else self.best.cost * (1 - TIE)

    def bounded(self, axes: tuple[int, ...]) -> bool:
        """Whether every layout zigzag on one of ``axes`` is skipped by one lower bound (:meth:`_bounded`)."""
        label = f"zigzag on axes {', '.join(map(str, axes))}"
        return self.proven is not None and self._bounded(axes, label, self._top())

    def _bounded(self, axes: tuple[int, ...], label: str, top: float) -> bool:
        """Whether B's optimum over the plans a zigzag on one of ``axes`` could win with (its refusals masked,
        the ring variable held to rings on that axis: module doc), under B's budget, is at or above ``top``
        (then noted).  Solved with ``top`` as its ceiling: a Lagrangian bound that reaches it (B's
        multiplier, probed first) ends the solve."""
        masks = zigzag_masks(self.built, axes, self.ring, self.built.problem)
        inside = all(m is None or bool(m[k]) for m, k in zip(masks, self.bound.choice, strict=True))
        if inside and self.bound.objective < top:
            return False  # the bound's own plan is one of them, below the best
        why = "no plan rings there"
        try:  # an empty mask (a pin on a refused strategy) is refused as the problem is made
            problem = dataclasses.replace(self.built.problem, allowed=masks)
            why = "no plan that rings there fits the memory budget or has a finite price"
            lower = self._solve(problem, top).lower_bound
        except BoundExceeded as e:
            lower = e.bound
        except (InfeasibleError, AnnotationError):
            lower = math.inf  # no such plan at all (that fits: F3)
        except AutoshardError:
            return False
        if lower < top:
            return False
        if math.isfinite(lower):
            self.prices.append(f"{label} at least {lower:.4g} s")
        else:
            cluster = zigzag_cluster(self.built.cluster, axes[0])
            error = InfeasibleError(why)
            why = _why_not(self.built, self.bound, cluster, error) if len(axes) == 1 else str(error)
            self.prices.append(f"{label}: {why}")
        return True

    def result(self, axis: int) -> tuple[BuiltProblem, BuiltProblem, Solution]:
        if self.best is None:
            assert self.error is not None
            cluster = zigzag_cluster(self.built.cluster, axis)
            if self.built.options.cp_layout == "zigzag" and _blockers(self.built, self.bound, axis):
                why = _why_not(self.built, self.bound, cluster, self.error)
                raise ShardingError(f"cp_layout='zigzag' cannot be emitted: {why}; use cp_layout='auto' or "
                                    "'contiguous'")  # fmt: skip
            raise self.error
        best = self.best
        note = (
            f"context-parallel layout searched: {'; '.join(self.prices)} "
            f"(balanced bound {self.bound.objective:.4g} s; each the solver's linear objective, not the "
            "reported critical-path step)"
        )
        if _unproven_mask(best.built, best.solution):  # C = B: no triangle, so no causal imbalance to price
            note += "; its attention reads an explicit mask not proven causal: priced as the full square"
        noted = dataclasses.replace(best.built, notes=(*best.built.notes, note))
        # without pins the unpinned problem stays the same object: ranked() then re-solves nothing for its price
        return noted if best.free is best.built else best.free, noted, best.solution


def _bound_plan(built: BuiltProblem, bound: Solution, cand: BuiltProblem) -> Solution | None:
    """The bound's plan as a solution of ``cand`` (its price there, no solve), or None where ``cand`` lacks one
    of its strategies or its memory budget refuses it."""
    if cand.variables != built.variables:
        return None
    choice = []
    for name, strategy in _chosen(built, bound).items():
        options = cand.strategies[name]
        if strategy not in options:
            return None
        choice.append(options.index(strategy))
    full = cand.full_choice(choice)
    if len(full) != cand.problem.num_nodes:
        return None
    cost = evaluate(cand.problem, full)
    limit = cand.problem.memory_limit
    if not math.isfinite(cost) or (limit is not None and memory_of(cand.problem, full) > limit):
        return None
    gap = relative_gap(cost, bound.lower_bound)
    # B's dominance removals travel on as hints (the recompute-count search and the ranking reduce with them;
    # a hint is re-checked on the problem that receives it, search/reduce.py)
    return dataclasses.replace(bound, choice=full, objective=cost, gap=gap, log=())


def _chosen(built: BuiltProblem, solution: Solution) -> dict[str, OpStrategy]:
    return {
        name: built.strategies[name][k]
        for name, k in zip(built.variables, solution.choice[: len(built.variables)], strict=True)
    }


def _unproven_mask(built: BuiltProblem, solution: Solution) -> bool:
    """Whether a ringing attention of the plan reads an explicit mask that capture did not prove causal."""
    mesh = tuple(built.cluster.mesh_shape)
    return any(
        len(info.inputs) > 3 and not info.causal_mask and (r := ring_axis_of(built.infos, info, s)) is not None
        and mesh[r] > 1
        for info, s in ((built.infos[name], s) for name, s in _chosen(built, solution).items())
    )  # fmt: skip


def _ring_axis(built: BuiltProblem, solution: Solution) -> int | None:
    return ring_axis_of_plan(built.infos, _chosen(built, solution), tuple(built.cluster.mesh_shape))


def _blockers(built: BuiltProblem, solution: Solution, axis: int) -> str:
    return ", ".join(one_run_ops(built.infos, _chosen(built, solution), axis)[:3])


def _why_not(built: BuiltProblem, bound: Solution, cluster: Cluster, error: Exception) -> str:
    """Why a layout's problem has no plan: the bound's ops that need one run of the sequence, or the error."""
    axis = zigzag_axis_of(cluster)
    blockers = _blockers(built, bound, axis) if axis is not None else ""
    if blockers:
        return (
            f"{blockers} split on mesh axis {axis} need one run of the sequence per device, zigzag holds two"
        )
    return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
