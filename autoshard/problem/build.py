"""Turn a captured graph, its strategies and a cluster into the solver's plain arrays.

Input: a :class:`~autoshard.capture.Captured`, a :class:`~autoshard.cluster.Cluster`, :class:`CostOptions`.
Output: a :class:`BuiltProblem`: the :class:`~autoshard.search.SearchProblem` (node cost vectors, edge cost
matrices, memory vectors; no torch inside) plus the index maps that turn the solver's choice back into a plan.

Repeated layers are solved once.  When capture cut a stack of N identical blocks to two (``BlockInfo``), every
node of block 1 shares the solver variable of the node at the same position in block 0, and each cost is
weighted by how often it occurs in the full N-layer model:

====================================  ===========  ==========================================
term                                  weight       why
====================================  ===========  ==========================================
a block node, an edge inside a block  N            every layer has it
edge block 0 → block 1                N − 1        one per pair of consecutive layers
edge into both blocks from outside    N            a tensor every layer reads (mask, RoPE)
edge into one block from outside      1            only the first (or last) layer reads it
edge out of both blocks               N            every layer feeds it
edge out of one block                 1            only the last layer's output leaves
anything else                         1
====================================  ===========  ==========================================

A tensor made outside the layers and read by every layer is moved once for all of them (they share one
layout): :mod:`autoshard.problem.fanout` prices it at weight 1, and prices the uses of one tensor that want
the same layout as one redistribution.

The optimum is then exact among plans that give identical layers identical strategies (the plans people
write); ``tests/problem`` checks it against solving the un-collapsed graph.
"""

from __future__ import annotations

import time
import weakref
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch.fx as fx

from autoshard.capture import Captured
from autoshard.cluster import Cluster
from autoshard.problem.arrays import edge_arrays, edge_matrix, node_arrays
from autoshard.problem.costs import CostOptions, Recompute, StepCache, recomputed
from autoshard.problem.extras import MemoryExtras, memory_extras
from autoshard.problem.fanout import (
    FanOut,
    Group,
    Sharing,
    complete_choice,
    fanout_arrays,
    fanout_edges,
    split_uses,
)
from autoshard.problem.graph import NodeInfo, describe
from autoshard.problem.runs import collapse_runs
from autoshard.problem.shared import build_cache
from autoshard.problem.zero_terms import ZeroTerms, zero_terms
from autoshard.search import SearchProblem
from autoshard.strategies import OpStrategy, strategies_for

__all__ = ["BuiltProblem", "EdgeUse", "build_problem", "edge_matrix"]


@dataclass(frozen=True, slots=True)
class EdgeUse:
    """One producer → consumer use in the captured graph, with its weight in the full model."""

    producer: str
    consumer: str
    which: int  # which output of the producer
    position: int  # which input of the consumer
    weight: int


@dataclass(frozen=True)
class BuiltProblem:
    problem: SearchProblem
    variables: tuple[str, ...]  # solver variable i is the node named variables[i]
    infos: dict[str, NodeInfo]  # every node of the captured graph
    strategies: dict[str, tuple[OpStrategy, ...]]  # per variable node
    template: dict[str, str]  # node → the variable node it shares a strategy with
    multiplicity: dict[str, int]  # variable node → how many nodes of the full model it stands for
    edges: tuple[EdgeUse, ...]
    num_blocks: int  # N of the repeated stack (1 when none was collapsed)
    cluster: Cluster
    options: CostOptions
    cache: StepCache
    seconds: float
    keeps: dict[str, bool] = field(default_factory=dict)
    # one fan-out node per tensor whose consumers can share a redistribution (problem/fanout.py); their
    # solver variables follow the graph's: ``problem.num_nodes == len(variables) + len(fanouts)``
    fanouts: tuple[FanOut, ...] = ()
    # groups of uses priced one by one (nothing to share, or too many layouts for a fan-out node): codegen
    # still moves a tensor once per layout, so the plan lists them that way (problem/extract.py)
    apart: tuple[Group, ...] = ()
    notes: tuple[str, ...] = ()
    # memory no node owns, as solver terms (problem/extras.py): gather nodes follow the fan-out nodes
    extras: MemoryExtras | None = None
    # nodes of further runs of identical blocks (problem/runs.py): node -> (run, block, position)
    runs: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    # ZeRO-1's optimizer gathers as solver terms (problem/zero_terms.py): their nodes follow the gather nodes
    zero: ZeroTerms | None = None

    def index(self, name: str) -> int:
        return self.variables.index(self.template[name])

    def full_choice(self, choice: Sequence[int]) -> tuple[int, ...]:
        """A solver choice for the variables alone, completed with the state every fan-out node then needs."""
        chosen = dict(zip(self.variables, choice, strict=True))
        gathers = self.extras.complete(chosen) if self.extras is not None else []
        gathers += self.zero.complete(chosen) if self.zero is not None else []
        return tuple(choice) + tuple(complete_choice(self.fanouts, chosen, self.strategies)) + tuple(gathers)


def _templates(infos: tuple[NodeInfo, ...], captured: Captured) -> tuple[dict[str, str], int]:
    blocks = captured.blocks
    identity = {i.name: i.name for i in infos}
    if blocks is None or blocks.captured_blocks != 2 or blocks.num_blocks < 2:
        return identity, 1
    first = {i.block[1]: i.name for i in infos if i.block is not None and i.block[0] == 0}
    template = dict(identity)
    for info in infos:
        if info.block is not None and info.block[0] == 1:
            template[info.name] = first[info.block[1]]
    return template, blocks.num_blocks


def _edge_weights(infos: dict[str, NodeInfo], template: dict[str, str], n: int) -> list[EdgeUse]:
    """Weight of every edge of the captured graph in the N-layer model (table in the module docstring)."""
    uses: list[tuple[NodeInfo, NodeInfo, int, int]] = []
    for consumer in infos.values():
        for pos, (src, which) in enumerate(zip(consumer.inputs, consumer.input_outputs, strict=True)):
            uses.append((infos[src], consumer, which, pos))
    # which block copies of an outside↔block edge exist, keyed by its template form
    copies: dict[tuple[str, str, int, int], set[int]] = defaultdict(set)
    for u, v, which, pos in uses:
        b = (u.block or v.block) if (u.block is None) != (v.block is None) else None
        if b is not None:
            copies[(template[u.name], template[v.name], which, pos)].add(b[0])
    out: list[EdgeUse] = []
    for u, v, which, pos in uses:
        weight = _weight(u, v, n, copies[(template[u.name], template[v.name], which, pos)])
        if weight:
            out.append(EdgeUse(u.name, v.name, which, pos, weight))
    return out


def _weight(u: NodeInfo, v: NodeInfo, n: int, copies: set[int]) -> int:
    if n == 1:
        return 1
    bu, bv = (u.block[0] if u.block else None), (v.block[0] if v.block else None)
    if bu is not None and bv is not None:
        if bu == bv:
            return n if bu == 0 else 0  # block 1's inner edges repeat block 0's
        return n - 1 if (bu, bv) == (0, 1) else 0
    if bu is None and bv is None:
        return 1
    both = copies >= {0, 1}
    block = bv if bu is None else bu
    inward = bu is None
    if not both:
        return 1
    # the copy on the common side stands for one layer, the other for the remaining n - 1
    single = 0 if inward else 1
    return 1 if block == single else n - 1


def _keeps(infos: dict[str, NodeInfo], opts: CostOptions) -> dict[str, bool]:
    """Whether backward keeps each node's output (recompute keeps what leaves a block and what it does not
    re-run)."""
    if opts.recompute is Recompute.NONE:
        return {name: True for name in infos}
    leaves: dict[str, bool] = {name: not recomputed(info, opts.recompute) for name, info in infos.items()}
    for consumer in infos.values():
        for src in consumer.inputs:
            producer = infos[src]
            crosses = consumer.block is None or consumer.block[0] != (producer.block or (None,))[0]
            if producer.block is not None and crosses:
                leaves[src] = True
    return leaves


@dataclass(frozen=True)
class _Graph:
    """What a build derives from the capture and the mesh alone (kept per capture and mesh: :func:`_graph_of`)."""

    infos: dict[str, NodeInfo]
    template: dict[str, str]
    n_blocks: int
    runs: dict[str, tuple[int, int, int]]
    variables: tuple[str, ...]
    index: dict[str, int]
    strategies: dict[str, tuple[OpStrategy, ...]]
    mult: dict[str, int]
    outputs: Counter[str]  # graph outputs each variable decides: itself, or a later layer's copy
    uses: tuple[EdgeUse, ...]
    sharing: Sharing
    labels: tuple[tuple[str, ...], ...]  # per variable, its strategies' labels
    names: tuple[str, ...]  # per variable, its display name


def _graph(captured: Captured, mesh: tuple[int, ...]) -> _Graph:
    gm = captured.graph_module
    nodes: dict[str, fx.Node] = {n.name: n for n in gm.graph.nodes}
    ordered = describe(gm)
    infos = {i.name: i for i in ordered}
    template, n_blocks = _templates(ordered, captured)
    # further runs of identical blocks (encoder towers, attribute-held blocks) share block 0's variables
    template, run_copies, runs = collapse_runs(ordered, template, gm)
    variables = tuple(i.name for i in ordered if template[i.name] == i.name)
    strategies = {name: tuple(strategies_for(nodes[name], mesh)) for name in variables}
    # a shared block variable stands for its node in every one of the N layers; everything else for itself
    mult = {name: (n_blocks if infos[name].block is not None else 1) for name in variables}
    mult.update(run_copies)
    # graph outputs each variable decides: itself, or a later layer's copy (a pipeline stage ending in a layer)
    outputs = Counter(template[i.name] for i in ordered if i.is_output)
    uses = _edge_weights(infos, template, n_blocks)
    # one redistribution per (tensor, layout): a separate step, so pricing changes above merge cleanly
    sharing = split_uses(uses, infos, template, n_blocks, runs)
    text: dict[int, str] = {}  # alike nodes share strategy objects (strategies/strategy.py): print each once
    return _Graph(
        infos=infos,
        template=template,
        n_blocks=n_blocks,
        runs=runs,
        variables=variables,
        index={name: k for k, name in enumerate(variables)},
        strategies=strategies,
        mult=mult,
        outputs=outputs,
        uses=tuple(uses),
        sharing=sharing,
        labels=tuple(
            tuple(text.get(id(s)) or text.setdefault(id(s), str(s)) for s in strategies[v]) for v in variables
        ),
        names=tuple(_display_name(infos[v]) for v in variables),
    )


def build_problem(
    captured: Captured,
    cluster: Cluster,
    opts: CostOptions,
    *,
    allowed: dict[str, np.ndarray] | None = None,
    memory_limit: float | None = None,
    cache: StepCache | None = None,
) -> BuiltProblem:
    """Price every strategy of every variable node and every strategy pair of every edge.

    Every build of one capture on one mesh shares its strategies and weighted uses (:func:`_graph_of`), and
    on one cluster its policy-free figures (:mod:`autoshard.problem.shared`: redistribution tables,
    per-strategy compute and memory); only what the options change is composed anew.  ``cache``:
    redistribution times already priced on the same cluster (the pipeline search builds one model at several
    microbatch counts and recomputation policies on one sub-mesh)."""
    start = time.perf_counter()
    steps = cache if cache is not None and cache.cluster == cluster else None
    shared = build_cache(captured.graph_module, captured.blocks, cluster, steps)
    cache = shared.steps
    g = _graph_of(captured, tuple(cluster.mesh_shape))
    infos, variables, strategies, index = g.infos, g.variables, g.strategies, g.index
    keeps = _keeps(infos, opts)
    node_costs, memory = node_arrays(
        variables, infos, strategies, g.mult, keeps, cluster, opts, shared, g.outputs
    )
    if memory:  # the runtime reserve (profile memory.runtime_reserve: CUDA context, NCCL, allocator) is held
        # whatever the plan: a constant on one node counts it against the budget and changes no choice
        memory[0] = memory[0] + cluster.profile.memory.runtime_reserve
    fans, unshared, notes = fanout_arrays(g.sharing, infos, index, strategies, opts, cache, shared)
    weights = dict(g.sharing.single)
    for group in unshared:  # no layout two consumers could share: ordinary edges price them exactly
        weights.update({(group.producer, c, group.which, p): group.weight for c, p in group.entries})
    edges = edge_arrays(weights, infos, index, strategies, node_costs, opts, shared)
    edges += fanout_edges(fans, index)
    names = list(g.names) + [f"fanout {f.group.producer}" for f in fans]
    labels = list(g.labels) + [tuple(f.node.label(k) for k in range(len(f.node.states))) for f in fans]
    # gathered FSDP weights and the largest temporary, inside the budget (problem/extras.py)
    extras = memory_extras(
        g.uses, infos, g.template, variables, strategies, keeps, opts, cache, len(names), shared
    )
    edges += extras.edges(index)
    names += [f"gathered {g.producer} for {g.consumer}" for g in extras.gathers]
    labels += extras.labels(cache)
    # ZeRO-1's all-gathers where no gradient all-reduce pays them (problem/zero_terms.py)
    zero = zero_terms(g.uses, infos, g.template, strategies, g.mult, cluster, opts, len(names))
    zero.add_to(node_costs, index)
    edges += zero.edges(index)
    names += zero.names()
    labels += zero.labels()
    trailing = [np.zeros(len(f.node.states)) for f in fans] + [
        np.zeros(len(g.states)) for g in extras.gathers
    ]
    trailing += [np.zeros(len(z.states)) for z in zero.nodes]
    problem = SearchProblem(
        node_costs=tuple(node_costs) + tuple(trailing),
        edges=tuple(edges),
        memory=tuple(memory)
        + tuple(np.zeros(len(f.node.states)) for f in fans)
        + tuple(g.memory for g in extras.gathers)
        + tuple(np.zeros(len(z.states)) for z in zero.nodes),
        memory_limit=memory_limit,
        allowed=_allowed(variables, g.template, allowed, len(trailing)),
        names=tuple(names),
        strategy_labels=tuple(labels),
        peak=extras.temporary + tuple(trailing),
    )
    return BuiltProblem(
        problem=problem,
        variables=variables,
        infos=infos,
        strategies=dict(strategies),
        template=g.template,
        multiplicity=g.mult,
        edges=g.uses,
        num_blocks=g.n_blocks,
        cluster=cluster,
        options=opts,
        cache=cache,
        seconds=time.perf_counter() - start,
        keeps=keeps,
        fanouts=tuple(fans),
        apart=tuple(unshared),
        notes=tuple(notes) + extras.notes,
        extras=extras,
        runs=g.runs,
        zero=zero,
    )


#: The graph-level part of a build per (captured graph, mesh, blocks): strategies depend on nothing else, and
#: the planner builds one capture many times (each recomputation policy and share, the pinned and the free
#: problem, the zigzag clusters of the layout search, the pipeline search's policies per stage).
_GRAPHS: weakref.WeakKeyDictionary[fx.GraphModule, dict[tuple[int, ...], list[tuple[object, _Graph]]]] = (
    weakref.WeakKeyDictionary()
)


def _graph_of(captured: Captured, mesh: tuple[int, ...]) -> _Graph:
    per_mesh = _GRAPHS.setdefault(captured.graph_module, {}).setdefault(mesh, [])
    found = next((g for blocks, g in per_mesh if blocks == captured.blocks), None)  # BlockInfo: not hashable
    if found is None:
        found = _graph(captured, mesh)
        per_mesh.append((captured.blocks, found))
    return found


def _display_name(info: NodeInfo) -> str:
    where = info.fqn or info.module
    return f"{info.name} ({info.target}{' in ' + where if where else ''})"


def _allowed(variables, template, allowed, extra: int = 0) -> tuple[np.ndarray | None, ...] | None:
    if not allowed:
        return None
    masks: list[np.ndarray | None] = [None] * (len(variables) + extra)
    position = {name: k for k, name in enumerate(variables)}
    for name, mask in allowed.items():
        k = position[template[name]]
        masks[k] = mask if masks[k] is None else (masks[k] & mask)
    return tuple(masks)
