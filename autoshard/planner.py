"""``autoshard.plan``: capture → strategies → costs → search → plan, each stage timed.

The order, and why:

1. capture the model once (repeated layers cut to two: planning cost stops growing with depth);
2. build the search problem: every node's strategies priced for compute, communication (forward and the
   backward implied by it) and memory per device on the given cluster;
3. pin what the user annotated;
4. solve exactly (dynamic programming / variable elimination); when a memory budget binds, CP-SAT under the
   budget, warm-started from the exact unconstrained plan; with ``search="propagate"``, BFS from the
   annotations only (milliseconds, no optimality claim);
5. when ``recompute="auto"`` and nothing fits the memory, retry with full activation recomputation;
6. read the plan back from the same cost functions, so its step time is the solver's objective.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import torch

from autoshard.annotations import forbidden_kinds, pin_problem
from autoshard.capture import Captured, capture
from autoshard.cluster import Cluster
from autoshard.errors import InfeasibleError
from autoshard.plans import Plan
from autoshard.problem.build import BuiltProblem, build_problem
from autoshard.problem.costs import CostOptions, Recompute
from autoshard.problem.extract import extract_plan
from autoshard.search import Solution, solve

__all__ = ["plan"]

SearchMethod = Literal["auto", "exact", "ilp", "propagate"]


def plan(
    model: torch.nn.Module,
    cluster: Cluster,
    example_args: tuple[Any, ...] | Any = (),
    example_kwargs: Mapping[str, Any] | None = None,
    *,
    annotations: Mapping[str, Any] | None = None,
    training: bool = True,
    memory_limit: float | None = None,
    recompute: Literal["auto", "none", "full"] = "auto",
    search: SearchMethod = "auto",
    time_limit: float = 60.0,
    blocks: Literal["auto", "full"] | None = "auto",
    progress: Callable[[str], None] | None = None,
    allow: Sequence[str] = (),
    forbid: Sequence[str] = (),
    captured: Captured | None = None,
) -> Plan:
    """Plan how ``model`` is split over ``cluster``.

    Args:
        model: any ``nn.Module``; parameters may live on the ``meta`` device (nothing is allocated).
        cluster: from :func:`autoshard.load_cluster`; its mesh sets the axes the plan uses.
        example_args / example_kwargs: inputs of one *global* step (the whole batch); meta tensors are fine.
        annotations: pins for a few modules or parameters (see :mod:`autoshard.annotations`).
        training: plan forward + backward + optimizer (``True``) or inference only.
        memory_limit: bytes per device; default the device's memory from the profile.  ``float("inf")``
            disables the budget.
        recompute: activation recomputation; ``"auto"`` keeps activations unless that cannot fit.
        search: ``"auto"`` (exact, CP-SAT under a binding budget), ``"exact"``, ``"ilp"`` or ``"propagate"``.
        time_limit: seconds for the solver; past it the best plan and its gap are reported.
        blocks: ``"auto"`` solves identical repeated layers once; ``None`` plans the full graph.
        progress: called with the name of each stage as it starts ("capture", "strategies", "solve",
            "recompute" when the plan is retried with activation recomputation).
        allow / forbid: kinds of parallelism (``"dp"``, ``"tp"``, ``"fsdp"``: :data:`autoshard.annotations.KINDS`)
            the plan may use only / must not use.  With annotations or kinds, the plan also records the step
            time of the unpinned optimum (``Plan.unpinned_step_time``: the price of the pins).
        captured: ``capture(model, example_args, example_kwargs, blocks=blocks)`` made earlier, to plan the same
            model twice (e.g. free and as pure data parallel) without capturing it again.

    Raises:
        CaptureError, AnnotationError, InfeasibleError, ShardingError: all :class:`AutoshardError`.
    """
    timings: dict[str, float] = {}
    start = time.perf_counter()
    say = progress or (lambda stage: None)
    say("capture")
    args = example_args if isinstance(example_args, tuple) else (example_args,)
    kinds = forbidden_kinds(allow, forbid)
    captured = captured or capture(model, args, dict(example_kwargs or {}), blocks=blocks)
    timings["capture"] = time.perf_counter() - start
    limit = float(cluster.device_memory) if memory_limit is None else float(memory_limit)
    policies = [Recompute.NONE, Recompute.FULL] if recompute == "auto" else [Recompute(recompute)]
    notes: list[str] = list(getattr(captured, "notes", ()) or ())
    error: InfeasibleError | None = None
    for policy in policies:
        opts = CostOptions(training=training, recompute=policy if training else Recompute.NONE)
        say("strategies" if policy is policies[0] else "recompute")
        free, built = _build(captured, cluster, opts, annotations, limit, timings, kinds)
        try:
            say("solve")
            t0 = time.perf_counter()
            solution = solve(built.problem, method=search, time_limit=time_limit)
            timings["solve"] = time.perf_counter() - t0
        except InfeasibleError as e:
            error = e
            continue
        if policy is Recompute.FULL and recompute == "auto":
            notes.append("activations do not fit without recomputation: planned with full recomputation")
        timings["total"] = time.perf_counter() - start

        def read(problem: BuiltProblem, chosen: Solution) -> Plan:
            return extract_plan(
                problem,
                chosen,
                model=type(model).__name__,
                block_prefix=captured.blocks.prefix if captured.blocks else None,
                output_order=_output_order(captured),
                timings=timings,
                notes=tuple(notes),
                memory_limit=limit if limit != float("inf") else None,
            )

        price = _unpinned(free, search, time_limit, read) if built is not free else None
        return dataclasses.replace(read(built, solution), unpinned_step_time=price)
    assert error is not None
    raise error


def _build(
    captured: Captured,
    cluster: Cluster,
    opts: CostOptions,
    annotations: Mapping[str, Any] | None,
    limit: float,
    timings: dict[str, float],
    kinds: frozenset[str] = frozenset(),
) -> tuple[BuiltProblem, BuiltProblem]:
    """The problem as priced, and the same with the user's pins folded in (the same object without pins)."""
    t0 = time.perf_counter()
    built = build_problem(captured, cluster, opts, memory_limit=limit if limit != float("inf") else None)
    timings["strategies_and_costs"] = time.perf_counter() - t0
    if not (annotations or kinds):
        return built, built
    prefix = captured.blocks.prefix if captured.blocks else None
    return built, pin_problem(built, annotations, kinds, prefix)


def _unpinned(
    built: BuiltProblem,
    search: SearchMethod,
    time_limit: float,
    read: Callable[[BuiltProblem, Solution], Plan],
) -> float | None:
    """The predicted step time of the best plan without the user's pins (``None`` when none fits)."""
    try:
        return read(built, solve(built.problem, method=search, time_limit=time_limit)).predicted_step_time
    except InfeasibleError:
        return None


def _output_order(captured: Captured) -> tuple[str, ...]:
    out = next(n for n in captured.graph_module.graph.nodes if n.op == "output")
    return tuple(n.name for n in out.all_input_nodes)


def solve_built(built: BuiltProblem, method: SearchMethod = "auto", time_limit: float = 60.0) -> Solution:
    """Solve an already built problem (used by benchmarks that time stages separately)."""
    return solve(built.problem, method=method, time_limit=time_limit)
