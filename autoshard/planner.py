"""``autoshard.plan``: capture → strategies → costs → search → plan, each stage timed, in this order (why):

1. capture the model once (repeated layers cut to two: planning cost stops growing with depth);
2. build the search problem: every node's strategies priced for compute, communication (forward and the
   backward implied by it) and memory per device on the given cluster;
3. pin what the user annotated;
4. solve exactly (dynamic programming / variable elimination); when a memory budget binds, CP-SAT under the
   budget, warm-started from the exact unconstrained plan; with ``search="propagate"``, BFS from the
   annotations only (milliseconds, no optimality claim);
5. search the recomputation of the repeated blocks (``recompute="auto"``): none, selective or full, each
   solved exactly and the fastest plan that fits kept.  Recomputation only ever adds time (compute and
   re-issued forward collectives) and only saves memory, so when the memory budget does not bind the plan
   without it (its optimum is the unconstrained optimum), that plan is optimal over all three and the
   others are not solved; nor is a policy whose every fitting plan provably steps slower than one found
   (:mod:`autoshard.planner_policy`).  When the budget binds, ``k`` of the ``N`` repeated blocks recomputed
   under selective or full (the rest keeping everything) is searched too, exactly
   (:mod:`autoshard.problem.mix`), and recorded in ``Plan.recompute_blocks``;
6. read the plan back from the same cost functions, so its step time is the solver's objective;
7. when capture fused grouped-GEMM expert MLPs (:mod:`autoshard.capture.experts`: cheap expert parallelism,
   but no K/N split inside the experts), plan the unfused capture too, unless its floor proves it slower
   (:mod:`autoshard.planner_experts`), and keep the cheaper plan (a note says which); codegen captures the
   same way (:func:`~autoshard.capture.experts.plan_fuses_experts`).

With ``pipeline`` / ``microbatches`` (or a ``"stage"`` annotation), steps 2–5 run inside
:func:`autoshard.pipeline.search.search_pipeline` instead: once per (stage sub-mesh, microbatch size), with
the stage DP and the schedules priced on top, and :mod:`autoshard.pipeline.assemble` fills the plan's
``degrees``, ``microbatches`` and ``pipeline``.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import torch

from autoshard.annotations import forbidden_kinds
from autoshard.capture import Captured, capture
from autoshard.capture.blocks import find_repeated_blocks
from autoshard.capture.experts import plan_fuses_experts
from autoshard.cluster import Cluster, load_cluster
from autoshard.errors import AnnotationError, AutoshardError, InfeasibleError, PipelineError
from autoshard.gcpause import paused_gc, resumed_gc
from autoshard.pipeline.assemble import assemble
from autoshard.pipeline.options import MICROBATCHES_PER_STAGE, check_request, split_cut_pins, whole_samples
from autoshard.pipeline.search import search_pipeline
from autoshard.pipeline.summary import degrees_of
from autoshard.plan_model import identity
from autoshard.planner_counts import plan_counts
from autoshard.planner_experts import plan_unfused
from autoshard.planner_layout import search_layout
from autoshard.planner_policy import cannot_win, search_counts
from autoshard.planner_rerank import by_step
from autoshard.planner_steps import (
    SearchMethod,
    batch_size,
    budget_idle,
    build,
    global_shapes,
    output_order,
    ranked,
    reader,
    recompute_note,
    warn_replicated,
)
from autoshard.plans import Plan
from autoshard.problem.build import BuiltProblem
from autoshard.problem.costs import CostOptions, PrecisionPolicy, Recompute, StepCache, recipe
from autoshard.problem.extract import extract_plan
from autoshard.search import BoundExceeded, Solution
from autoshard.search.recall import scoped
from autoshard.steering import budget_refusal, check_stages, has_stage_pin

__all__ = ["plan"]


@paused_gc  # the collector's full passes over the captured graph's heap cost ~10% of a plan
@scoped  # the solves of one plan share large min-plus tables; none outlives it
def plan(
    model: torch.nn.Module,
    cluster: Cluster,
    example_args: tuple[Any, ...] | Any = (),
    example_kwargs: Mapping[str, Any] | None = None,
    *,
    annotations: Mapping[str, Any] | None = None,
    training: bool = True,
    memory_limit: float | None = None,
    recompute: Literal["auto", "none", "selective", "full"] = "auto",
    search: SearchMethod = "auto",
    time_limit: float = 60.0,
    blocks: Literal["auto", "full"] | None = "auto",
    progress: Callable[[str], None] | None = None,
    pipeline: int | Literal["auto"] | None = None,
    microbatches: int | Literal["auto"] | None = None,
    schedule: str = "auto",
    allow: Sequence[str] = (),
    forbid: Sequence[str] = (),
    captured: Captured | None = None,
    cp_layout: Literal["auto", "zigzag", "contiguous"] = "auto",
    ceiling: float = float("inf"),
    precision: Literal["bf16", "amp"] = "bf16",
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
        recompute: activation recomputation of the repeated blocks; ``"auto"`` searches none / selective /
            full (step 5 above), or pin one.
        search: ``"auto"`` (exact, CP-SAT under a binding budget), ``"exact"``, ``"ilp"`` or ``"propagate"``.
        time_limit: seconds for the solver; past it the best plan and its gap are reported.
        blocks: ``"auto"`` solves identical repeated layers once; ``None`` plans the full graph.
        progress: called with the name of each stage as it starts ("capture", "strategies", "solve",
            "recompute" when the plan is retried with activation recomputation).
        pipeline: pipeline stages: ``None`` (none), a degree, or ``"auto"`` (searched with everything else);
            stages are laid over the outermost mesh axis (see :mod:`autoshard.pipeline.options`).
        microbatches: microbatches per step (gradient accumulation, and the pipeline's microbatches): an
            int dividing the global batch, or ``"auto"`` (without stages: every divisor of the batch, the
            fastest kept, :mod:`autoshard.planner_counts`); ``None`` (default): 1 without stages, with ``p``
            stages the smallest divisor of the batch of at least ``2 p`` (the plan's notes say so).
        schedule: ``"auto"`` or one of ``gpipe``, ``1f1b``, ``interleaved_1f1b``, ``zb_v``,
            ``interleaved_zb``.  A ``"stage"`` annotation on a repeated layer starts a stage there.
        allow / forbid: kinds of parallelism the plan may use only / must not use (``"dp"``, ``"fsdp"``,
            ``"tp"``, ``"sp"``, ``"cp"``, ``"ep"``, ``"pp"``: what each rules out is the table in
            :mod:`autoshard.steering`).  With annotations or kinds, the plan also records the step
            time of the unpinned optimum (``Plan.unpinned_step_time``: the price of the pins).
        captured: ``capture(model, example_args, example_kwargs, blocks=blocks)`` made earlier, to plan the same
            model twice (e.g. free and as pure data parallel) without capturing it again.
        cp_layout: the sequence layout of context parallelism's ring axis (``Plan.context_layout``):
            ``"auto"`` picks zigzag (load-balanced causal work) or contiguous by price, inside the search
            (:mod:`autoshard.planner_layout`; pipelined plans: chosen on the stage search's plan).
        ceiling: a step time to beat (the mesh search's best so far).  When a proven lower bound on this
            plan's step time reaches it, :class:`~autoshard.search.BoundExceeded` is raised instead of
            solving under the memory budget and retrying with recomputation.  Not applied with pipeline
            stages, nor to a capture with fused expert MLPs (their unfused alternative is bounded, and planned
            if its bound is below it, with the fused plan's step, or this if lower, as its ceiling).
        precision: the training recipe priced: ``"bf16"`` or ``"amp"`` (``Plan.precision``).

    Raises:
        CaptureError, AnnotationError, InfeasibleError, ShardingError, PipelineError: AutoshardError's.
    """
    staged = pipeline is not None or microbatches not in (None, 1) or has_stage_pin(annotations)
    args = example_args if isinstance(example_args, tuple) else (example_args,)
    check_stages(forbidden_kinds(allow, forbid), pipeline, has_stage_pin(annotations))  # pp forbidden
    if microbatches == "auto" and pipeline is None and schedule == "auto" and not has_stage_pin(annotations):
        at = functools.partial(plan, model, cluster, example_args, example_kwargs, annotations=annotations,
            training=training, memory_limit=memory_limit, recompute=recompute, search=search, blocks=blocks,
            time_limit=time_limit, progress=progress, allow=allow, forbid=forbid, cp_layout=cp_layout,
            precision=precision)  # fmt: skip
        with resumed_gc():  # each count's plan pauses the collector itself (gcpause.py)
            return plan_counts(lambda m, c: at(microbatches=m, ceiling=c, captured=None if m else captured),
                               batch_size(args, dict(example_kwargs or {})), ceiling)  # fmt: skip
    if staged or schedule != "auto":  # a schedule without stages is refused there (pipeline/options.py)
        return dataclasses.replace(whole_samples(functools.partial(
            _plan_pipelined, model, cluster, example_args, example_kwargs, annotations=annotations,
            training=training, memory_limit=memory_limit, recompute=recompute, search=search,
            time_limit=time_limit, blocks=blocks, progress=progress, pipeline=pipeline, schedule=schedule,
            kinds=forbidden_kinds(allow, forbid), cp_layout=cp_layout, precision=recipe(precision),
            ceiling=ceiling), microbatches), precision=precision, source={"model": identity(model)})  # fmt: skip
    timings, start = dict[str, float](), time.perf_counter()
    say = progress or (lambda stage: None)
    say("capture")
    kwargs = dict(example_kwargs or {})
    kinds = forbidden_kinds(allow, forbid)
    captured = captured or capture(model, args, kwargs, blocks=blocks)
    timings["capture"] = time.perf_counter() - start
    replicated = warn_replicated(captured)
    limit = float(cluster.device_memory) if memory_limit is None else float(memory_limit)
    fuses = plan_fuses_experts(captured.op_nodes())
    solve_one = functools.partial(
        _plan_captured, model, cluster, annotations=annotations, training=training, limit=limit,
        recompute=recompute, search=search, time_limit=time_limit, say=say, kinds=kinds, cp_layout=cp_layout,
        ceiling=float("inf") if fuses else ceiling, precision=recipe(precision),
    )  # fmt: skip
    try:
        fused: Plan | AutoshardError = solve_one(captured, timings)
    except (InfeasibleError, AnnotationError) as e:
        fused = e
    result: Plan | AutoshardError = fused
    if fuses:  # fused expert MLPs: cheap EP, but no K/N split: the op-by-op capture too, unless proven slower
        t0 = time.perf_counter()
        # the fused capture's blocks (3-block check done there); the options its floor is built under
        recapture = functools.partial(capture, model, args, kwargs, blocks=blocks, check_blocks=False,
                                      fuse_experts=False)  # fmt: skip
        options = dict(annotations=annotations, training=training, memory_limit=memory_limit, recompute=recompute,
                       search=search, time_limit=time_limit, blocks=blocks, allow=allow, forbid=forbid,
                       cp_layout=cp_layout, precision=precision)  # fmt: skip
        result = plan_unfused(fused, recapture, solve_one, cluster, options, ceiling)
        timings["experts_alternative"] = time.perf_counter() - t0
    if isinstance(result, AutoshardError):
        raise result
    timings = {**timings, **result.timings, "capture": timings["capture"]}
    timings["total"] = time.perf_counter() - start  # only plan() sets replicated_ops; the recipe said too
    return dataclasses.replace(result, timings=timings, replicated_ops=replicated, precision=precision,
                               source={"model": identity(model)})  # fmt: skip


def _plan_captured(
    model: torch.nn.Module,
    cluster: Cluster,
    captured: Captured,
    timings: dict[str, float],
    *,
    annotations: Mapping[str, Any] | None,
    training: bool,
    limit: float,
    recompute: Literal["auto", "none", "selective", "full"],
    search: SearchMethod,
    time_limit: float,
    say: Callable[[str], None],
    kinds: frozenset[str],
    cp_layout: Literal["auto", "zigzag", "contiguous"] = "auto",
    ceiling: float = float("inf"),
    precision: PrecisionPolicy | None = None,
) -> Plan:
    """Strategies, costs, pins, the recomputation search and the solve (and CP layout) on one capture."""
    start = time.perf_counter()
    policies = [Recompute(recompute)] if recompute != "auto" and training else list(Recompute)
    if not training:
        policies = [Recompute.NONE]
    notes: list[str] = list(getattr(captured, "notes", ()) or ())
    best: tuple[Plan, BuiltProblem, BuiltProblem, Callable[..., Plan], Solution] | None = None
    error: InfeasibleError | None = None
    pruned: BoundExceeded | None = None
    uniform: dict[Recompute, tuple[BuiltProblem, BuiltProblem, float]] = {}  # (free, pinned, objective)
    idle, skipped = False, list[str]()
    again = lambda cl, o: build(captured, cl, o, annotations, limit, {}, kinds)  # noqa: E731
    for policy in policies:
        opts = CostOptions(training=training, recompute=policy, cp_layout=cp_layout, precision=precision)
        say("strategies" if policy is policies[0] else "recompute")
        free, built = build(captured, cluster, opts, annotations, limit, timings, kinds)
        try:
            say("solve")
            t0 = time.perf_counter()
            skip = cannot_win(built, best[0].predicted_step_time, search, time_limit) if best else None
            if skip is None:
                free, built, solution = by_step(
                    search_layout, free, built, again, search, time_limit, ceiling
                )
            timings["solve"] = timings.get("solve", 0.0) + time.perf_counter() - t0
        except InfeasibleError as e:
            error = e  # the last policy's (the least memory) says by how much even that overshoots
            uniform[policy] = (free, built, float("inf"))
            continue
        except BoundExceeded as e:
            if policy is policies[0]:
                raise  # recomputation only adds time: no later policy, nor any count of one, beats it either
            pruned = (
                e  # this policy cannot beat the ceiling; a later one may still fit better, and so may its
            )
            uniform[policy] = (free, built, float("inf"))  # first k of N blocks (planner_policy docstring)
            continue
        if skip is not None:  # its first k of N blocks may still pay (mix_policies below)
            uniform[policy] = (free, built, float("inf"))
            skipped.append(f"{policy.value} recomputation: at least {skip.bound:.4g} s per step")
            continue
        uniform[policy] = (free, built, solution.objective)
        timings["total"] = time.perf_counter() - start
        read = reader(model, captured, timings, notes, limit, recompute_note(policy, recompute))
        found = read(built, solution)
        if best is None or found.predicted_step_time < best[0].predicted_step_time:
            best = (found, free, built, read, solution)
        if policy is Recompute.NONE and budget_idle(built, solution, search, time_limit):
            idle = True
            break  # recomputation only adds time: with the budget idle, keeping every activation is optimal
    if recompute == "auto" and training and not idle and len(uniform) > 1:
        t0 = time.perf_counter()
        hints = (best[4].multiplier, best[4].dominated) if best else (None, ())
        step = min(best[0].predicted_step_time if best else float("inf"), ceiling)  # a plan kept below both
        mixed = search_counts(uniform, again, search, time_limit, *hints, best_step=step)  # kept if faster
        timings["recompute_blocks"] = time.perf_counter() - t0
        if mixed is not None:
            solution_k, free, built, k = mixed
            note = (
                f"activations do not fit without recomputation: {built.options.recompute.value} recomputation of "
                f"the first {k} of {built.num_blocks} repeated blocks (per-block count searched exactly)",
            )
            read = reader(model, captured, timings, notes, limit, note)
            plan_k = read(built, solution_k)
            if best is None or plan_k.predicted_step_time < best[0].predicted_step_time:
                best = (plan_k, free, built, read, solution_k)
    if best is None:
        if pruned is not None:
            raise pruned  # every policy either does not fit or cannot beat the ceiling
        assert error is not None
        tried = [p.value for p in policies] if any(i.block is not None for i in built.infos.values()) else []
        raise budget_refusal(error, kinds, tried, pinned=bool(annotations), training=training) from error
    found, free, built, read, solution = best
    if limit != float("inf") and found.memory_per_device > limit * (1 + 1e-9):  # the budget held every term
        raise InfeasibleError(
            f"internal: the plan needs {found.memory_per_device / 2**30:.2f} GiB per device, over the "
            f"{limit / 2**30:.2f} GiB budget the search held; report this with the command line"
        )
    flat = ranked(found, free, built, solution, read, search, time_limit, annotations, kinds)  # by the step
    bounded = ("not solved, bounded: " + "; ".join(skipped),) if skipped else ()  # planner_policy.py
    return dataclasses.replace(flat, degrees=degrees_of(flat), notes=(*flat.notes, *bounded))


def _plan_pipelined(
    model: torch.nn.Module,
    cluster: Cluster,
    example_args: tuple[Any, ...] | Any,
    example_kwargs: Mapping[str, Any] | None,
    *,
    annotations: Mapping[str, Any] | None,
    training: bool,
    memory_limit: float | None,
    recompute: Literal["auto", "none", "selective", "full"],
    search: SearchMethod,
    time_limit: float,
    blocks: Literal["auto", "full"] | None,
    progress: Callable[[str], None] | None,
    pipeline: int | Literal["auto"] | None,
    microbatches: int | Literal["auto"] | None,
    schedule: str,
    kinds: frozenset[str] = frozenset(),
    cp_layout: Literal["auto", "zigzag", "contiguous"] = "auto",
    precision: PrecisionPolicy | None = None,
    ceiling: float = float("inf"),
) -> Plan:
    """Stages and microbatches searched jointly with the intra-op plan (:mod:`autoshard.pipeline`); the
    ceiling only bounds plans without stages (gradient accumulation: :mod:`autoshard.planner_counts`)."""
    timings: dict[str, float] = {}
    start = time.perf_counter()
    args = example_args if isinstance(example_args, tuple) else (example_args,)
    kwargs = dict(example_kwargs or {})
    batch = batch_size(args, kwargs)
    repeated = find_repeated_blocks(model)
    layers, prefix = (repeated.num_blocks, repeated.prefix) if repeated else (0, None)
    rest, cuts = split_cut_pins(annotations, prefix, layers)
    request = check_request(
        pipeline, microbatches, schedule, batch=batch, layers=layers, devices=cluster.num_devices,
        nodes=cluster.nodes, cuts=cuts, outer=cluster.mesh_shape[0],
    )  # fmt: skip
    if request.degree != 1 and layers < 2:
        raise PipelineError(
            f"pipeline={pipeline!r}: {type(model).__name__} has no stack of repeated layers to cut into "
            f"stages; plan it with pipeline=None"
        )
    limit = float(cluster.device_memory) if memory_limit is None else float(memory_limit)
    policies = list(Recompute) if recompute == "auto" else [Recompute(recompute)]  # none, selective, full
    if not training:
        policies = [Recompute.NONE]

    def capture_fn(a: tuple[Any, ...], k: dict[str, Any]) -> Captured:
        t0 = time.perf_counter()
        # the 2-block shortcut is checked once; other microbatch sizes reuse that check
        found = capture(model, a, k, blocks=blocks, check_blocks="capture" not in timings)
        timings["capture"] = timings.get("capture", 0.0) + time.perf_counter() - t0
        return found

    caches: dict[Cluster, StepCache] = {}  # redistribution times are shared by builds on one sub-mesh

    def build_stage(captured: Captured, sub: Cluster, opts: CostOptions, budget: float) -> BuiltProblem:
        opts = dataclasses.replace(opts, cp_layout=cp_layout, precision=precision)  # CP: on the winner
        cache = caches.setdefault(sub, StepCache(sub))
        return build(captured, sub, opts, rest, budget, timings, kinds, cache)[1]  # with the user's pins

    best = search_pipeline(
        request, cluster, args, kwargs, batch=batch, layers=layers, capture_fn=capture_fn, build=build_stage,
        policies=policies, training=training, memory_limit=limit, method=search, time_limit=time_limit,
        say=progress or (lambda stage: None), ceiling=ceiling if request.degree == 1 else float("inf"),
    )  # fmt: skip
    timings["total"] = time.perf_counter() - start
    notes = list(best.captured.notes)
    if len(best.priced) > 1:
        notes.append("pipeline search priced: " + "; ".join(best.priced))
    if request.by_default and best.layout.degree > 1:
        notes.append(f"microbatches: {best.microbatches} by default (at least {MICROBATCHES_PER_STAGE} per stage, "
                     f"dividing the batch of {batch}); pin microbatches= (--microbatches) to choose")  # fmt: skip
    if best.recompute is not Recompute.NONE and recompute == "auto":
        notes.append(f"activations do not fit without recomputation: planned with {best.recompute.value} "
                     "recomputation")  # fmt: skip
    intra = extract_plan(
        best.built,
        best.solution,
        model=type(model).__name__,
        block_prefix=prefix,
        block_first=repeated.first if repeated else 0,
        output_order=output_order(best.captured),
        timings=timings,
        notes=tuple(notes),
    )
    whole = load_cluster(
        cluster.profile, nodes=cluster.nodes, mesh=best.layout.mesh, axis_names=best.layout.axis_names
    ) if best.split is not None else cluster  # fmt: skip
    layout = {"mesh_shape": list(best.layout.mesh), "axis_names": list(best.layout.axis_names)}
    record = {**intra.cluster, **layout, "nodes": cluster.nodes, "devices": cluster.num_devices}
    record["description"] = whole.describe()
    plan = assemble(best, intra, prefix, record, first=repeated.first if repeated else 0)
    budget = limit if limit != float("inf") else None  # the stages' budget (the extract was not held to it)
    return dataclasses.replace(plan, input_shapes=global_shapes(plan, args, batch), memory_limit=budget)
