"""From one intra-op solution to the stage DP's per-part costs: one layer, the part before, the part after.

Input: a :class:`~autoshard.problem.build.BuiltProblem` of a model captured at one microbatch's shapes on a
stage's sub-mesh, and its :class:`~autoshard.search.Solution`.
Output: :class:`~autoshard.pipeline.stages.StageCosts` (without the p2p time, which the caller adds).

Every figure comes from the same cost functions the solver was fed (:mod:`autoshard.problem.costs`): a
node's forward and backward compute, an edge's forward and backward redistribution, the optimizer, memory.
A repeated layer's share is its nodes' costs plus its edges' weighted costs divided by ``N``; a node outside
the layers belongs to ``pre`` when it comes before the first layer's first node in graph order, else to
``post``; an edge belongs where its consumer does (its producer, when only that is in a layer).  A
parameter edge's backward is gradient synchronisation, paid once per step; everything else per microbatch.
A tied parameter (GPT-2's embedding and head) counts its memory in every part that reads it, as each stage
holding a reader keeps a copy.

Also here: :func:`stage_memory_problem`, the search problem's memory re-weighted for one stage, so that the
intra-op search on the sub-mesh fits the stage that holds ``L / p`` layers (the largest share any stage can
have when cuts are balanced) and its microbatches in flight.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import numpy as np

from autoshard.pipeline.stages import Part, StageCosts
from autoshard.placement import Shard
from autoshard.problem.build import BuiltProblem
from autoshard.problem.costs import (
    edge_steps,
    node_compute,
    node_memory,
    optimizer_time,
    output_fix_steps,
    steps_time,
)
from autoshard.problem.dispatch import dispatch_times
from autoshard.search import SearchProblem, Solution

__all__ = ["boundary_bytes", "part_costs", "runtime_reserve", "stage_memory_problem"]

_PRE, _LAYER, _POST = 0, 1, 2


def _where(built: BuiltProblem) -> dict[str, int]:
    """Each node's part: pre, layer or post."""
    order = list(built.infos)
    first = next(
        (i for i, n in enumerate(order) if built.infos[n].block is not None and built.infos[n].kind == "op"),
        len(order),
    )
    return {
        name: _LAYER if built.infos[name].block is not None else (_PRE if i < first else _POST)
        for i, name in enumerate(order)
    }


def part_costs(built: BuiltProblem, solution: Solution) -> StageCosts:
    """Split the chosen plan's costs into one layer, pre and post (per device, per microbatch)."""
    opts, cluster, n = built.options, built.cluster, max(1, built.num_blocks)
    chosen = {
        v: built.strategies[v][k]
        for v, k in zip(built.variables, solution.choice[: len(built.variables)], strict=True)
    }
    pick = {name: chosen[built.template[name]] for name in built.infos}
    where = _where(built)
    sums: list[defaultdict[str, float]] = [defaultdict(float) for _ in range(3)]
    readers: dict[str, set[int]] = defaultdict(set)
    for use in built.edges:
        producer = built.infos[use.producer]
        part = _LAYER if _LAYER in (where[use.consumer], where[use.producer]) else where[use.consumer]
        scale = use.weight / n if part == _LAYER else float(use.weight)
        steps = edge_steps(
            producer, use.which, pick[use.producer], pick[use.consumer], use.position, opts, built.cache
        )
        sums[part]["forward"] += steps_time(steps.forward, cluster) * scale
        key = "once" if producer.kind == "parameter" else "backward"
        sums[part][key] += steps_time(steps.backward, cluster) * scale
        if producer.kind == "parameter":
            readers[built.template[use.producer]].add(where[use.consumer])
    for name in built.variables:
        info, strat = built.infos[name], chosen[name]
        part = where[name]
        inputs = tuple(built.infos[s] for s in info.inputs)
        fwd, bwd = node_compute(info, strat, cluster, opts, inputs)
        a2a_fwd, a2a_bwd = dispatch_times(info, strat, cluster, inputs)  # all-to-all token dispatch
        fwd, bwd = fwd + a2a_fwd, bwd + (a2a_bwd if opts.training else 0.0)
        if info.is_output:
            fwd += steps_time(output_fix_steps(info, strat, built.cache), cluster)
        sums[part]["forward"] += fwd
        sums[part]["backward"] += bwd
        sums[part]["once"] += optimizer_time(info, strat, cluster, opts)
        memory = node_memory(info, strat, cluster, opts, built.keeps.get(name, True))
        if info.kind == "parameter":
            for reader in readers.get(name, {part}):
                sums[reader]["static"] += memory
        elif info.kind in ("buffer", "constant"):
            sums[part]["static"] += memory
        else:
            sums[part]["activation"] += memory
    pre, layer, post = (Part(**dict(s)) for s in sums)
    return StageCosts(layer, pre, post, n, p2p_seconds=0.0, reserve=runtime_reserve(built))


def boundary_bytes(built: BuiltProblem, solution: Solution) -> float:
    """Bytes one device sends between consecutive layers per microbatch: the local shard of every tensor
    that flows from layer 0 into layer 1 (the residual stream), once per tensor."""
    chosen = {
        v: built.strategies[v][k]
        for v, k in zip(built.variables, solution.choice[: len(built.variables)], strict=True)
    }
    total, seen = 0.0, set()
    mesh = built.cluster.mesh_shape
    for use in built.edges:
        u, v = built.infos[use.producer], built.infos[use.consumer]
        if u.block is None or v.block is None or u.block[0] == v.block[0] or (u.name, use.which) in seen:
            continue
        seen.add((u.name, use.which))
        meta = u.outputs[use.which]
        spec = chosen[built.template[u.name]].outputs[use.which]
        if meta is None:
            continue
        shards = 1
        for placement, size in zip(spec.placements if spec else (), mesh, strict=False):
            shards *= size if isinstance(placement, Shard) else 1
        total += meta.nbytes / shards
    return total


def stage_memory_problem(built: BuiltProblem, degree: int, in_flight: float) -> SearchProblem:
    """The problem with memory re-weighted for one of ``degree`` stages: a layer's parameter state counts
    ``1 / degree`` (the stage holds ``L / degree`` layers), its activations ``in_flight / degree``
    (microbatches in flight through those layers); the parts outside the layers count whole (the first or
    last stage holds them) and their activations ``in_flight`` times."""
    problem = built.problem
    if problem.memory is None:
        return problem
    reserve = runtime_reserve(built)
    memory = []
    graph_nodes = problem.memory[: len(built.variables)]  # fan-out nodes follow, holding nothing
    for k, (name, mem) in enumerate(zip(built.variables, graph_nodes, strict=True)):
        info = built.infos[name]
        static = info.kind in ("parameter", "buffer", "constant")
        layer = 1.0 / degree if info.block is not None else 1.0
        own = np.asarray(mem) - (reserve if k == 0 else 0.0)  # the builder put the reserve on node 0
        memory.append(own * layer * (1.0 if static else in_flight) + (reserve if k == 0 else 0.0))
    memory += problem.memory[len(built.variables) :]
    return dataclasses.replace(problem, memory=tuple(memory))


def runtime_reserve(built: BuiltProblem) -> float:
    """Bytes every device holds before the model (profile ``memory.runtime_reserve``; 0 when absent)."""
    return float(getattr(built.cluster.profile.memory, "runtime_reserve", 0.0))
