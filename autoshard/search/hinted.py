"""A similar problem's Lagrange multiplier probed first under a ceiling: the budgeted solve's early stop.

Input: a budgeted :class:`~autoshard.search.problem.SearchProblem` (or the :class:`~autoshard.search.run.Run`
and :class:`~autoshard.search.exact.ExactSolver` of its reduction), a multiplier ``lam`` (a similar problem's
:attr:`~autoshard.search.problem.Solution.multiplier`) and a ceiling (the caller's best).  Output: nothing,
or :class:`~autoshard.search.run.BoundExceeded` once the Lagrangian bound at ``lam`` reaches the ceiling.

The bound: for ``lam >= 0`` every plan ``x`` that fits (``memory(x) <= L``) costs at least
``cost(x) + lam * memory(x) - lam * L``, whose least value over *all* plans is one solve without the budget.
That problem, ``cost + lam * memory``, has no memory terms, so it folds and reduces as an unbudgeted one
does.  Two places, one per budgeted path of :func:`~autoshard.search.solve.solve`:

* exact (the budgeted problem eliminates): :func:`probe_first` on its solver, then once more on the side
  where the bound rises; the sweep reuses both solves;
* wide (no elimination order fits the cap as it is: memory keeps nodes from folding, LLaMA-3-70B's zigzag
  layout Z_2 on 16 x 8 x 8): :func:`probe_hint` on the problem without the budget, reduced on its own
  (:class:`Probe`, called by the elimination planner before its conditioning search, the costly part of
  finding out), before the second reduction, the conditioning and the wide path's cutting planes.  Z_2:
  bound 12.07 >= 11.758 (C's optimum), pruned after one relaxed solve (~0.2 s CPU).

Exact: the bound holds for every fitting plan, so only whether (and how soon) BoundExceeded comes depends on
the hint, never a plan or bound returned.  When no plan fits the bound is vacuous and BoundExceeded (not
InfeasibleError) is the answer; the callers drop both alike.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from autoshard.errors import InfeasibleError
from autoshard.search.exact import ExactSolver, FactorCapExceeded
from autoshard.search.problem import memory_of, pairwise_form
from autoshard.search.reduce import Certificates, Reduction, reduce_problem
from autoshard.search.run import Run

__all__ = ["Probe", "on_reduced", "probe_first", "probe_hint"]

#: Factor from the probed multiplier to the second probe (:func:`probe_first`) when the first did not reach
#: the ceiling: ``g`` is concave with supergradient ``memory(x) - L`` at the minimiser ``x``, so a minimiser
#: that fits says the maximum lies at a smaller multiplier (x 1/4), one over the budget at a larger (x 4), the
#: step :func:`~autoshard.search.budget.dual_search` grows by.  LLaMA-3-70B on 16 x 8 x 8: full
#: recomputation's interval of the per-block search at selective's multiplier bounds 11.40 < 12.1359 (the
#: ceiling), at a quarter of it 12.39: pruned after two solves instead of three (the optimum without the
#: budget, then the sweep's first probe) and the least-memory plan (0.27 -> 0.22 s CPU).
_TOWARD = 0.25


def _usable(lam: float | None, ceiling: float) -> bool:
    return lam is not None and 0.0 < lam < math.inf and math.isfinite(ceiling)


def probe_hint(
    run: Run,
    lam: float | None,
    dominated: Certificates = (),
    search: bool = True,
    max_factor: float = math.inf,
) -> bool | None:
    """Raise :class:`~autoshard.search.run.BoundExceeded` when the Lagrangian bound at ``lam`` of the budget of
    ``run``'s current problem (its first reduction) reaches the run's ceiling (module doc): ``cost + lam *
    memory`` without the budget, reduced again with ``dominated`` (:func:`on_reduced`) and ``search`` as
    the caller's own reduction, and eliminated.  Else whether that solve's minimiser fits (the side of the
    dual's maximum: :func:`probe_first`), None when nothing was probed (no hint, no ceiling, no budget, or
    even the relaxed problem is too wide or has no finite plan).

    The current problem's relaxed optimum, plus the reduction's offsets, is the original's: dominance under
    a budget removed only strategies no dearer and no lighter (so no dearer for any ``lam >= 0``), folding
    only memory-free nodes.  Relaxing the reduced problem rather than the original spares what the first
    reduction did already (LLaMA-3-70B's Z_2: 0.16 -> 0.09 s CPU, the same bound)."""
    rp = run.current
    limit, memory = rp.memory_limit, rp.memory
    if not _usable(lam, run.ceiling) or limit is None or memory is None:
        return None
    assert lam is not None
    costs = tuple(c + lam * m for c, m in zip(rp.node_costs, memory, strict=True))
    free = dataclasses.replace(rp, node_costs=costs, memory=None, memory_limit=None, peak=None)
    hint = on_reduced(run.stages[0], dominated) if len(run.stages) == 1 else ()
    try:
        red = reduce_problem(free, hint=hint, search=search)
        plan, value = ExactSolver(pairwise_form(red.problem), max_factor).solve()
    except (InfeasibleError, FactorCapExceeded):  # the budgeted path says so, or solves it otherwise
        return None
    run.prune(value + red.cost_offset - lam * limit + run.offset())
    return memory_of(rp, red.expand(plan)) <= limit


def on_reduced(red: Reduction, hint: Certificates) -> Certificates:
    """``hint`` (removals on ``red``'s original problem) on ``red.problem``'s nodes and strategies: those
    whose node and both strategies are still there (the reduction checks each one again)."""
    where = {v: k for k, v in enumerate(red.kept)}
    out = []
    for v, s, t in hint:
        k = where.get(v)
        if k is None:
            continue
        dom = red.domains[v]
        ls, lt = np.searchsorted(dom, s), np.searchsorted(dom, t)
        ok = (ls < dom.size) & (lt < dom.size)
        ok[ok] &= (dom[ls[ok]] == s[ok]) & (dom[lt[ok]] == t[ok])
        if ok.any():
            out.append((k, ls[ok], lt[ok]))
    return tuple(out)


@dataclass(slots=True)
class Probe:
    """:func:`probe_hint` made once, when first called: the ``wide`` hook of
    :class:`~autoshard.search.exact.ExactSolver` (a budgeted problem no elimination order fits as it is),
    on the current problem of ``run`` (updated by the caller when it reduces again).  ``fits``: its answer,
    for :func:`probe_first` not to probe the same multiplier again."""

    run: Run
    lam: float | None
    dominated: Certificates
    search: bool
    max_factor: float
    fits: bool | None = None
    done: bool = False

    def __call__(self) -> None:
        if not self.done:
            self.done = True
            self.fits = probe_hint(self.run, self.lam, self.dominated, self.search, self.max_factor)


def probe_first(
    run: Run, ex: ExactSolver, lam: float, fits: bool | None = None
) -> dict[float, tuple[tuple[int, ...], float]]:
    """With a ceiling, the Lagrangian bound at a similar problem's multiplier before anything else: one exact
    solve of ``cost + lam * memory`` that, when its bound reaches the ceiling, spares the optimum without the
    budget, the least-memory plan and the sweep (the per-block recomputation search's intervals: one solve
    each); short of it, a second probe on the side where the bound rises (:data:`_TOWARD`).  ``fits``: that
    first probe made already (:func:`probe_hint`: whether its minimiser fits), so only the second is made
    here.  The bound holds for every fitting plan; when none fits it is vacuous, and BoundExceeded (not
    InfeasibleError) is the answer.  Returns the solves made here by multiplier, for the sweep not to
    repeat them."""
    rp = run.current
    if not _usable(lam, run.ceiling) or rp.memory is None:
        return {}
    assert rp.memory_limit is not None
    known: dict[float, tuple[tuple[int, ...], float]] = {}
    if fits is not None:
        lam *= _TOWARD if fits else 1.0 / _TOWARD
    for _ in range(1 if fits is not None else 2):
        plan, value = ex.solve([c + lam * m for c, m in zip(ex.form.unary, rp.memory, strict=True)])
        known[lam] = (plan, value)
        run.prune(value - lam * rp.memory_limit + run.offset())
        lam *= _TOWARD if memory_of(rp, plan) <= rp.memory_limit else 1.0 / _TOWARD
    return known
