"""The winning candidate as a :class:`~autoshard.plans.Plan`: degrees, microbatches, stages, headline.

Input: a :class:`~autoshard.pipeline.search.Candidate` and the intra-op :class:`Plan` extracted from its
solution on the stage sub-mesh (:func:`~autoshard.problem.extract.extract_plan`).
Output: the Plan of the whole cluster.  With stages, the mesh gains the pipeline axis first (``"pp"``) and
every placement gains an ``R`` for it (along the pipeline axis a tensor is not split: which stage holds it
is ``Plan.pipeline.stages[i].modules``); collectives' mesh axes shift by one; ``predicted_step_time`` is the
schedule's step time (bubble included) and ``memory_per_device`` the worst device's peak.

:func:`degrees_of` reads the kinds of parallelism off the placements: an axis that splits the batch dim of
the inputs is ``dp`` (``fsdp`` when parameters are also split on it), one that splits parameters but not the
batch ``tp``, one that splits the inputs' sequence dim ``cp``.  :func:`headline` is the report's first line.
"""

from __future__ import annotations

import dataclasses
import math

from autoshard.pipeline.layers import boundary_bytes
from autoshard.pipeline.schedules import Schedule, device_of_chunk, p2p_time
from autoshard.pipeline.search import Candidate
from autoshard.plans import Collective, PipelinePlan, PipelineStage, Plan

__all__ = ["assemble", "degrees_of", "headline"]


def degrees_of(plan: Plan, pipeline_axis: int | None = None) -> dict[str, int]:
    """Degree per kind of parallelism (``dp``, ``fsdp``, ``tp``, ``cp``, ``pp``) from the plan's placements."""
    degrees: dict[str, int] = {}
    inputs = [p for p in plan.input_placements.values() if p]
    params = [p for p in plan.param_placements.values() if p]
    for axis, size in enumerate(plan.mesh_shape):
        if size == 1:
            continue
        if axis == pipeline_axis:
            kind = "pp"
        else:
            batch = any(p[axis] == "S(0)" for p in inputs if axis < len(p))
            seq = any(p[axis] == "S(1)" for p in inputs if axis < len(p))
            split = any(p[axis].startswith("S(") for p in params if axis < len(p))
            if batch:
                kind = "fsdp" if split else "dp"
            elif split:
                kind = "tp"
            elif seq:
                kind = "cp"
            else:
                continue
        degrees[kind] = degrees.get(kind, 1) * size
    return degrees


def headline(plan: Plan) -> str:
    """One line: ``PP 8 (interleaved, v=3) × TP 8 × DP 16, 64 microbatches of 1``."""
    order = ("pp", "tp", "sp", "cp", "ep", "fsdp", "dp")
    parts = []
    for kind in order:
        size = plan.degrees.get(kind, 1)
        if size <= 1:
            continue
        text = f"{kind.upper()} {size}"
        if kind == "pp" and plan.pipeline is not None:
            name = Schedule(plan.pipeline.schedule).short
            v = plan.pipeline.virtual_stages
            text += f" ({name}, v={v})" if v > 1 else f" ({name})"
        parts.append(text)
    head = " × ".join(parts) or "no parallelism (replicated)"
    batch = max((shape[0][0] for shape in plan.input_shapes.values() if shape[0]), default=0)
    replicas = plan.degrees.get("dp", 1) * plan.degrees.get("fsdp", 1)
    if plan.microbatches > 1 and batch:
        each = batch // plan.microbatches // max(1, replicas)
        return f"{head}, {plan.microbatches} microbatches of {max(1, each)}"
    return f"{head}, 1 microbatch"


def _modules(candidate: Candidate) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Modules owning parameters or buffers read before the repeated layers, and after them, in graph order
    (a tied weight, or a buffer read on both sides, is in both)."""
    infos = candidate.built.infos
    order = list(infos)
    first = next(
        (i for i, n in enumerate(order) if infos[n].block is not None and infos[n].kind == "op"), len(order)
    )
    position = {name: i for i, name in enumerate(order)}
    pre: dict[str, None] = {}
    post: dict[str, None] = {}
    for consumer in infos.values():
        if consumer.block is not None:
            continue
        for src in consumer.inputs:
            info = infos[src]
            if info.kind not in ("parameter", "buffer") or not info.fqn or info.block is not None:
                continue
            (pre if position[consumer.name] < first else post)[info.fqn.rpartition(".")[0]] = None
    return tuple(k for k in pre if k), tuple(k for k in post if k)


def _stages(candidate: Candidate, prefix: str) -> tuple[PipelineStage, ...]:
    split = candidate.split
    assert split is not None
    pre, post = _modules(candidate)
    group = candidate.layout.sub.num_devices
    chunks = len(split.bounds) - 1
    stages = []
    for c in range(chunks):
        start, end = split.bounds[c], split.bounds[c + 1]
        modules = (pre if c == 0 else ()) + tuple(f"{prefix}.{i}" for i in range(start, end))
        modules += post if c == chunks - 1 else ()
        d = device_of_chunk(split.schedule, c, split.degree)
        stages.append(
            PipelineStage(
                index=c,
                modules=modules,
                layers=(start, end),
                ranks=tuple(range(d * group, (d + 1) * group)),
                compute_seconds=split.chunk_seconds[c],
                memory_bytes=split.memory[d],
            )
        )
    return tuple(stages)


def assemble(candidate: Candidate, intra: Plan, prefix: str | None, cluster_record: dict) -> Plan:
    """The whole-cluster plan (see the module docstring)."""
    m = candidate.microbatches
    if candidate.split is None:
        plan = dataclasses.replace(intra, microbatches=m)
        return dataclasses.replace(plan, degrees=degrees_of(plan))
    split = candidate.split
    where = candidate.layout

    def widen(p: tuple[str, ...]) -> tuple[str, ...]:
        return ("R", *p) if p else p

    collectives = tuple(dataclasses.replace(c, mesh_axis=c.mesh_axis + 1) for c in intra.collectives)
    worst = max(range(split.degree), key=lambda d: split.forward[d] + split.backward[d])
    share = split.forward[worst] + split.backward[worst]
    total = sum(split.forward) + sum(split.backward)
    comm = _communication(intra.collectives, share / total if total > 0 else 1.0)
    p2p = m * 2 * _p2p_seconds(candidate)
    bubble = 1.0 - m * share / split.pipeline_seconds if split.pipeline_seconds > 0 else 0.0
    note = (
        f"{split.degree} pipeline stages on mesh axis 0 ('pp'); node strategies are on each stage's "
        f"sub-mesh {where.sub.mesh_shape}; compute time includes the bubble"
    )
    pipeline = PipelinePlan(
        stages=_stages(candidate, prefix or ""),
        schedule=split.schedule.value,
        virtual_stages=split.virtual,
        bubble_fraction=max(0.0, bubble),
        mesh_axis=0,
    )
    plan = dataclasses.replace(
        intra,
        cluster=cluster_record,
        mesh_shape=where.mesh,
        param_placements={k: widen(v) for k, v in intra.param_placements.items()},
        input_placements={k: widen(v) for k, v in intra.input_placements.items()},
        output_placements=tuple(widen(p) for p in intra.output_placements),
        collectives=collectives,
        predicted_step_time=split.step_seconds,
        communication_time=comm + p2p,
        compute_time=split.step_seconds - comm - p2p,
        memory_per_device=max(split.memory),
        microbatches=m,
        pipeline=pipeline,
        notes=(*intra.notes, note),
    )
    return dataclasses.replace(plan, degrees=degrees_of(plan, pipeline_axis=0))


def _communication(collectives: tuple[Collective, ...], share: float) -> float:
    return math.fsum(c.seconds for c in collectives) * share


def _p2p_seconds(candidate: Candidate) -> float:
    where = candidate.layout
    nbytes = boundary_bytes(candidate.built, candidate.solution)
    return p2p_time(nbytes, where.p2p_bandwidth, where.p2p_latency)
