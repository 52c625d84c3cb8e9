"""Turn the solver's choice back into a :class:`~autoshard.plans.Plan`.

Input: a :class:`~autoshard.problem.build.BuiltProblem` and a :class:`~autoshard.search.Solution`.
Output: a :class:`~autoshard.plans.Plan` whose figures are recomputed from the same cost functions the solver
was fed (``autoshard.problem.costs``).  Its predicted step time is the critical path under the overlap policy
(:mod:`autoshard.problem.step`): the solver's objective, less the communication that compute hides.

Repeated layers are expanded: every layer's parameters get their placement, and every collective is listed
once per layer it occurs in (``Collective.layer``), so counts in the plan are counts in the full model.
"""

from __future__ import annotations

import re

from autoshard.placement import ShardingSpec
from autoshard.plans import Collective, NodePlan, Plan, SolverReport
from autoshard.problem.build import BuiltProblem, EdgeUse
from autoshard.problem.context import choose_layout, context_degrees
from autoshard.problem.costs import (
    COLLECTIVE_KINDS,
    dual_spec,
    edge_steps,
    node_compute,
    optimizer_time,
    output_fix_steps,
    repeats,
)
from autoshard.problem.dispatch import dispatch_steps, rerun_in_backward
from autoshard.problem.extras import extra_memory as extra_memory_of
from autoshard.problem.fanout import element_of
from autoshard.problem.layers import LayerNamer
from autoshard.problem.recompute import (
    node_memory_total,
    recompute_blocks,
    recomputed_layers,
    regathered,
    reissued,
    rerun_share,
)
from autoshard.problem.ring_hops import ring_transfers
from autoshard.problem.runs import reads_into_run
from autoshard.problem.step import critical_path
from autoshard.problem.zero_gathers import zero_gathers
from autoshard.redistribute import Step
from autoshard.search import Solution
from autoshard.strategies import OpStrategy

__all__ = ["extract_plan", "plan_collectives"]


def extract_plan(
    built: BuiltProblem,
    solution: Solution,
    *,
    model: str,
    block_prefix: str | None,
    output_order: tuple[str, ...],
    timings: dict[str, float],
    notes: tuple[str, ...] = (),
    memory_limit: float | None = None,
    block_first: int = 0,
) -> Plan:
    chosen = {
        name: built.strategies[name][k]
        for name, k in zip(built.variables, solution.choice[: len(built.variables)], strict=True)
    }
    pick = {name: chosen[built.template[name]] for name in built.infos}
    layer_of = LayerNamer(built, block_prefix, block_first)
    nodes, compute, memory = _node_table(built, chosen)
    collectives = _edge_collectives(built, pick, layer_of) + _output_collectives(built, chosen, layer_of)
    collectives += _dispatch_collectives(built, chosen, layer_of)
    step, _exposed, grad_sync, grad_buckets = critical_path(built, chosen, collectives, compute)
    context = choose_layout(built, chosen, collectives)  # the ring axis's sequence layout, and its price
    step += context.extra_seconds
    optimizer_gathers = zero_gathers(built, pick, layer_of.module)  # after backward, no overlap: exposed
    step += sum(c.seconds for c in optimizer_gathers)
    comm = sum(c.seconds for c in (*collectives, *optimizer_gathers))  # every collective the step priced
    notes = (*notes, context.note) if context.note else notes
    full = tuple(solution.choice)
    if len(full) != built.problem.num_nodes:  # a choice of the variables alone (hand-made plans)
        full = built.full_choice(full[: len(built.variables)])
    reserve = float(built.cluster.profile.memory.runtime_reserve)
    extra_memory = extra_memory_of(built.extras, full, reserve)  # the terms the budget saw (problem/extras)
    total_memory = memory + sum(extra_memory.values())
    if memory_limit is not None and total_memory > memory_limit * (1 + 1e-9):
        over = total_memory - memory_limit
        notes = (
            *notes,
            f"memory {total_memory / 2**30:.2f} GiB per device is {over / 2**30:.2f} GiB over the budget of the "
            "whole model: the plan was sized for a pipeline stage or a pinned plan",
        )
    cluster = built.cluster
    return Plan(
        model=model,
        cluster={
            "profile": cluster.profile.name,
            "nodes": cluster.nodes,
            "mesh_shape": list(cluster.mesh_shape),
            "axis_names": list(cluster.axis_names),
            "devices": cluster.num_devices,
            "description": cluster.describe(),
            "profile_origin": str(getattr(cluster.profile, "origin", "")),
        },
        mesh_shape=tuple(cluster.mesh_shape),
        training=built.options.training,
        param_placements=_param_placements(built, pick, layer_of),
        input_placements={
            info.name: _strings(pick[info.name].outputs[0])
            for info in built.infos.values()
            if info.kind == "user_input" and pick[info.name].outputs[0] is not None
        },
        output_placements=tuple(_strings(dual_spec(pick[name].outputs[0])) for name in output_order),
        input_shapes={
            info.name: (info.outputs[0].shape, info.outputs[0].dtype)
            for info in built.infos.values()
            if info.kind == "user_input" and info.outputs[0] is not None
        },
        nodes=nodes,
        collectives=tuple(collectives),
        optimizer_gathers=optimizer_gathers,  # in the step and the objective (problem/zero_terms.py)
        predicted_step_time=step,  # the critical path under options.overlap (autoshard.problem.step)
        compute_time=compute,
        communication_time=comm,
        memory_per_device=total_memory,
        device_memory=float(cluster.device_memory),
        solver=SolverReport(
            method=solution.method,
            objective=solution.objective,
            lower_bound=solution.lower_bound,
            gap=solution.gap,
            optimal=solution.optimal,
            seconds=solution.seconds,
            log=tuple(solution.log),
        ),
        timings=dict(timings),
        notes=notes + built.notes,
        recompute=built.options.recompute.value,
        recompute_blocks=recompute_blocks(built.options, built.num_blocks),
        memory_limit=memory_limit,
        degrees=context_degrees(built.infos, chosen, tuple(cluster.mesh_shape)),
        context_axis=context.axis,
        context_layout=context.layout,
        ring_transfers=ring_transfers(built, chosen, decision_nodes(built)),  # K/V hops: report only
        overlap=built.options.overlap,
        memory_breakdown=extra_memory,
        grad_sync=grad_sync,  # what of the gradient sync the step pays, and why (problem/step.py)
        grad_buckets=grad_buckets,  # its buckets, as the runtime issues them (runtime/overlap.py)
    )


def plan_collectives(built: BuiltProblem, solution: Solution) -> tuple[Collective, ...]:
    """The collectives of the chosen plan, one record per layer copy, as :func:`extract_plan` lists them
    (``seconds`` per step).  The pipeline's stage pricing splits these into its parts."""
    chosen = {
        name: built.strategies[name][k]
        for name, k in zip(built.variables, solution.choice[: len(built.variables)], strict=True)
    }
    pick = {name: chosen[built.template[name]] for name in built.infos}
    namer = LayerNamer(built, None)
    collectives = _edge_collectives(built, pick, namer) + _output_collectives(built, chosen, namer)
    return tuple(collectives + _dispatch_collectives(built, chosen, namer))


def _strings(spec: ShardingSpec | None) -> tuple[str, ...]:
    return spec.as_strings() if spec is not None else ()


def _node_table(
    built: BuiltProblem, chosen: dict[str, OpStrategy]
) -> tuple[tuple[NodePlan, ...], float, float]:
    rows: list[NodePlan] = []
    total_compute = total_memory = 0.0
    outside = 0
    for name in decision_nodes(built):
        info, strat, count = built.infos[name], chosen[built.template[name]], _count(built, name)
        if info.block is not None and built.num_blocks > 1:  # one decision for every layer
            key = f"block:{info.block[1]}"
        else:
            key, outside = f"outside:{outside}", outside + 1
        inputs = tuple(built.infos[s] for s in info.inputs)
        fwd, bwd = node_compute(info, strat, built.cluster, built.options, inputs)
        per_step = (fwd + bwd) * built.options.microbatches
        compute = (per_step + optimizer_time(info, strat, built.cluster, built.options)) * count
        keeps = built.keeps.get(name, True)
        memory = node_memory_total(info, strat, built.cluster, built.options, keeps, count)
        total_compute += compute
        total_memory += memory
        rows.append(
            NodePlan(
                name,
                key,
                info.target,
                info.fqn or info.module,
                str(strat),
                count,
                compute,
                memory,
                info.inputs,
            )
        )
    return tuple(rows), total_compute, total_memory


def decision_nodes(built: BuiltProblem) -> list[str]:
    """The nodes a plan lists, in graph order: the solver's variables, and every block of a further run of
    identical blocks (problem/runs.py) with its block 0's decision, so the plan reads as uncollapsed."""
    return [name for name in built.infos if name in built.runs or built.template[name] == name]


def _count(built: BuiltProblem, name: str) -> int:
    return 1 if name in built.runs else built.multiplicity[name]


def _records(
    steps: tuple[Step, ...],
    phase: str,
    use_node: str,
    tensor: str,
    layers,
    built,
    times: int = 1,
    recompute: bool = False,
) -> list[Collective]:
    """One record per collective and layer; ``seconds`` is per step (``times`` = repeats per step);
    ``recompute``: the forward move re-run in backward by recomputation (``Collective.recompute``)."""
    out: list[Collective] = []
    for step in steps:
        if step.kind not in COLLECTIVE_KINDS:
            continue
        seconds = built.cluster.collective_time(step.kind, step.nbytes, axis=step.mesh_axis) * times
        for layer, path in layers:
            out.append(
                Collective(
                    step.kind,
                    step.nbytes,
                    phase,
                    step.mesh_axis,
                    use_node,
                    tensor,
                    path,
                    seconds,
                    layer,
                    recompute,
                )
            )
    return out


def _edge_collectives(
    built: BuiltProblem, pick: dict[str, OpStrategy], namer: LayerNamer
) -> list[Collective]:
    out: list[Collective] = []
    shared = _Shared(built, pick, namer)
    for use in built.edges:
        producer, consumer = built.infos[use.producer], built.infos[use.consumer]
        steps = edge_steps(
            producer,
            use.which,
            pick[use.producer],
            pick[use.consumer],
            use.position,
            built.options,
            built.cache,
        )
        # a parameter's gradient synchronisation serves the parameter; everything else serves the consumer
        layers = [(layer, namer.module(consumer.module, layer)) for layer in namer.layers_of_edge(use)]
        layers = shared.first_uses(use, layers)  # one redistribution per (tensor, layout)
        # names of the shared (layer 0) nodes, as in Plan.nodes; Collective.layer tells the copies apart
        served, moved = built.template[consumer.name], built.template[producer.name]
        parameter = producer.kind == "parameter"
        fwd_times = repeats(built.options, parameter=parameter, backward=False)
        bwd_times = repeats(built.options, parameter=parameter, backward=True)
        out += _records(steps.forward, "forward", served, moved, layers, built, fwd_times)
        if reissued(producer, consumer, built.options):  # run again when backward recomputes the block
            again = recomputed_layers(layers, built.options, built.num_blocks)
            out += _records(steps.forward, "forward", served, moved, again, built, fwd_times, True)
            if rerun_share(producer, consumer, built.options) > built.options.recompute_share:  # the others
                rest = [lp for lp in layers if lp not in again]
                out += _records(steps.forward, "regather", served, moved, rest, built, fwd_times)
        elif regathered(producer, consumer, built.options):  # reshard after forward: gathered again
            out += _records(steps.forward, "regather", served, moved, layers, built, fwd_times)
        if producer.fqn:  # gradient synchronisation serves the parameter of each layer
            for layer, path in layers:
                fqn = built.infos[moved].fqn
                out += _records(
                    steps.backward,
                    "backward",
                    namer.module(fqn, layer),
                    moved,
                    [(layer, path)],
                    built,
                    bwd_times,
                )
        else:
            out += _records(steps.backward, "backward", served, moved, layers, built, bwd_times)
    return out


class _Shared:
    """Which uses of a tensor are served by a redistribution already listed (problem/fanout.py groups).

    A use in a group of uses of one tensor (a fan-out node's, or one the solver priced use by use as an
    upper bound: codegen moves the tensor once per layout all the same), or a tensor made outside the
    layers and read by every layer, lists its collectives only for the first consumer that wants its
    layout; the key names the tensor by its template producer and the layer that made it.
    """

    def __init__(self, built: BuiltProblem, pick: dict[str, OpStrategy], namer: LayerNamer) -> None:
        self.built, self.pick, self.namer = built, pick, namer
        groups = [fan.group for fan in built.fanouts] + list(built.apart)
        self.grouped = {(g.producer, c, g.which, p): g.weight for g in groups for c, p in g.entries}
        self.seen: set[tuple] = set()

    def first_uses(self, use: EdgeUse, layers: list[tuple[int | None, str]]) -> list[tuple[int | None, str]]:
        built = self.built
        tu, tv = built.template[use.producer], built.template[use.consumer]
        producer, consumer = built.infos[use.producer], built.infos[use.consumer]
        across = built.num_blocks > 1 and producer.block is None and consumer.block is not None
        across = across or reads_into_run(use.producer, use.consumer, built.runs)
        copy = built.runs.get(use.producer)  # which block of a further run made the tensor
        weight = self.grouped.get((tu, tv, use.which, use.position))
        if weight is None and not across:
            return layers
        element = element_of(producer, self.pick[use.consumer], use.position, built.options, built.cache)
        step_back = int(
            producer.block is not None
            and consumer.block is not None
            and producer.block[0] != consumer.block[0]
        )
        kept = []
        for layer, path in layers:
            made_in = None if producer.block is None or layer is None else layer - step_back
            key = (tu, use.which, weight, element, made_in, copy)
            if key not in self.seen:
                self.seen.add(key)
                kept.append((layer, path))
        return kept


def _output_collectives(
    built: BuiltProblem, chosen: dict[str, OpStrategy], namer: LayerNamer
) -> list[Collective]:
    out: list[Collective] = []
    decided = set(decision_nodes(built))
    for name, info in built.infos.items():  # a later layer's copy too: a pipeline stage ending in a layer
        if not info.is_output:
            continue
        steps = output_fix_steps(info, chosen[built.template[name]], built.cache, built.options.precision)
        where = namer.layers_of_node(name) if name in decided or info.block is None else [info.block[0]]
        layers = [(layer, namer.module(info.module, layer)) for layer in where]
        out += _records(steps, "forward", "output", name, layers, built, built.options.microbatches)
    return out


def _dispatch_collectives(
    built: BuiltProblem, chosen: dict[str, OpStrategy], namer: LayerNamer
) -> list[Collective]:
    """The all-to-alls routed-experts nodes run inside themselves (:mod:`autoshard.problem.dispatch`)."""
    out: list[Collective] = []
    times = repeats(built.options, parameter=False, backward=False)
    for name in decision_nodes(built):
        info = built.infos[name]
        inputs = tuple(built.infos[s] for s in info.inputs)
        forward, backward = dispatch_steps(info, chosen[built.template[name]], built.cluster, inputs)
        if not forward:
            continue
        layers = [(layer, namer.module(info.module, layer)) for layer in namer.layers_of_node(name)]
        out += _records(forward, "forward", name, name, layers, built, times)
        if rerun_in_backward(info, built.options):  # the block's forward runs again in backward
            again = recomputed_layers(layers, built.options, built.num_blocks)
            out += _records(forward, "forward", name, name, again, built, times, True)
        if built.options.training:
            out += _records(backward, "backward", name, name, layers, built, times)
    return out


def _param_placements(
    built: BuiltProblem, pick: dict[str, OpStrategy], namer: LayerNamer
) -> dict[str, tuple[str, ...]]:
    placements: dict[str, tuple[str, ...]] = {}
    for info in built.infos.values():
        if info.kind != "parameter" or not info.fqn:
            continue
        spec = _strings(pick[info.name].outputs[0])
        if info.block is None or namer.n == 1:
            placements[info.fqn] = spec
            continue
        for layer in range(namer.n):
            placements[namer.module(info.fqn, layer)] = spec
    return dict(sorted(placements.items(), key=lambda kv: _natural(kv[0])))


def _natural(text: str) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", text)]
