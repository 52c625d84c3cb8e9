"""What one solve has found so far, and how it finishes: the state the dispatcher (:mod:`.solve`) threads
through reductions, exact solves, the Lagrangian paths and CP-SAT.

Input: the original :class:`~autoshard.search.problem.SearchProblem` and the reductions applied to it.
Output: a :class:`~autoshard.search.problem.Solution` on the original nodes (:meth:`Run.finish`), with the
objective re-evaluated there and the lower bound never above it.  Also here: :class:`BoundExceeded` (the
mesh search's pruning signal), the CP-SAT call with its warm start and fallback, and the error that names
where no finite plan exists.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from autoshard.errors import InfeasibleError
from autoshard.search.exact import ExactSolver, FactorCapExceeded
from autoshard.search.problem import SearchProblem, Solution, evaluate, memory_of, pairwise_form, relative_gap
from autoshard.search.propagate import propagate
from autoshard.search.reduce import Reduction

__all__ = [
    "BoundExceeded",
    "Run",
    "carry",
    "exact_label",
    "exact_solver",
    "propagated",
    "run_ilp",
    "trivial_lower_bound",
]


class BoundExceeded(Exception):
    """Raised by :func:`solve` given a ``ceiling``: a proven lower bound on the optimum is at least it, so no
    plan of this problem beats the caller's best (mesh search prunes the candidate)."""

    def __init__(self, bound: float, ceiling: float) -> None:
        super().__init__(f"lower bound {bound:.6g} >= ceiling {ceiling:.6g}")
        self.bound = bound
        self.ceiling = ceiling


@dataclass(slots=True)
class Run:
    """What one call of :func:`solve` has found so far.

    ``stages`` are the reductions applied so far, outermost first: a choice on the last stage's problem
    expands through all of them to the original nodes.
    """

    problem: SearchProblem
    stages: list[Reduction]
    start: float
    time_limit: float
    log: list[str] = field(default_factory=list)
    ceiling: float = math.inf  # BoundExceeded once the optimum is proven to be at least this

    def prune(self, bound: float) -> None:
        """Raise :class:`BoundExceeded` when ``bound`` (on the original objective) reaches the ceiling."""
        if bound >= self.ceiling:
            raise BoundExceeded(bound, self.ceiling)

    def start_plan(self, least: tuple[int, ...], incumbent: Sequence[int] | None) -> tuple[int, ...]:
        """The fitting plan the sweep starts from: ``incumbent`` (a similar problem's optimum, original nodes)
        when it fits and costs less than the least-memory plan, whose falling line is usually far off."""
        if incumbent is None or len(incumbent) != self.problem.num_nodes:
            return least
        plan = tuple(int(s) for s in incumbent)
        limit = self.problem.memory_limit
        if limit is None or memory_of(self.problem, plan) > limit:
            return least
        return plan if evaluate(self.problem, plan) < evaluate(self.problem, least) else least

    @property
    def current(self) -> SearchProblem:
        """The problem the solvers work on now (the last stage's)."""
        return self.stages[-1].problem

    def offset(self) -> float:
        """Original objective minus the current problem's objective, for any choice."""
        return math.fsum(r.cost_offset for r in self.stages)

    def expand(self, choice: Sequence[int]) -> tuple[int, ...]:
        """A choice on the current problem as a choice on the original one."""
        out = tuple(choice)
        for red in reversed(self.stages):
            out = red.expand(out)
        return out

    def restrict(self, choice: Sequence[int]) -> list[int | None]:
        """An original choice on the current problem (None where a reduction removed its strategy)."""
        out: list[int | None] = list(choice)
        for red in self.stages:
            out = red.restrict(out)
        return out

    def carry(self, choice: Sequence[int]) -> list[int | None]:
        """An original plan on the current problem, each dominated strategy replaced by its dominator
        (:func:`carry`): no dearer, no more memory; None where a reduction removed a strategy otherwise
        (a fixing mask)."""
        out: list[int | None] = list(choice)
        for red in self.stages:
            out = carry(red, out)
        return out

    def left(self) -> float:
        return self.time_limit - (time.perf_counter() - self.start)

    def finish(self, reduced_choice: Sequence[int], bound: float, optimal: bool, method: str) -> Solution:
        """Expand a current-problem choice; ``bound`` is a lower bound on the *original* objective."""
        return self.finish_original(self.expand(reduced_choice), bound, optimal, method)

    def finish_original(self, choice: tuple[int, ...], bound: float, optimal: bool, method: str) -> Solution:
        objective = evaluate(self.problem, choice)
        if not math.isfinite(objective):
            raise _no_finite_plan(self.problem, choice)
        limit = self.problem.memory_limit
        assert limit is None or memory_of(self.problem, choice) <= limit * (1 + 1e-12), (
            "plan breaks the budget"
        )
        bound = objective if optimal else min(bound, objective)
        return Solution(
            choice=choice,
            objective=objective,
            lower_bound=bound,
            gap=relative_gap(objective, bound),
            optimal=optimal,
            method=method,
            seconds=time.perf_counter() - self.start,
            log=tuple(self.log),
            dominated=self.stages[0].dominated if self.stages else (),
        )


def carry(red: Reduction, choice: Sequence[int | None]) -> list[int | None]:
    """``red.restrict(choice)`` with each strategy that dominance removed replaced by its dominator
    (followed until one stays): a plan of the reduced problem that costs no more and holds no more memory.

    Why: a removal ``s -> t`` at node ``v`` held whatever its neighbours chose among the strategies
    left at that moment (``D[s, t] >= 0``, ``mem[t] <= mem[s]``); replacing in the order removed, every
    neighbour is then among those, and a folded node keeps its best response (no more than before).
    The Lagrangian sweep starts from a similar problem's optimum carried so (the rank's lower-bound
    solve on LLaMA-3-70B: 4 -> 3 exact probes, where that optimum lost strategies to dominance and
    the sweep started from the least-memory plan)."""
    by: dict[int, dict[int, int]] = {}
    for v, s, t in red.dominated:
        moves = by.setdefault(v, {})
        for a, b in zip(s.tolist(), t.tolist(), strict=True):
            moves.setdefault(a, b)
    out: list[int | None] = list(choice)
    for v, moves in by.items():
        x = out[v]
        while x is not None and x in moves:
            x = moves[x]
        out[v] = x
    return red.restrict(out)


def _no_finite_plan(problem: SearchProblem, choice: Sequence[int]) -> InfeasibleError:
    """Name where even the optimum breaks (arc consistency passed, so the cause is a cycle of constraints).

    Every plan of an infeasible component costs ``inf``, the optimum included; its ``inf`` edges show where.
    """
    parent = list(range(problem.num_nodes))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for e in problem.edges:
        parent[find(e.u)] = find(e.v)
    broken = [e for e in problem.edges if not math.isfinite(float(e.cost[choice[e.u], choice[e.v]]))]
    bad = {find(e.u) for e in broken}
    names = [problem.names[i] for i in range(problem.num_nodes) if find(i) in bad]
    shown = ", ".join(names[:12]) + (f" and {len(names) - 12} more" if len(names) > 12 else "")
    where = ", ".join(f"{problem.names[e.u]} -> {problem.names[e.v]}" for e in broken[:6])
    return InfeasibleError(
        f"no finite-cost plan exists for the nodes {shown}: every combination of their strategies includes "
        f"an impossible conversion or a non-dividing shard (the cheapest plan still breaks at {where}). Fix: "
        "a mesh whose axis sizes divide these tensors' dims, or strategies that allow replication."
    )


def exact_label(ex: ExactSolver) -> str:
    return "exact:reduce" if ex.method == "none" else f"exact:{ex.method}"


def exact_solver(
    run: Run, max_factor_size: float, wide: Callable[[], object] | None = None
) -> ExactSolver | None:
    try:
        return ExactSolver(pairwise_form(run.current), max_factor_size, wide)
    except FactorCapExceeded as e:
        run.log.append(f"exact: {e}; treewidth too high, using CP-SAT")
        return None


def _fits(problem: SearchProblem, choice: Sequence[int]) -> bool:
    ok = math.isfinite(evaluate(problem, choice))
    return ok and (problem.memory_limit is None or memory_of(problem, choice) <= problem.memory_limit)


def run_ilp(
    run: Run,
    hint: Sequence[int | None] | None,
    num_workers: int,
    floor: float = -math.inf,
    fallback: tuple[int, ...] | None = None,
) -> Solution:
    """CP-SAT on the current problem.  ``floor`` is a lower bound on the current objective known already;
    ``fallback`` a fitting plan on the original nodes, returned if CP-SAT finds nothing better."""
    from autoshard.search.ilp import solve_ilp  # lazy: ortools pulls in pandas (~0.5 s of import)

    rp = run.current
    if hint is None or all(h is None for h in hint):
        hint = propagate(rp)
        run.log.append("hint: propagation plan")
    res = solve_ilp(rp, time_limit=max(0.01, run.left()), num_workers=num_workers, hint=hint)
    run.log.extend(res.log)
    bound = max(res.lower_bound, floor) + run.offset()
    full_hint = [h for h in hint if h is not None]
    if fallback is None and len(full_hint) == rp.num_nodes and _fits(rp, full_hint):
        fallback = run.expand(full_hint)
    if res.choice is not None:
        found = run.expand(res.choice)
        if fallback is None or evaluate(run.problem, found) <= evaluate(run.problem, fallback):
            return run.finish_original(found, bound, res.optimal, "cp-sat")
    if fallback is not None:
        # When CP-SAT proved its plan optimal (to its integer resolution), one at least as cheap is too.
        run.log.append(f"cp-sat ({res.status}) did not beat the warm start; returning the warm start")
        return run.finish_original(fallback, bound, res.optimal, "warm-start")
    raise InfeasibleError(
        f"CP-SAT found no plan within the time limit ({run.time_limit:.0f} s) and did not prove "
        "infeasibility either. Fix: raise time_limit, or the memory limit."
    )


def trivial_lower_bound(problem: SearchProblem) -> float:
    """Every node and every edge at its own cheapest allowed entry: a valid bound, usually loose."""
    form = pairwise_form(problem)
    return math.fsum(float(u.min()) for u in form.unary) + math.fsum(
        float(f.min()) for f in form.pairs.values()
    )


def propagated(problem: SearchProblem, start: float) -> Solution | None:
    """The propagation plan as a Solution, or None when it is not a valid plan (inf or over budget)."""
    choice = propagate(problem)
    objective = evaluate(problem, choice)
    limit = problem.memory_limit
    if not math.isfinite(objective) or (limit is not None and memory_of(problem, choice) > limit):
        return None
    log = ["propagate: greedy breadth-first plan from the annotations; bound: cheapest entry per term"]
    return Run(problem, [], start, math.inf, log=log).finish_original(
        choice, trivial_lower_bound(problem), False, "propagate"
    )
