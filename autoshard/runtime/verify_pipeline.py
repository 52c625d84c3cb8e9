"""``verify`` of a pipelined plan as deployed: microbatches through ``torch.distributed.pipelining`` on gloo.

Input: a :class:`~autoshard.plans.Plan` with stages, the model it was made for with real weights at the plan's
size (its layers are the ones the stages name) and the plan's global input shape.
Output: a :class:`~autoshard.runtime.verdict.VerifyReport` -- the loss of one step and every parameter's
gradient against the single-device model (mean loss over the whole batch), the collectives each stage
logged against its share of ``Plan.collectives`` (:func:`~autoshard.pipeline.cuts.stage_collectives`) times
the microbatches, and the point-to-point sends between stages counted (``p2p send`` in the report: each cut
between two stages on different pipeline ranks carries activations forward and gradients back, once per
microbatch and rank; ZB-V's two stages on the last rank hand over in memory, no send --
:func:`~autoshard.pipeline.schedules.hand_offs`, the rule the pricing counts by, checked against the
stage-to-rank map of torch's schedule), and the ring K/V hops of context parallelism against ``Plan.ring_transfers``
(:func:`~autoshard.runtime.ring_check.check_staged_ring_hops`).  A check in which no p2p ran fails.

The reference runs the single-device model microbatch by microbatch, as the stages do (the same rows, the
mean of the microbatches' mean losses, gradients accumulated: the gradient of the whole batch's mean loss),
so that its top-k (routing) choices can be pinned on every stage's ranks per microbatch
(:func:`~autoshard.runtime.verify_routes.record_staged_routes`): each stage's pinned ``topk`` follows the
chunk id torch's schedule hands the stage (:class:`_Chunk`).

How: :func:`~autoshard.runtime.stages.prepare_stages` once in the parent (each stage runs the whole plan's
decisions, :mod:`autoshard.runtime.stage_plan`), then one rank per device (:func:`~autoshard.runtime.launch.launch`)
builds its stages with :func:`~autoshard.runtime.pipelining.build_pipeline`, runs one
:func:`~autoshard.runtime.pipelining.step` and gathers its gradients whole.

Example::

    report = verify_pipelined(plan, model, ids)
    print(report)        # "verify llama-tiny on mesh (2, 2) (float64): OK ... p2p send x24 ..."
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections import Counter
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
import torch.nn.functional as F
from torch import nn

from autoshard.codegen import parallel_info
from autoshard.codegen.assign import assign_strategies
from autoshard.codegen.collectives import parse_steps
from autoshard.codegen.shard import gather_full
from autoshard.errors import VerifyError
from autoshard.pipeline.cuts import per_step, stage_collectives
from autoshard.pipeline.schedules import Schedule, device_of_chunk, hand_offs
from autoshard.plans import Plan
from autoshard.runtime.launch import launch
from autoshard.runtime.pipelining import build_pipeline, step
from autoshard.runtime.ring_check import check_staged_ring_hops
from autoshard.runtime.stages import prepare_stages
from autoshard.runtime.verdict import VerifyReport, difference
from autoshard.runtime.verify_routes import ReferenceRoute, pin_routes, record_staged_routes, route_note

__all__ = ["verify_pipeline_plan", "verify_pipelined"]


def _loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten())


class _Chunk:
    """The microbatch a stage runs now: the chunk id torch's schedule passes its stage's forward and backward
    (first, positional), kept as they run (a recomputed block runs its ``topk`` again in backward)."""

    def __init__(self, stage: Any) -> None:
        self.index = 0
        for name in ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk"):
            setattr(stage, name, self._following(getattr(stage, name)))

    def _following(self, method: Any) -> Any:
        def run(chunk: int, *args: Any, **kwargs: Any) -> Any:
            self.index = chunk
            return method(chunk, *args, **kwargs)

        return run

    def __call__(self) -> int:
        return self.index


def _rank(
    model: nn.Module,
    plan: Plan,
    builds: Any,
    ids: torch.Tensor,
    labels: torch.Tensor,
    routes: tuple[tuple[ReferenceRoute, ...], ...],
) -> dict[str, Any]:
    sends: list[int] = []
    original = c10d.isend

    def counted(tensor: torch.Tensor, *a: Any, **k: Any) -> Any:
        if tensor.is_floating_point():  # activations and gradients (not torch's own metadata)
            sends.append(1)
        return original(tensor, *a, **k)

    c10d.isend = counted  # P2POp checks its op against torch.distributed's: patch both names
    dist.isend = counted
    try:
        run = build_pipeline(model, plan, (ids,), _loss, stages=builds, record=True)
        flipped: dict[str, set[int]] = {}  # "stage:node" -> global rows whose own choice differed
        for m, index, stage in zip(run.modules, run.stage_indices, run.stages, strict=True):
            comm = parallel_info(m).comm
            pinned = routes[index] if routes else ()
            rows = pin_routes(m, pinned, comm.mesh_shape, comm.coord, comm.zigzag_axis, _Chunk(stage))
            flipped.update({f"{index}:{node}": found for node, found in rows.items()})
        loss = step(run, ids, labels)
    finally:
        c10d.isend = original
        dist.isend = original
    grads: dict[str, torch.Tensor] = {}
    logs, hops = [], list[Any]()
    for m, index in zip(run.modules, run.stage_indices, strict=True):
        info = parallel_info(m)
        hops += info.comm.hops or ()
        ran = [(r.phase, str(r.kind), r.mesh_axis, r.nbytes) for r in info.comm.log or ()]
        logs.append((index, ran))  # the step's own, before gathering the gradients logs more
        for a in info.attrs:
            grad = m.get_parameter(a.fqn).grad if a.kind == "parameter" else None
            if grad is not None:
                grads[a.fqn] = gather_full(grad, a.spec, a.global_shape, info.comm)
    ranks = getattr(run.schedule, "stage_index_to_group_rank", None)  # multi-stage schedules: torch's map
    return {
        "loss": loss,
        "loss_steps": run.loss_steps,  # the harness's gather for the loss (pipelining doc)
        "grads": grads,
        "logs": logs,
        "sends": len(sends),
        "hops": hops,
        "ranks": ranks,
        "flipped": flipped,
    }


def verify_pipelined(plan: Plan, model: nn.Module, ids: torch.Tensor, *, name: str = "") -> VerifyReport:
    """The check of the module doc; ``ids``: one global batch of token ids of the plan's shape."""
    start = time.perf_counter()
    pipe = plan.pipeline
    assert pipe is not None, "verify_pipelined checks plans with stages"
    labels = torch.roll(ids, -1, 1)
    builds = prepare_stages(model, plan, (ids,))
    # the reference by microbatches, as the stages run (module doc), its top-k choices kept per stage node
    m = plan.microbatches
    batches = list(zip(ids.tensor_split(m), labels.tensor_split(m), strict=True))
    stages = [(b.captured, assign_strategies(b.captured, b.plan)) for b in builds]
    forwards = [lambda x=x: model(x).logits for x, _ in batches]
    logits, routes, unpinned = record_staged_routes(stages, forwards)
    reference = torch.stack([_loss(out, y) for out, (_, y) in zip(logits, batches, strict=True)]).mean()
    reference.backward()
    ref_grads = {k: p.grad.detach().clone() for k, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    results = launch(_rank, plan.num_devices, model, plan, builds, ids, labels, routes, timeout=600)
    losses = [r["loss"] for r in results if r["loss"] is not None]
    grads: dict[str, torch.Tensor] = {}
    by_stage: dict[int, list[list[tuple]]] = {}
    for r in results:
        grads.update(r["grads"])
        for index, log in r["logs"]:
            by_stage.setdefault(index, []).append(log)
    m, chunks = plan.microbatches, len(pipe.stages)
    emitted: Counter[str] = Counter()
    planned: Counter[str] = Counter()
    runs: dict[int, Counter[tuple]] = {}  # stage -> (phase, kind, axis, bytes) -> times per step, planned
    for index, logs in sorted(by_stage.items()):
        emitted.update(f"{p} {k}" for p, k, _, _ in logs[0])
        runs[index] = Counter()
        for c in stage_collectives(plan, index):
            if c.phase in ("forward", "backward"):
                planned[f"{c.phase} {c.kind}"] += per_step(plan, c)
                runs[index][_key(c)] += per_step(plan, c)
    for step_ in parse_steps(
        max((r["loss_steps"] for r in results), key=len)  # the last stage's ranks ran it
    ):  # the loss's own, once per microbatch on the last stage
        if step_.is_collective and chunks - 1 in runs:  # its string has no bytes: the size the rank logged
            ran = [r for r in by_stage[chunks - 1][0] if r[:3] == ("forward", step_.kind, step_.mesh_axis)]
            runs[chunks - 1][("forward", step_.kind, step_.mesh_axis, ran[-1][3] if ran else 0)] += m
            planned[f"forward {step_.kind}"] += m
    group = len(pipe.stages[0].ranks)
    hops = check_staged_ring_hops(plan, [r["hops"] for r in results], group)  # or VerifyError
    ring = sum(h.sends for r in results for h in r["hops"])  # context parallelism's, checked on their own
    emitted["p2p send"] = sum(r["sends"] for r in results) - ring
    planned["p2p send"] = 2 * m * group * sum(_cuts(pipe.schedule, chunks, pipe.degree, results))
    agree = all(all(log == logs[0] for log in logs) for logs in by_stage.values())
    same_bytes = all(Counter(logs[0]) == runs[index] for index, logs in by_stage.items())
    outputs = tuple(difference("loss", x.detach().reshape(1), reference.detach().reshape(1)) for x in losses)
    return VerifyReport(
        model=name or plan.model,
        mesh_shape=tuple(plan.mesh_shape),
        dtype=str(next(model.parameters()).dtype).removeprefix("torch."),
        outputs=outputs,
        grads=tuple(difference(f"grad {k}", grads.get(k), g) for k, g in ref_grads.items()),
        ranks_agree=agree and same_bytes,
        emitted=dict(emitted),
        planned=dict(planned),
        seconds=time.perf_counter() - start,
        split=True,
        ring_hops=hops,
        routes=_route_note(routes, results) or unpinned,
        exercised=_exercised(builds),
        source=(
            f"pipelined plan as deployed: {chunks} stages, {pipe.schedule}, {m} microbatches through "
            "torch.distributed.pipelining on gloo"
        ),
    )


_LAYER = re.compile(r"[.]\d+(?=[.]|$)")  # model.layers.3.mlp -> model.layers.*.mlp


def _exercised(builds: Any) -> tuple[str, ...]:
    """The stages' decisions that split or reduce something ("stage 1 model.layers.* aten.linear.default:
    ..."), each once: what the report lists as exercised (the stages run the plan's own decisions)."""
    said = (
        f"stage {b.index} {_LAYER.sub('.*', n.module) or '<root>'} {n.target}: {n.strategy}"
        for b in builds
        for n in b.plan.nodes
        if n.target != "placeholder" and ("S(" in n.strategy or "P" in n.strategy)
    )
    return tuple(dict.fromkeys(said))


def _route_note(routes: tuple[tuple[ReferenceRoute, ...], ...], results: list[dict[str, Any]]) -> Any:
    """The ranks' flipped rows per stage node (:func:`~autoshard.runtime.verify_routes.route_note`); node names
    repeat across stage captures, so each is named with its stage."""
    named = [dataclasses.replace(r, node=f"{i}:{r.node}") for i, stage in enumerate(routes) for r in stage]
    return route_note(named, [r["flipped"] for r in results])


def _cuts(schedule: str, chunks: int, degree: int, results: list[dict[str, Any]]) -> tuple[bool, ...]:
    """The cuts that are p2p sends (activations forward, gradients back, every rank of the stage), by the
    pricing's stage-to-rank map, which must be the one torch's schedule ran (or VerifyError)."""
    which = Schedule(schedule)
    ours = {c: device_of_chunk(which, c, degree) for c in range(chunks)}
    for r in results:
        if r["ranks"] is not None and dict(r["ranks"]) != ours:
            raise VerifyError(
                f"verify: torch's {schedule} put stages on pipeline ranks {dict(r['ranks'])}, the plan was priced "
                f"with {ours}: fix autoshard.pipeline.schedules.device_of_chunk for {schedule}"
            )
    return hand_offs(which, chunks, degree)


def _key(c: Any) -> tuple[str, str, int, int]:
    return (c.phase, str(c.kind), c.mesh_axis, c.nbytes)


def small_copy(plan: Plan) -> str:
    """The advice for a pipelined plan too large to run here: commands that plan LLaMA-tiny with the plan's
    stages and schedule, deep enough for its chunks (an interleaved schedule runs 2 or more per stage), on at
    most 8 gloo ranks, and verify it."""
    pipe = plan.pipeline
    assert pipe is not None, "small_copy advises on pipelined plans"
    if pipe.degree > 8:
        return f"a pipeline of {pipe.degree} stages needs more than 8 gloo ranks: verify a copy with --pp 8 or fewer"
    mesh = f"{pipe.degree}x2" if pipe.degree <= 4 else str(pipe.degree)
    layers = max(2, len(pipe.stages))  # a layer per chunk at least
    return (
        f"plan a small copy with the same stages and schedule and verify that: autoshard search --profile cpu "
        f"--model llama-tiny --layers {layers} --mesh {mesh} --pp {pipe.degree} --schedule {pipe.schedule} "
        "--out small.json && autoshard verify --plan small.json"
    )


def verify_pipeline_plan(plan: Plan, spec: str, *, float64: bool = False) -> VerifyReport:
    """``verify --plan`` of a pipelined plan: the zoo model ``spec`` rebuilt at the plan's input shape with real
    weights and checked by :func:`verify_pipelined`.  Plans too large to run here are refused in one line."""
    from autoshard import zoo
    from autoshard.errors import AutoshardError

    shape = next(iter(plan.input_shapes.values()), ((), ""))[0]
    if plan.num_devices > 8 or len(shape) != 2:
        raise AutoshardError(
            f"a pipelined plan is verified as deployed, one gloo rank per device and its own layers: this one "
            f"needs {plan.num_devices} ranks for input {shape}; {small_copy(plan)}"
        )
    torch.manual_seed(0)
    layers = plan.source.get("layers")  # search --layers: the depth it was planned at
    case = zoo.build(
        spec, batch=int(shape[0]), seq=int(shape[1]), layers=None if layers is None else int(layers)
    )
    if any(p.device.type == "meta" for p in case.model.parameters()):
        raise AutoshardError(
            f"{spec} builds on the meta device: a pipelined plan is verified at its own size; {small_copy(plan)}"
        )
    model = case.model.to(torch.float64) if float64 else case.model
    return verify_pipelined(plan, model, case.args[0], name=spec)
