"""From one intra-op solution to the stage DP's per-part costs: one layer, the part before, the part after.

Input: a :class:`~autoshard.problem.build.BuiltProblem` of a model captured at one microbatch's shapes on a
stage's sub-mesh, and its :class:`~autoshard.search.Solution`.
Output: :class:`~autoshard.pipeline.stages.StageCosts` (without the p2p time, which the caller adds).

Every figure comes from the same cost functions the solver was fed (:mod:`autoshard.problem.costs`) and is
overlapped as :func:`~autoshard.problem.step.critical_path` overlaps the intra-op plan's (:mod:`cost_models.overlap`),
so a stage of ``k`` layers is priced as the intra-op planner prices a plan of those parts on its sub-mesh:

* compute: each node's forward and backward (recomputation included); a repeated layer's share is its nodes'
  costs divided by ``N``; a node outside the layers belongs to ``pre`` when it comes before the first
  layer's first node in graph order, else to ``post``;
* collectives (:func:`~autoshard.problem.extract.plan_collectives`, one record per layer copy, so shared
  redistributions count once): tensor parallel and resharding exposed, per microbatch, where their consumer
  is; a layer's FSDP all-gather prefetched under the previous layer's forward, so a chunk of ``k`` layers
  exposes ``g`` once (:attr:`StageCosts.gather_head`) and ``max(0, g - f)`` per layer;
* gradient synchronisation once per step, as ``critical_path`` prices it: every gradient ready where its
  parameter's first consumer's backward ends (:mod:`autoshard.problem.ready`), bucketed and hidden under
  the backward that follows in the last microbatch (:attr:`StageCosts.sync_parts`, by layer count and
  whether the device holds the part before / after the layers, one :class:`cost_models.overlap.SyncStream`);
* memory: a tied parameter (GPT-2's embedding and head) counts in every part that reads it, as each stage
  holding a reader keeps a copy; the bytes of its local gradient, which the copies sum every step when the
  first and last stage differ (:attr:`StageCosts.tied_bytes`, :func:`tied_weights`);
* memory no node owns (:mod:`autoshard.problem.extras`, at the plan's choice, :func:`held_extras`): one
  layer's gathered FSDP weights, those of ``pre`` and of ``post``, each part's largest temporary, and one
  layer's recompute working set (:func:`working_set`); :meth:`~autoshard.pipeline.stages.StageCosts.held`
  puts on each device what it holds of them;
* the precision recipe (``CostOptions.precision``): a tied gradient's bytes and the activations sent
  between stages (:func:`boundary_bytes`) are the recipe's (amp: fp32 gradients and residual stream).

Also here: :func:`stage_memory_problem`, the search problem's memory re-weighted for one stage, so that the
intra-op search on the sub-mesh fits the stage that holds ``L / p`` layers (the largest share any stage can
have when cuts are balanced) and its microbatches in flight.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections import defaultdict

import numpy as np

from autoshard.pipeline.stages import Part, StageCosts
from autoshard.placement import Shard
from autoshard.problem.autocast import autocast_scale
from autoshard.problem.build import BuiltProblem
from autoshard.problem.costs import node_compute, node_memory, optimizer_time
from autoshard.problem.extract import plan_collectives
from autoshard.problem.ready import Backward, Unit, backward_units, unit_backward
from autoshard.problem.recompute import rebuilds
from autoshard.problem.zero_gathers import zero_gathers
from autoshard.search import SearchProblem, Solution
from autoshard.strategies import OpStrategy
from cost_models.overlap import SyncStream

__all__ = [
    "boundary_bytes",
    "held_extras",
    "part_costs",
    "part_names",
    "rematerialised",
    "runtime_reserve",
    "stage_memory_problem",
    "tied_weights",
    "working_set",
]

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


def part_names(built: BuiltProblem) -> dict[str, str]:
    """Each node's part by name, ``"pre"``, ``"layer"`` or ``"post"`` (the split :func:`part_costs` prices):
    which chunks run it (the first, every one, the last)."""
    return {name: ("pre", "layer", "post")[part] for name, part in _where(built).items()}


def part_costs(built: BuiltProblem, solution: Solution) -> StageCosts:
    """Split the chosen plan's costs into one layer, pre and post (per device, per microbatch), priced as
    :func:`~autoshard.problem.step.critical_path` prices the intra-op plan (module docstring)."""
    opts, cluster, n = built.options, built.cluster, max(1, built.num_blocks)
    m = opts.microbatches
    chosen = {
        v: built.strategies[v][k]
        for v, k in zip(built.variables, solution.choice[: len(built.variables)], strict=True)
    }
    where = _where(built)
    sums: list[defaultdict[str, float]] = [defaultdict(float) for _ in range(3)]
    readers: dict[str, set[int]] = defaultdict(set)
    for use in built.edges:
        if built.infos[use.producer].kind == "parameter":
            readers[built.template[use.producer]].add(where[use.consumer])
    layer_fwd = layer_bwd = 0.0
    for name in built.variables:
        info, strat = built.infos[name], chosen[name]
        part, count = where[name], built.multiplicity[name]
        share = count / n if part == _LAYER else float(count)
        fwd, bwd = node_compute(info, strat, cluster, opts, tuple(built.infos[s] for s in info.inputs))
        sums[part]["forward"] += fwd * share
        sums[part]["backward"] += bwd * share
        if part == _LAYER:
            layer_fwd, layer_bwd = layer_fwd + fwd * share, layer_bwd + bwd * share
        sums[part]["once"] += optimizer_time(info, strat, cluster, opts) * share
        memory = node_memory(info, strat, cluster, opts, built.keeps.get(name, True))
        if info.kind == "parameter":
            for reader in readers.get(name, {part}):
                sums[reader]["static"] += memory
        elif info.kind in ("buffer", "constant"):
            sums[part]["static"] += memory
        else:
            sums[part]["activation"] += memory
    gather = regather = 0.0  # one layer's, per microbatch
    exposed = [0.0, 0.0, 0.0]  # per microbatch, by part: the collectives added to forward / backward
    once = [0.0, 0.0, 0.0]  # per step, by part: syncs no unit's backward can hide
    synced = [0.0, 0.0, 0.0]  # per step, by part (a layer: one copy's mean): every gradient sync
    units = backward_units(built)
    syncs: dict[Unit, dict[str, list[float]]] = defaultdict(dict)  # per step: unit -> parameter -> [s, bytes]
    for c in plan_collectives(built, solution):
        moved = built.infos.get(c.tensor)
        parameter = moved is not None and moved.kind == "parameter"
        if c.layer is not None:
            part, share = _LAYER, 1.0 / n
        elif parameter and c.phase == "backward":  # a sync serves the parameter: its first reader's stage
            part, share = min(readers.get(c.tensor, {_PRE})), 1.0
        else:  # everything else serves its consumer (a tied head's gather runs where the head does)
            part, share = where.get(c.node, _POST), 1.0
        if c.phase == "backward" and parameter:  # gradient synchronisation: once per step
            synced[part] += c.seconds * share
            ready = units.ready.get(c.tensor)
            if part != _LAYER and not isinstance(ready, str):  # no unit outside the layers: exposed in full
                sums[part]["once"] += c.seconds
                once[part] += c.seconds
                continue
            unit: Unit = _LAYER if part == _LAYER or ready is None else ready
            entry = syncs[unit].setdefault(c.tensor, [0.0, 0.0])  # one layer: the copies' mean
            entry[0], entry[1] = entry[0] + c.seconds * share, entry[1] + c.nbytes * share
            continue
        seconds = c.seconds * share / m
        if c.phase == "forward" and c.kind == "all_gather" and parameter and part == _LAYER:
            gather += seconds  # FSDP: prefetched under the previous layer's forward
            continue
        if c.phase == "regather" and part == _LAYER:
            regather += seconds  # FSDP's backward re-gather: prefetched under the next layer's backward
            continue
        sums[part]["backward" if c.phase == "regather" else c.phase] += seconds  # TP, resharding: exposed
        exposed[part] += seconds
    pick = {name: chosen[built.template[name]] for name in built.infos}
    for c in zero_gathers(built, pick):  # ZeRO-1's, after backward, once per step: with the optimizer update
        reader = min(readers.get(built.template.get(c.tensor, c.tensor), {_PRE}))
        part, share = (_LAYER, 1.0 / n) if c.layer is not None else (reader, 1.0)
        sums[part]["once"] += c.seconds * share
    per_layer = max(0.0, gather - layer_fwd)  # what the previous layer's forward does not hide
    sums[_LAYER]["forward"] += per_layer
    per_layer_back = max(0.0, regather - layer_bwd)  # what the next layer's backward does not hide
    sums[_LAYER]["backward"] += per_layer_back
    tables = _sync_tables(built, chosen, where, units, syncs, layer_bwd, n)
    pre, layer, post = (Part(**dict(s)) for s in sums)
    gathered, temporary = held_extras(built, solution)
    tied = sum(nbytes for _, nbytes in tied_weights(built, solution))
    return StageCosts(
        layer,
        pre,
        post,
        n,
        p2p_seconds=0.0,
        reserve=runtime_reserve(built),
        # a chunk's first gather has no previous layer, its last re-gather no next one: exposed whole
        gather_head=gather - per_layer + regather - per_layer_back,
        sync_exposed=tables[(False, False)],
        sync_parts=tables,
        tied_bytes=float(tied),
        exposed_comm=(exposed[_LAYER] + per_layer + per_layer_back, exposed[_PRE], exposed[_POST]),
        exposed_once=(once[_PRE], once[_POST]),
        sync_seconds=(synced[_LAYER], synced[_PRE], synced[_POST]),
        gathered=gathered,
        gather_depth=1 + opts.overlap.prefetch,
        temporary=temporary,
        # one layer's: a node standing for ``count`` of the ``n`` layers counts ``count / n`` of its own
        working=math.fsum(
            working_set(built, v, chosen[v]) * built.multiplicity[v] / n for v in built.variables
        ),
    )


def working_set(built: BuiltProblem, name: str, strategy: OpStrategy) -> float:
    """Bytes of a layer node's recompute working set under ``strategy``: what re-running its layer in
    backward re-materialises of its output, ``kept - dropped``, held once however many layers the node stands
    for (:func:`~autoshard.problem.recompute.memory_total`); 0 outside the layers or without recomputation."""
    if not rematerialised(built, name):
        return 0.0
    info, opts = built.infos[name], built.options
    kept = node_memory(info, strategy, built.cluster, opts, True)
    return kept - node_memory(info, strategy, built.cluster, opts, False)


def rematerialised(built: BuiltProblem, name: str) -> bool:
    """Whether backward re-runs node ``name`` to rebuild an output it did not keep (:func:`working_set`)."""
    return rebuilds(built.infos[name], built.options, built.keeps.get(name, True))


def held_extras(
    built: BuiltProblem, solution: Solution
) -> tuple[tuple[float, float, float], tuple[float, float, float]]:
    """(gathered weights, largest temporary) of one layer, ``pre`` and ``post`` under ``solution``: the
    builder's memory terms no node owns (:mod:`autoshard.problem.extras`) split by the part that runs them.
    A gather belongs to its consumer's part; a layer's is one layer's (the stack's gathers over the distinct
    layers holding them, the prefetch factor taken out: :attr:`StageCosts.gather_depth` puts it back), and
    a weight outside the layers gathered for one counts whole in each layer (an upper bound)."""
    extras = built.extras
    if extras is None:
        return (0.0, 0.0, 0.0), (0.0, 0.0, 0.0)
    where = _where(built)
    index = dict(zip(built.variables, solution.choice[: len(built.variables)], strict=True))
    gathered, stacked, blocks = [0.0, 0.0, 0.0], 0.0, set[int]()
    for g in extras.gathers:
        size = g.sizes[int(g.have[index[g.producer]]), int(g.want[index[g.consumer]])]
        block = built.infos[g.producer].block
        if block is not None:  # extras.py counts ``1 + prefetch`` layers' worth: StageCosts.held does
            stacked, blocks = stacked + size, blocks | {block[0]}
        else:
            gathered[where[g.consumer]] += size
    gathered[_LAYER] += stacked / max(1, len(blocks))
    temporary = [0.0, 0.0, 0.0]
    for name, t in zip(built.variables, extras.temporary, strict=False):
        part = where[name]
        temporary[part] = max(temporary[part], float(t[index[name]]))
    return (gathered[_LAYER], gathered[_PRE], gathered[_POST]), (
        temporary[_LAYER],
        temporary[_PRE],
        temporary[_POST],
    )


def _sync_tables(
    built: BuiltProblem,
    chosen: dict[str, OpStrategy],
    where: dict[str, int],
    units: Backward,
    syncs: dict[Unit, dict[str, list[float]]],
    layer_bwd: float,
    n: int,
) -> dict[tuple[bool, bool], tuple[float, ...]]:
    """(pre held, post held) -> [k]: the exposed gradient sync of a device holding k layers and those parts,
    fed to one :class:`~cost_models.overlap.SyncStream` in backward order as ``critical_path`` feeds it."""
    policy = built.options.overlap
    outside = [u for u in units.order if isinstance(u, str)]
    backward = {  # what hides syncs: not the backward after the final unit's (autoshard.problem.ready)
        u: unit_backward(built, u, chosen[built.template[u]]) if units.hides(u) else 0.0 for u in outside
    }

    def feed(stream: SyncStream, unit: Unit, seconds: float) -> None:
        members = syncs[unit].values() if unit in syncs else ()
        stream.add(seconds, sum(s for s, _ in members), sum(b for _, b in members))  # as critical_path

    tables: dict[tuple[bool, bool], tuple[float, ...]] = {}
    for pre, post in itertools.product((False, True), repeat=2):
        if not policy.overlap_grad_sync:  # all after backward: the sum of what the device holds
            held = [u for u in outside if (pre and where[u] == _PRE) or (post and where[u] == _POST)]
            fixed = sum(s for u in held if u in syncs for s, _ in syncs[u].values())
            per = sum(s for s, _ in syncs[_LAYER].values()) if _LAYER in syncs else 0.0
            tables[(pre, post)] = tuple(fixed + k * per for k in range(n + 1))
            continue
        stream, row = SyncStream(policy.bucket_bytes), []
        for u in reversed(outside):  # backward: the part after the layers first
            if post and where[u] == _POST:
                feed(stream, u, backward[u])
        for k in range(n + 1):
            if k:
                feed(stream, _LAYER, layer_bwd)
            tail = stream.copy()
            for u in reversed(outside):  # then, after the layers, the part before them
                if pre and where[u] == _PRE:
                    feed(tail, u, backward[u])
            row.append(tail.exposed())
        tables[(pre, post)] = tuple(row)
    return tables


def tied_weights(built: BuiltProblem, solution: Solution) -> list[tuple[str, int]]:
    """(parameter node, local gradient bytes) of every trained weight read both before and after the layers
    (a tied embedding and head): with stages, the first and the last stage each hold a copy."""
    where = _where(built)
    sides: dict[str, set[int]] = defaultdict(set)
    for use in built.edges:
        if built.infos[use.producer].kind == "parameter" and where[use.consumer] != _LAYER:
            sides[built.template[use.producer]].add(where[use.consumer])
    chosen = dict(zip(built.variables, solution.choice[: len(built.variables)], strict=True))
    found = []
    for name, seen in sides.items():
        info = built.infos[name]
        meta = info.outputs[0] if info.outputs else None
        if seen != {_PRE, _POST} or not info.requires_grad or meta is None:
            continue
        spec = built.strategies[name][chosen[name]].outputs[0]
        grads = meta.numel * built.options.grad_bytes(meta.itemsize)  # the recipe's (amp: fp32 gradients)
        found.append((name, int(grads // _shards(spec, built.cluster.mesh_shape))))
    return found


def _shards(spec: object, mesh: tuple[int, ...]) -> int:
    shards = 1
    for placement, size in zip(getattr(spec, "placements", ()) or (), mesh, strict=False):
        shards *= size if isinstance(placement, Shard) else 1
    return shards


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
        amp = (
            autocast_scale(u, built.options.precision) if use.which == 0 else 1.0
        )  # amp: fp32 residual stream
        total += meta.nbytes * amp / _shards(spec, mesh)
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
