"""The steps ``autoshard.plan`` runs on one capture: build (priced, then pinned), read a solution back as a
:class:`~autoshard.plans.Plan`, the unpinned price, and the checks around them (:mod:`autoshard.planner` drives
them; the pipeline search calls :func:`build` once per stage sub-mesh)."""

from __future__ import annotations

import contextlib
import dataclasses
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from typing import Any, Literal

import torch

from autoshard.annotations import pin_problem
from autoshard.capture import Captured
from autoshard.cluster import Cluster
from autoshard.errors import AutoshardError, InfeasibleError, PipelineError
from autoshard.planner_rerank import rank_plan
from autoshard.plans import Plan
from autoshard.problem.build import BuiltProblem, build_problem
from autoshard.problem.costs import CostOptions, Recompute, StepCache
from autoshard.problem.extract import extract_plan
from autoshard.search import Solution, solve
from autoshard.strategies import UnsupportedOpWarning
from autoshard.strategies.coverage import replicated_shares

__all__ = [
    "DeferredPrices",
    "Pruned",
    "SearchMethod",
    "batch_size",
    "budget_idle",
    "build",
    "cheaper",
    "deferred_prices",
    "global_shapes",
    "output_order",
    "ranked",
    "reader",
    "recompute_note",
    "solve_built",
    "unpinned",
    "warn_replicated",
]

SearchMethod = Literal["auto", "exact", "ilp", "propagate"]


def reader(
    model: torch.nn.Module,
    captured: Captured,
    timings: dict[str, float],
    notes: list[str],
    limit: float,
    recompute_note: tuple[str, ...],
) -> Callable[[BuiltProblem, Solution], Plan]:
    def read(problem: BuiltProblem, chosen: Solution) -> Plan:
        return extract_plan(
            problem,
            chosen,
            model=type(model).__name__,
            block_prefix=captured.blocks.prefix if captured.blocks else None,
            block_first=captured.blocks.first if captured.blocks else 0,
            output_order=output_order(captured),
            timings=dict(timings),
            notes=tuple(notes) + recompute_note,
            memory_limit=limit if limit != float("inf") else None,
        )

    return read


def budget_idle(built: BuiltProblem, solution: Solution, search: SearchMethod, time_limit: float) -> bool:
    """Whether the memory budget leaves the optimum unchanged (then no recomputation can beat it)."""
    if built.problem.memory_limit is None or solution.budget_binding is False:
        return True
    free = solve(dataclasses.replace(built.problem, memory_limit=None), method=search, time_limit=time_limit)
    return solution.optimal and free.optimal and solution.objective <= free.objective * (1 + 1e-12)


def recompute_note(policy: Recompute, asked: str) -> tuple[str, ...]:
    if policy is Recompute.NONE or asked != "auto":
        return ()
    return (
        f"activations do not fit without recomputation: {policy.value} recomputation of the repeated blocks "
        "(the fastest plan that fits; none, selective and full searched)",
    )


def batch_size(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> int:
    for x in (*args, *kwargs.values()):
        if isinstance(x, torch.Tensor) and x.dim() > 0:
            return int(x.shape[0])
    raise PipelineError(
        "microbatches and pipeline stages split the batch: give a tensor input whose dim 0 is it"
    )


def global_shapes(plan: Plan, args: tuple[Any, ...], batch: int) -> dict[str, tuple[tuple[int, ...], str]]:
    """The plan's input shapes at the global batch (it was captured at one microbatch's)."""
    return {
        name: (((batch, *shape[1:]) if shape else shape), dtype)
        for name, (shape, dtype) in plan.input_shapes.items()
    }


def build(
    captured: Captured,
    cluster: Cluster,
    opts: CostOptions,
    annotations: Mapping[str, Any] | None,
    limit: float,
    timings: dict[str, float],
    kinds: frozenset[str] = frozenset(),
    cache: StepCache | None = None,
) -> tuple[BuiltProblem, BuiltProblem]:
    """The problem as priced, and the same with the user's pins folded in (the same object without pins).

    Every build of ``captured`` on ``cluster`` reuses the first one's strategies, redistribution tables and
    per-strategy figures (:mod:`autoshard.problem.shared`): the planner's builds per recomputation policy and
    share, the layout search's and the pipeline search's per stage policy price only what the options change.
    ``timings["strategies_and_costs"]`` adds up every build it times.  ``cache``: redistribution times already
    priced on ``cluster`` (the pipeline search keeps one per sub-mesh)."""
    t0 = time.perf_counter()
    budget = limit if limit != float("inf") else None
    built = build_problem(captured, cluster, opts, memory_limit=budget, cache=cache)
    timings["strategies_and_costs"] = timings.get("strategies_and_costs", 0.0) + time.perf_counter() - t0
    if not (annotations or kinds):
        return built, built
    prefix = captured.blocks.prefix if captured.blocks else None
    first = captured.blocks.first if captured.blocks else 0
    return built, pin_problem(built, annotations, kinds, prefix, first)


def unpinned(
    built: BuiltProblem,
    search: SearchMethod,
    time_limit: float,
    read: Callable[[BuiltProblem, Solution], Plan],
    pinned: Plan | None = None,
) -> float | None:
    """The predicted step time of the best plan without the user's pins (``None`` when none fits), ranked by
    that step (:mod:`autoshard.planner_rerank`); the ``pinned`` plan is one of the unpinned plans too."""
    try:
        solution = solve(built.problem, method=search, time_limit=time_limit)
    except InfeasibleError:
        return None
    others = (("pinned plan", pinned),) if pinned is not None else ()
    free = rank_plan(
        read(built, solution), built, solution, read, method=search, time_limit=time_limit, others=others
    )
    return free.predicted_step_time


def pin_names(annotations: Mapping[str, Any] | None, kinds: frozenset[str]) -> tuple[str, ...]:
    """What a plan was pinned by (``Plan.pinned``), for the report's price line: ``("annotations", "no tp")``."""
    return ("annotations",) * bool(annotations) + tuple(f"no {k}" for k in sorted(kinds))


def ranked(
    found: Plan,
    free: BuiltProblem,
    built: BuiltProblem,
    solution: Solution,
    read: Callable[[BuiltProblem, Solution], Plan],
    search: SearchMethod,
    time_limit: float,
    annotations: Mapping[str, Any] | None = None,
    kinds: frozenset[str] = frozenset(),
) -> Plan:
    """The plan ranked by its reported step (:mod:`autoshard.planner_rerank`), with the unpinned price when
    ``built`` carries pins (``free`` is the same problem without them: ``annotations`` and forbidden
    ``kinds`` applied), and what they were (``Plan.pinned``)."""
    plan = rank_plan(found, built, solution, read, method=search, time_limit=time_limit)
    plan = dataclasses.replace(plan, pinned=pin_names(annotations, kinds))
    if built is free:
        return dataclasses.replace(plan, unpinned_step_time=None)
    later = _DEFERRED.get()
    if later is not None:  # the mesh search prices its winner only
        return later.hold(plan, lambda: unpinned(free, search, time_limit, read, plan))
    return dataclasses.replace(plan, unpinned_step_time=unpinned(free, search, time_limit, read, plan))


class DeferredPrices:
    """Unpinned prices (a solve of the problem without the pins, then its ranking) held back until asked.

    The mesh search plans every candidate mesh, but only the winner's price is shown ("price of your
    annotations"); each candidate's is an exact solve of a wider problem (on LLaMA-3-8B ``--forbid tp`` on
    2x2x2 the dearest step of that mesh).  Inside :func:`deferred_prices` a pinned plan leaves
    :func:`ranked` without its price; :meth:`price` computes it for the plan given, exactly as
    :func:`ranked` would have.  Plans are matched by their node records (kept through the later
    ``dataclasses.replace`` of timings, notes and degrees)."""

    def __init__(self) -> None:
        self._held: dict[int, tuple[Plan, Callable[[], float | None]]] = {}

    def hold(self, plan: Plan, price: Callable[[], float | None]) -> Plan:
        self._held[id(plan.nodes)] = (plan, price)  # the plan is kept: its id stays unique
        return plan

    def keep_only(self, plan: Plan | None) -> None:
        """Drop every held price but ``plan``'s (the best so far): the others' problems are freed."""
        key = None if plan is None else id(plan.nodes)
        self._held = {k: v for k, v in self._held.items() if k == key}

    def price(self, plan: Plan) -> Plan:
        """``plan`` with its unpinned price; unchanged when none was held (no pins, or never ranked: a
        pipelined plan carries no unpinned price either way)."""
        held = self._held.get(id(plan.nodes))
        if held is None or held[0].nodes is not plan.nodes:
            return plan
        return dataclasses.replace(plan, unpinned_step_time=held[1]())


_DEFERRED: ContextVar[DeferredPrices | None] = ContextVar("deferred unpinned prices", default=None)


@contextlib.contextmanager
def deferred_prices() -> Iterator[DeferredPrices]:
    """Within: pinned plans are ranked without their unpinned price (:class:`DeferredPrices`)."""
    later = DeferredPrices()
    token = _DEFERRED.set(later)
    try:
        yield later
    finally:
        _DEFERRED.reset(token)


def warn_replicated(captured: Captured) -> dict[str, float]:
    """Ops without a rule run replicated on every device: warn once with their share of the step's FLOPs."""
    shares = replicated_shares(captured)
    if shares:
        total = sum(shares.values())
        ops = ", ".join(f"{op} ({share:.1%})" for op, share in sorted(shares.items(), key=lambda kv: -kv[1]))
        warnings.warn(
            f"{total:.1%} of the step's forward FLOPs run replicated on every device: no sharding rule for "
            f"{ops}; data parallel replicates them too. Add rules in autoshard/strategies/rules/ "
            "(`autoshard ops MODEL` lists every op and its rule)",
            UnsupportedOpWarning,
            stacklevel=3,
        )
    return shares


def output_order(captured: Captured) -> tuple[str, ...]:
    out = next(n for n in captured.graph_module.graph.nodes if n.op == "output")
    return tuple(n.name for n in out.all_input_nodes)


def solve_built(built: BuiltProblem, method: SearchMethod = "auto", time_limit: float = 60.0) -> Solution:
    """Solve an already built problem (used by benchmarks that time stages separately)."""
    return solve(built.problem, method=method, time_limit=time_limit)


@dataclasses.dataclass(frozen=True)
class Pruned:
    """The op-by-op alternative stopped at a lower bound on its step that the fused plan beats."""

    bound: float


def cheaper(fused: Plan | AutoshardError, plain: Plan | AutoshardError | Pruned) -> Plan | AutoshardError:
    """The plan with the lower predicted step (the fused one on a tie), noting why; an error only if both are."""
    if isinstance(plain, AutoshardError):
        return fused
    if isinstance(plain, Pruned):
        assert isinstance(fused, Plan)
        note = (
            f"expert MLPs planned fused (op by op: at least {plain.bound:.4g} s per step, not solved further)"
        )
        return dataclasses.replace(fused, notes=(*fused.notes, note))
    if isinstance(fused, AutoshardError) or plain.predicted_step_time < fused.predicted_step_time:
        other = "not possible" if isinstance(fused, AutoshardError) else f"{fused.predicted_step_time:.4g} s"
        note = f"expert MLPs planned op by op (grouped matmuls): fused, {other} per step"
        return dataclasses.replace(plain, notes=(*plain.notes, note))
    note = f"expert MLPs planned fused (op by op: {plain.predicted_step_time:.4g} s per step)"
    return dataclasses.replace(fused, notes=(*fused.notes, note))
