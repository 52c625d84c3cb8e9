"""The winning candidate as a :class:`~autoshard.plans.Plan`: degrees, microbatches, stages, headline.

Input: a :class:`~autoshard.pipeline.search.Candidate` and the intra-op :class:`Plan` extracted from its
solution on the stage sub-mesh (:func:`~autoshard.problem.extract.extract_plan`).
Output: the Plan of the whole cluster.  With stages, the mesh gains the pipeline axis first (``"pp"``) and
every placement gains an ``R`` for it (along the pipeline axis a tensor is not split: which stage holds it
is ``Plan.pipeline.stages[i].modules``); collectives' mesh axes shift by one; ``predicted_step_time`` is the
schedule's step time (bubble included) and ``memory_per_device`` the worst device's peak.

The node table's labels gain the ``R`` too, and its memory column is the device of the highest peak.
"""

from __future__ import annotations

import dataclasses
import math
import re

from autoshard.pipeline.cuts import cut_collectives
from autoshard.pipeline.layers import boundary_bytes, part_costs, part_names, tied_weights, working_set
from autoshard.pipeline.schedules import chunk_sends, device_of_chunk, in_flight, p2p_time, tied_sync_time
from autoshard.pipeline.search import Candidate
from autoshard.pipeline.stages import StageSplit
from autoshard.pipeline.summary import degrees_of
from autoshard.plans import Collective, NodePlan, PipelinePlan, PipelineStage, Plan
from autoshard.report.labels import fmt_seconds, parse_label
from cost_models.overlap import SyncExposure

__all__ = ["assemble", "widen_label"]


def widen_label(label: str) -> str:
    """A strategy label on the stage sub-mesh written on the whole mesh: ``R`` first for the pipeline axis."""
    parsed = parse_label(label)

    def text(specs: tuple[tuple[str, ...] | None, ...]) -> str:
        return ", ".join("-" if sp is None else "(" + ", ".join(("R", *sp)) + ")" for sp in specs)

    return f"{text(parsed.inputs)} -> {text(parsed.outputs)}".strip()


def _modules(candidate: Candidate) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Modules owning parameters or buffers read before the repeated layers, and after them, in graph order
    (a buffer read on both sides is in both).  A weight read on both sides is tied (GPT-2's embedding and
    head): after the layers it is the module reading it (``lm_head``), which holds a copy there."""
    infos = candidate.built.infos
    order = list(infos)
    first = next(
        (i for i, n in enumerate(order) if infos[n].block is not None and infos[n].kind == "op"), len(order)
    )
    position = {name: i for i, name in enumerate(order)}
    pre: dict[str, None] = {}
    post: dict[str, None] = {}
    reads = [
        (consumer, infos[src])
        for consumer in infos.values()
        if consumer.block is None
        for src in consumer.inputs
        if infos[src].kind in ("parameter", "buffer") and infos[src].fqn and infos[src].block is None
    ]
    early = {info.name for consumer, info in reads if position[consumer.name] < first}
    for consumer, info in reads:
        owner = info.fqn.rpartition(".")[0]
        if position[consumer.name] < first:
            pre[owner] = None
        elif info.kind == "parameter" and info.name in early and consumer.module:
            post[consumer.module] = None  # a tied weight's copy, in the module reading it
        else:
            post[owner] = None
    return tuple(k for k in pre if k), tuple(k for k in post if k)


def _stages(candidate: Candidate, prefix: str, first: int = 0) -> tuple[PipelineStage, ...]:
    """One record per chunk.  The repeated run starts at layer ``first`` of ``prefix`` (DeepSeek-V3: dense
    layers, then MoE layers): the layers before it go whole to the first stage with the other ``pre`` modules,
    and chunk layer ``i`` is module ``prefix.{first + i}``; ``layers`` counts the model's layers."""
    split = candidate.split
    assert split is not None
    pre, post = _modules(candidate)
    pre += tuple(f"{prefix}.{j}" for j in range(first))
    group = candidate.layout.sub.num_devices
    chunks = len(split.bounds) - 1
    stages = []
    for c in range(chunks):
        start, end = first + split.bounds[c], first + split.bounds[c + 1]
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


def assemble(
    candidate: Candidate, intra: Plan, prefix: str | None, cluster_record: dict, first: int = 0
) -> Plan:
    """The whole-cluster plan (see the module docstring)."""
    m = candidate.microbatches
    if candidate.split is None:
        plan = dataclasses.replace(intra, microbatches=m)
        return dataclasses.replace(plan, degrees=degrees_of(plan))
    split = candidate.split
    where = candidate.layout

    def widen(p: tuple[str, ...]) -> tuple[str, ...]:
        return ("R", *p) if p else p

    tied = _tied_collectives(candidate)
    added, dropped = cut_collectives(candidate, intra.collectives, prefix, first)
    staged = (*(c for c in intra.collectives if c not in dropped), *added)
    collectives = (*(dataclasses.replace(c, mesh_axis=c.mesh_axis + 1) for c in staged), *tied)
    worst = max(range(split.degree), key=lambda d: split.forward[d] + split.backward[d])
    share = split.forward[worst] + split.backward[worst]
    total = sum(split.forward) + sum(split.backward)
    exposed, p2p, cut, sync = _exposed(candidate, worst, added, sum(c.seconds for c in tied))
    saved = _received_reduced(candidate, worst, dropped)  # priced per layer, not run: the cut reduced them
    exposed -= saved
    bubble = 1.0 - m * share / split.pipeline_seconds if split.pipeline_seconds > 0 else 0.0
    note = (
        f"{split.degree} pipeline stages on mesh axis 0 ('pp'); each stage runs the plan on its "
        f"sub-mesh {where.sub.mesh_shape}; compute time includes the bubble"
    )
    reconcile = (
        f"communication {fmt_seconds(exposed + p2p + cut)}: what pipeline rank {worst} (the busiest) waits "
        f"for -- {fmt_seconds(exposed)} of its stages' collectives (tensor-parallel moves and FSDP gathers "
        f"no compute hides, per microbatch x {m}, and the gradient sync tail)"
        + (f", {fmt_seconds(cut)} reducing its stage outputs at the cuts" if cut else "")
        + f", {fmt_seconds(p2p)} of p2p sends and tied-weight sums; "
        + _table_share(collectives, exposed, share / total if total > 0 else 1.0)
    )
    pipeline = PipelinePlan(
        stages=_stages(candidate, prefix or "", first),
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
        ring_transfers=tuple(dataclasses.replace(r, mesh_axis=r.mesh_axis + 1) for r in intra.ring_transfers),
        optimizer_gathers=tuple(
            dataclasses.replace(c, mesh_axis=c.mesh_axis + 1) for c in intra.optimizer_gathers
        ),
        nodes=_worst_device_nodes(candidate, intra),
        predicted_step_time=split.step_seconds + cut - saved,
        communication_time=exposed + p2p + cut,
        compute_time=split.step_seconds - saved - exposed - p2p,
        memory_per_device=max(split.memory),
        microbatches=m,
        pipeline=pipeline,
        notes=(*(_whole_axes(n) for n in intra.notes), note, reconcile),
        memory_breakdown=_stage_breakdown(intra, split),
        context_axis=None if intra.context_axis is None else intra.context_axis + 1,  # behind the 'pp' axis
        grad_buckets=(),  # stages sync once per step after the schedule (runtime/pipelining.py), unbucketed
        grad_sync=sync if intra.grad_sync is not None else None,  # the busiest rank's, as the step prices it
    )
    return dataclasses.replace(plan, degrees=degrees_of(plan, pipeline_axis=0))


def _stage_breakdown(intra: Plan, split: StageSplit) -> dict[str, float]:
    """What ``memory_per_device`` (the peak of the device of the highest,
    :func:`~autoshard.pipeline.stages.price_split`) holds beyond the node table: the reserve, and that
    device's gathered weights and largest temporary (not the whole-model plan's: listed beside the stage's
    total they made the report's activations negative, new-user trial: 8B ``--pp 2 --memory-limit 20``,
    "activations -187.7 MiB"; left out of it, the plan said 19.7 GiB of a 20 GiB budget and needed ~22)."""
    worst = max(range(split.degree), key=lambda d: split.memory[d])
    return {
        "runtime reserve": intra.memory_breakdown.get("runtime reserve", 0.0),
        "gathered weights": split.gathered[worst],
        "largest temporary": split.temporary[worst],
    }


_AXES = re.compile(r"\b(axis|axes) (\d+(?:(?:, | and )\d+)*)")


def _whole_axes(note: str) -> str:
    """A note about the stage sub-mesh with its axes numbered on the whole mesh (the pipeline's is axis 0)."""

    def shift(found: re.Match[str]) -> str:
        numbers = re.sub(r"\d+", lambda d: str(int(d.group()) + 1), found.group(2))
        return f"{found.group(1)} {numbers}"

    return _AXES.sub(shift, note)


def _tied_collectives(candidate: Candidate) -> tuple[Collective, ...]:
    """The all-reduce of each weight tied between the first and the last stage (Megatron-LM's embedding
    group, :mod:`autoshard.runtime.tied`), on the pipeline axis, once per step; none when one device holds
    both (ZB-V)."""
    split, where = candidate.split, candidate.layout
    assert split is not None
    chunks = len(split.bounds) - 1
    ends = {device_of_chunk(split.schedule, c, split.degree) for c in (0, chunks - 1)}
    if len(ends) == 1:
        return ()
    infos = candidate.built.infos
    return tuple(
        Collective(
            kind="all_reduce",
            nbytes=nbytes,
            phase="backward",
            mesh_axis=0,
            node=infos[name].fqn,
            tensor=name,
            module=infos[name].fqn.rpartition(".")[0],
            seconds=tied_sync_time(nbytes, where.p2p_bandwidth, where.p2p_latency),
        )
        for name, nbytes in tied_weights(candidate.built, candidate.solution)
    )


def _exposed(
    candidate: Candidate, worst: int, added: tuple[Collective, ...], tied: float
) -> tuple[float, float, float, SyncExposure]:
    """Seconds per step device ``worst`` waits for communication: (its stages' exposed collectives, its p2p
    sends and tied-weight sums, the reductions at its cuts, which the stage DP does not price), and the
    gradient sync of the layers and parts it holds, once per step (new-user trial: the report printed the
    whole model's sync on one stage's sub-mesh, "1.816 s, 1.033 s exposed" beside 328.65 ms of exposed
    communication in the step)."""
    split, m = candidate.split, candidate.microbatches
    assert split is not None
    costs = part_costs(candidate.built, candidate.solution)
    layer, pre, post = costs.exposed_comm
    chunks = len(split.bounds) - 1
    per_microbatch = once = sends = cut = 0.0
    held = 0
    mine = [c for c in range(chunks) if device_of_chunk(split.schedule, c, split.degree) == worst]
    for c in mine:
        k = split.bounds[c + 1] - split.bounds[c]
        held += k
        per_microbatch += k * layer + (costs.gather_head if k else 0.0)
        per_microbatch += pre * (c == 0) + post * (c == chunks - 1)
        once += costs.exposed_once[0] * (c == 0) + costs.exposed_once[1] * (c == chunks - 1)
        sends += sum(chunk_sends(split.schedule, c, chunks, split.degree))  # none within a device
        cut += math.fsum(
            a.seconds for a in added if a.node == "output" and a.layer == split.bounds[c + 1] - 1
        )
    ends = {device_of_chunk(split.schedule, c, split.degree) for c in (0, chunks - 1)}
    p2p = m * sends * _p2p_seconds(candidate) + (tied if worst in ends and len(ends) > 1 else 0.0)
    synced = costs.exposed_sync(held, 0 in mine, chunks - 1 in mine)
    layer_sync, pre_sync, post_sync = costs.sync_seconds
    seconds = held * layer_sync + pre_sync * (0 in mine) + post_sync * (chunks - 1 in mine)
    sync = SyncExposure(max(seconds, synced), synced)  # the stream's exposure never exceeds what it holds
    return m * per_microbatch + once + synced, p2p, cut, sync


def _received_reduced(candidate: Candidate, worst: int, dropped: tuple[Collective, ...]) -> float:
    """Seconds per step of the reductions device ``worst``'s chunks do not run: each chunk's first layer
    receives its input already reduced (:func:`~autoshard.pipeline.cuts.cut_collectives`)."""
    split = candidate.split
    assert split is not None
    starts = {
        split.bounds[c]
        for c in range(1, len(split.bounds) - 1)
        if device_of_chunk(split.schedule, c, split.degree) == worst
    }
    return math.fsum(c.seconds for c in dropped if c.layer in starts)


def _table_share(collectives: tuple[Collective, ...], exposed: float, share: float) -> str:
    """The collectives table's total and what of it one rank runs (its share of the compute); "lists
    none" when nothing in it takes a printable time (new-user trial: "about 0.0 us (51.7%)")."""
    table = math.fsum(c.seconds for c in collectives)
    if fmt_seconds(table) == fmt_seconds(0.0):
        return "the collectives table lists none that takes measurable time"
    mine = table * share
    return (
        f"the collectives table lists {fmt_seconds(table)} for every stage and microbatch, of which this "
        f"rank runs about {fmt_seconds(mine)} ({share:.1%}): {fmt_seconds(max(0.0, mine - exposed))} of it "
        "overlapped with compute"
    )


def _p2p_seconds(candidate: Candidate) -> float:
    where = candidate.layout
    nbytes = boundary_bytes(candidate.built, candidate.solution)
    return p2p_time(nbytes, where.p2p_bandwidth, where.p2p_latency)


def _worst_device_nodes(candidate: Candidate, intra: Plan) -> tuple[NodePlan, ...]:
    """The node table with labels on the whole mesh and memory as the device of the highest peak holds it:
    its layers' share of each layer node, its microbatches in flight on activations, ``pre`` / ``post``
    nodes only when it holds the first / last chunk."""
    split = candidate.split
    assert split is not None
    chunks = len(split.bounds) - 1
    worst = max(range(split.degree), key=lambda d: split.memory[d])
    mine = [c for c in range(chunks) if device_of_chunk(split.schedule, c, split.degree) == worst]
    layers = sum(split.bounds[c + 1] - split.bounds[c] for c in mine)
    flight = in_flight(split.schedule, worst, split.degree, split.virtual, split.microbatches)
    built = candidate.built
    infos, total = built.infos, max(1, built.num_blocks)
    parts = part_names(built)  # as the stage DP counts a device's memory (layers.part_costs)
    readers: dict[str, set[str]] = {}
    for use in built.edges:  # a parameter is held where it is read (a tied one at both ends)
        if infos[use.producer].kind == "parameter":
            readers.setdefault(built.template[use.producer], set()).add(parts[use.consumer])
    holds = {"layer"} if layers else set()
    holds |= ({"pre"} if 0 in mine else set()) | ({"post"} if chunks - 1 in mine else set())
    chosen = {
        v: built.strategies[v][k]
        for v, k in zip(built.variables, candidate.solution.choice[: len(built.variables)], strict=True)
    }
    rows = []
    for row in intra.nodes:
        info = infos.get(row.name)
        static = info is not None and info.kind in ("parameter", "buffer", "constant")
        if info is not None and info.block is not None:
            share = layers / total
            # the recompute working set is held once, not per layer and microbatch (part_costs: ``working``)
            working = working_set(built, row.name, chosen[row.name])
            if working:
                count = built.multiplicity[row.name]
                memory = (row.memory_bytes - working) * share * flight + working * count / total * bool(
                    layers
                )
                rows.append(dataclasses.replace(row, strategy=widen_label(row.strategy), memory_bytes=memory))
                continue
        elif info is not None and info.kind == "parameter":
            share = 1.0 if readers.get(row.name, {parts[row.name]}) & holds else 0.0
        else:  # ops and buffers outside the layers: on the device of the first / the last chunk
            share = 1.0 if info is not None and parts[row.name] in holds else 0.0
        memory = row.memory_bytes * share * (1.0 if static else flight)
        rows.append(dataclasses.replace(row, strategy=widen_label(row.strategy), memory_bytes=memory))
    return tuple(rows)
