"""The builder's node and edge arrays, composed per build from the figures a :class:`BuildCache` keeps.

Input: the variables, their :class:`~autoshard.problem.graph.NodeInfo` records and strategies, the
:class:`~autoshard.problem.costs.CostOptions` of this build and a :class:`~autoshard.problem.shared.BuildCache`.
Output: per variable a cost and a memory vector ``[S]``; per weighted use an edge cost matrix ``[S_u, S_v]``.

Per (node, strategy) the policy-free figures are priced once (:class:`NodeParts`: the op's forward, hidden
casts and loss, dispatch, optimizer, memory kept or dropped, a returned output's reduction); each build
applies its recomputation policy, share and microbatches with :func:`~autoshard.problem.costs.timed`,
:func:`~autoshard.problem.recompute.memory_total` and :func:`~autoshard.problem.dispatch.dispatch_total`,
the functions that price one strategy, on arrays over the node's strategies: the same float operations in
the same order, so the arrays equal pricing strategy by strategy bit for bit.  An edge keeps its forward
and backward redistribution tables; :func:`edge_matrix` weights them per build.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from autoshard.cluster import Cluster
from autoshard.problem.autocast import moved_itemsize, uses_autocast
from autoshard.problem.context import ring_free, ring_seconds
from autoshard.problem.costs import (
    MEMORY_TIE_BREAK,
    CostOptions,
    StepCache,
    compute_parts,
    dual_spec,
    grad_factor,
    node_memory,
    operand_bytes,
    optimizer_time,
    output_fix_steps,
    repeats,
    steps_time,
    timed,
)
from autoshard.problem.dispatch import dispatch_times, dispatch_total, may_dispatch
from autoshard.problem.graph import NodeInfo
from autoshard.problem.pairs import SpecPairs, spec_pairs
from autoshard.problem.reads import compute_key, memory_key
from autoshard.problem.recompute import memory_total, rerun_share
from autoshard.problem.shared import BuildCache, node_key
from autoshard.search import Edge
from autoshard.strategies import OpStrategy

if TYPE_CHECKING:
    from cost_models.memory import PrecisionPolicy

__all__ = [
    "NodeParts",
    "edge_arrays",
    "edge_matrix",
    "edge_pairs",
    "edge_tables",
    "node_arrays",
    "node_parts",
]


@dataclass(frozen=True, slots=True)
class NodeParts:
    """Per strategy of one node, what no recomputation policy changes (read-only arrays ``[S]``)."""

    fwd: np.ndarray  # the op's forward seconds (compute_parts; 0 for views and non-ops)
    hidden: tuple[np.ndarray, np.ndarray]  # casts and the loss, (forward, backward)
    grads: float  # backward kernels per forward (grad_factor)
    dispatch: tuple[np.ndarray, np.ndarray]  # routed experts' all-to-alls, (forward, backward)
    optimizer: np.ndarray  # the optimizer update of a parameter shard
    kept: np.ndarray  # node_memory when backward keeps the output
    dropped: np.ndarray  # ... and when it does not
    fix: np.ndarray  # reducing a returned Partial output (zeros for a node that decides no output)


def _frozen(values: list[float]) -> np.ndarray:
    array = np.array(values, dtype=np.float64)
    array.setflags(write=False)
    return array


def node_parts(
    info: NodeInfo,
    strategies: tuple[OpStrategy, ...],
    inputs: tuple[NodeInfo, ...],
    cluster: Cluster,
    opts: CostOptions,
    cache: BuildCache,
    output: bool,
) -> NodeParts:
    """The node's :class:`NodeParts`, priced strategy by strategy the first time (``output``: the node
    decides a graph output, whose Partial is reduced)."""

    def collectives() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The parts a collective prices: dispatch (forward, backward) and the output's reduction.  The
        rest (compute, casts, optimizer, memory) reads no collective price: a zigzag cluster, which differs
        from its plain one in those prices alone, takes it from the plain one's cache."""
        if not (output or may_dispatch(info, inputs)):  # no all-to-all, no output to reduce: 0 s each
            zeros = _frozen([0.0] * len(strategies))
            return zeros, zeros, zeros
        columns: list[list[float]] = [[], [], []]
        for strat in strategies:
            fixes = output_fix_steps(info, strat, cache.steps, opts.precision) if output else None
            reduce = steps_time(fixes, cluster) if fixes is not None else 0.0
            for column, value in zip(
                columns, (*dispatch_times(info, strat, cluster, inputs), reduce), strict=True
            ):
                column.append(value)
        df, db, fix = (_frozen(c) for c in columns)
        return df, db, fix

    def make() -> NodeParts:
        columns: list[list[float]] = [[] for _ in range(6)]
        sizes = operand_bytes(info, inputs)
        state: dict[object, tuple[float, float, float]] = {}  # per memory_key
        computed: dict[tuple, tuple[float, tuple[float, float]]] = {}  # per compute_key
        mesh = tuple(cluster.mesh_shape)
        for strat in strategies:
            fwd, hidden = 0.0, (0.0, 0.0)
            if info.kind == "op":
                key = compute_key(strat, mesh)
                found = computed.get(key)
                if found is None:
                    found = computed[key] = compute_parts(
                        info, strat, cluster, opts.training, inputs, sizes, uses_autocast(opts.precision)
                    )
                fwd, hidden = found
            kept_key = memory_key(strat, mesh)
            held = state.get(kept_key)
            if held is None:  # the optimizer and the memory read the first output's shard count alone
                held = state[kept_key] = (
                    optimizer_time(info, strat, cluster, opts),
                    node_memory(info, strat, cluster, opts, True),
                    node_memory(info, strat, cluster, opts, False),
                )
            row = (fwd, *hidden, *held)
            for column, value in zip(columns, row, strict=True):
                column.append(value)
        f, hf, hb, opt, kept, dropped = (_frozen(c) for c in columns)
        grads = grad_factor(info, inputs) if info.kind == "op" else 0.0
        df, db, fix = collectives()
        return NodeParts(f, (hf, hb), grads, (df, db), opt, kept, dropped, fix)

    def shared() -> NodeParts:  # a node of an identical layer may have priced them already
        return cache.get("node", (_signature(info, inputs, strategies, output), node_key(opts)), make)

    base = cache.base
    if base is not None:  # a zigzag cluster: only the collectives are priced again

        def repriced() -> NodeParts:
            assert base is not None
            plain = node_parts(info, strategies, inputs, base.cluster, opts, base, output)
            if not (output or may_dispatch(info, inputs)):  # no collective at all: nothing a zigzag axis
                return plain  # raises (dispatch 0 s, no output to reduce, on any cluster)
            df, db, fix = collectives()
            return dataclasses.replace(plain, dispatch=(df, db), fix=fix)

        return cache.get("node of", (info.name, output, node_key(opts)), repriced)
    return cache.get("node of", (info.name, output, node_key(opts)), shared)


def _signature(
    info: NodeInfo, inputs: tuple[NodeInfo, ...], strategies: tuple[OpStrategy, ...], output: bool
) -> tuple:
    """What :func:`node_parts` reads, without the node's name and place: the nodes of identical layers (the
    two norms of a LLaMA block, its gate and up projections, every copy of an uncollapsed layer) are priced
    once.  Only ``recomputed`` reads ``block``, and only whether it is None."""

    def plain(i: NodeInfo) -> NodeInfo:
        block = None if i.block is None else (0, 0)
        return dataclasses.replace(i, name="", fqn="", module="", inputs=(), block=block)

    return plain(info), tuple(plain(i) for i in inputs), strategies, output


def node_arrays(
    variables: tuple[str, ...],
    infos: Mapping[str, NodeInfo],
    strategies: Mapping[str, tuple[OpStrategy, ...]],
    mult: Mapping[str, int],
    keeps: Mapping[str, bool],
    cluster: Cluster,
    opts: CostOptions,
    cache: BuildCache,
    outputs: Mapping[str, int],
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per variable its cost ``[S]`` (compute, dispatch, output reduction, optimizer, the memory tie-break;
    weighted by the copies it stands for) and its memory ``[S]`` (fresh arrays: the caller may add to them)."""
    node_costs: list[np.ndarray] = []
    memory: list[np.ndarray] = []
    for name in variables:
        info = infos[name]
        inputs = tuple(infos[s] for s in info.inputs)
        parts = node_parts(info, strategies[name], inputs, cluster, opts, cache, bool(outputs[name]))
        fwd, bwd = _compute(info, parts, strategies[name], inputs, cluster, opts)
        # all-to-all token dispatch inside a routed-experts node (listed as collectives in the plan)
        per_microbatch = fwd + bwd + dispatch_total(info, *parts.dispatch, opts)
        fix = parts.fix if outputs[name] else 0.0
        if info.is_output:
            per_microbatch = per_microbatch + fix
        extra = per_microbatch * opts.microbatches + parts.optimizer
        mem = memory_total(info, parts.kept, parts.dropped, opts, keeps[name], mult[name])
        # an output in a later layer's copy (a stage's last layer) is reduced once, not once per layer
        late = fix * opts.microbatches * (outputs[name] - info.is_output)
        node_costs.append(np.array(extra * mult[name] + late + MEMORY_TIE_BREAK * mem, dtype=np.float64))
        memory.append(np.array(mem, dtype=np.float64))
    return node_costs, memory


def _compute(
    info: NodeInfo,
    parts: NodeParts,
    strategies: tuple[OpStrategy, ...],
    inputs: tuple[NodeInfo, ...],
    cluster: Cluster,
    opts: CostOptions,
) -> tuple[np.ndarray | float, np.ndarray | float]:
    """``node_compute`` of every strategy at once: (forward, backward) seconds."""
    if info.kind != "op":
        return 0.0, 0.0
    if ring_free(info, cluster, len(inputs)):
        return timed(info, parts.fwd, parts.hidden, parts.grads, opts, lambda f, b: (0.0, 0.0))

    def ring(f: np.ndarray, b: np.ndarray | float) -> tuple[np.ndarray, np.ndarray]:
        back = np.broadcast_to(b, f.shape)
        pairs = [
            ring_seconds(info, s, cluster, inputs, float(fk), float(bk), opts.cp_layout, opts.precision)
            for s, fk, bk in zip(strategies, f, back, strict=True)
        ]
        return np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])

    return timed(info, parts.fwd, parts.hidden, parts.grads, opts, ring)


def edge_pairs(
    producer: NodeInfo,
    which: int,
    src_list: tuple[OpStrategy, ...],
    dst_list: tuple[OpStrategy, ...],
    pos: int,
    backward: bool,
    steps: StepCache,
    precision: PrecisionPolicy | None = None,
) -> tuple[SpecPairs, SpecPairs | None] | None:
    """The spec pairs :func:`edge_tables` prices, forward and the gradient's way back (None unless
    ``backward``); None when the edge moves nothing.  No collective price enters: a zigzag cluster's build
    reads its plain cluster's (:mod:`autoshard.problem.pairs`)."""
    meta = producer.outputs[which] if which < len(producer.outputs) else None
    if meta is None:
        return None
    outs = [s.outputs[which] if which < len(s.outputs) else None for s in src_list]
    have = np.array([steps.intern(o) for o in outs])
    want = np.array([steps.intern(s.inputs[pos]) for s in dst_list])
    size = moved_itemsize(producer, which, precision)
    forward = spec_pairs(have, want, meta.shape, size, steps)
    if not backward:
        return forward, None
    duals = np.array([steps.intern(dual_spec(o) if o is not None else None) for o in outs])
    grads = np.array([steps.intern(s.input_grads[pos]) for s in dst_list])
    # a consumer that needs the value but yields no gradient (None) costs nothing backward
    back = moved_itemsize(producer, which, precision, gradient=True)
    return forward, spec_pairs(grads, duals, meta.shape, back, steps)


def edge_tables(
    producer: NodeInfo,
    which: int,
    src_list: tuple[OpStrategy, ...],
    dst_list: tuple[OpStrategy, ...],
    pos: int,
    backward: bool,
    steps: StepCache,
    precision: PrecisionPolicy | None = None,
    pairs: tuple[SpecPairs, SpecPairs | None] | None = None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """``(F, B)``: seconds of one forward redistribution on this edge per strategy pair ``[S_u, S_v]``, and
    of the gradient's way back (None unless ``backward``); each distinct spec pair priced once, at the bytes
    ``precision`` moves the tensor in (:func:`~autoshard.problem.autocast.moved_itemsize`).  ``pairs``: the
    edge's :func:`edge_pairs`, when the caller has them."""
    if pairs is None:
        pairs = edge_pairs(producer, which, src_list, dst_list, pos, backward, steps, precision)
    if pairs is None:
        return np.zeros((len(src_list), len(dst_list))), None
    forward, back = pairs
    return forward.table(steps.prices), (back.table(steps.prices).T if back is not None else None)


def priced_edge(
    producer: NodeInfo, tables: tuple[np.ndarray, np.ndarray | None], opts: CostOptions
) -> np.ndarray:
    """``M[a, b]``: seconds per step of the edge's redistributions from its tables (:func:`edge_tables`)."""
    forward, backward = tables
    parameter = producer.kind == "parameter"
    matrix = forward * repeats(opts, parameter=parameter, backward=False)
    if opts.training and producer.requires_grad and backward is not None:
        matrix = matrix + backward * repeats(opts, parameter=parameter, backward=True)
    return matrix


def edge_matrix(
    producer: NodeInfo,
    which: int,
    src_list: tuple[OpStrategy, ...],
    dst_list: tuple[OpStrategy, ...],
    pos: int,
    opts: CostOptions,
    cache: StepCache,
) -> np.ndarray:
    """``M[a, b]``: seconds of redistribution on this edge when producer runs ``a`` and consumer ``b``.

    The same rule as :func:`~autoshard.problem.costs.edge_steps`, priced over the few distinct specs on
    each side and spread over all strategy pairs with numpy indexing.
    """
    backward = opts.training and producer.requires_grad
    tables = edge_tables(producer, which, src_list, dst_list, pos, backward, cache, opts.precision)
    return priced_edge(producer, tables, opts)


def edge_arrays(
    weights: Mapping[tuple[str, str, int, int], int],
    infos: Mapping[str, NodeInfo],
    index: Mapping[str, int],
    strategies: Mapping[str, tuple[OpStrategy, ...]],
    node_costs: list[np.ndarray],
    opts: CostOptions,
    cache: BuildCache,
) -> list[Edge]:
    """One edge per weighted use; a use of a node by its own copy in the next layer goes to its node cost."""
    edges: list[Edge] = []
    forward_only = dataclasses.replace(opts, training=False)
    for (tu, tv, which, pos), weight in weights.items():
        producer = infos[tu]
        backward = opts.training and producer.requires_grad

        key = (tu, tv, which, pos, backward, opts.precision)

        def make(key: tuple = key) -> tuple[np.ndarray, np.ndarray | None]:
            tu, tv, which, pos, grad, _ = key
            src, dst = strategies[tu], strategies[tv]

            def ids() -> tuple[SpecPairs, SpecPairs | None] | None:  # no collective price: shared
                return edge_pairs(infos[tu], which, src, dst, pos, grad, cache.steps, opts.precision)

            pairs = cache.get("edge pairs", key, ids)
            return edge_tables(infos[tu], which, src, dst, pos, grad, cache.steps, opts.precision, pairs)

        tables = cache.get("edge", key, make)
        share = rerun_share(producer, infos[tv], opts)  # recomputed blocks re-issue, the rest re-gather
        # all the weighted matrix reads of the options (priced_edge, repeats): builds that agree share it
        priced = (weight, share, opts.microbatches, opts.training, opts.overlap.overlap_grad_sync)

        def weighted(
            producer: NodeInfo = producer, tables: tuple = tables, weight: int = weight, share: float = share
        ) -> np.ndarray:
            return _weighted(producer, tables, weight, share, opts, forward_only)

        if tu == tv:  # a node feeding its own copy in the next layer: only the diagonal can occur
            node_costs[index[tu]] += np.diag(weighted())
            continue

        def edge(u: int = index[tu], v: int = index[tv], weighted: Callable = weighted) -> Edge:
            return Edge(u, v, weighted())

        edges.append(cache.latest("edge of", key, priced, edge))
    return edges


def _weighted(
    producer: NodeInfo,
    tables: tuple[np.ndarray, np.ndarray | None],
    weight: int,
    share: float,
    opts: CostOptions,
    forward_only: CostOptions,
) -> np.ndarray:
    """An edge's seconds per step in the full model (read-only: builds that price it alike share it)."""
    matrix = priced_edge(producer, tables, opts) * weight
    repeated_param = weight > 1 and producer.kind == "parameter" and producer.block is not None
    if repeated_param and opts.training and opts.overlap.overlap_grad_sync:
        # Gradient sync of a repeated layer's parameter overlaps the backward of the layers after it
        # (cost_models.overlap): only the last layer's copy is exposed -- exact while a layer's sync is
        # shorter than a layer's backward, optimistic beyond (the plan's critical path then says by how
        # much).  Forward steps (FSDP gathers) keep every copy.
        fwd = priced_edge(producer, tables, forward_only)
        matrix = fwd * weight + (matrix / weight - fwd)
    if share:  # backward re-runs the block, moves inside it included; or (FSDP reshard) re-gathers
        again = priced_edge(producer, tables, forward_only)
        matrix = matrix + again * (weight * share)
    matrix.setflags(write=False)
    return matrix
