"""The price of context parallelism: what a ring-attention strategy adds to an SDPA node's time.

A ring strategy (:mod:`autoshard.strategies.rules.attention`) splits q, k, v and the output along the
sequence over one mesh axis of ``n`` devices; :func:`autoshard.codegen.context.context_sdpa` runs it.  Per
step of the ring each device attends its queries to the K/V block it holds while sending that block on:

- forward: ``n - 1`` hops of the local K and V (of grouped-query copies, one head per run of copies; under
  the amp recipe in autocast's 16-bit dtype: :func:`autoshard.problem.attention.ring_block_bytes`).  A
  ring all-gather of ``S = n · b`` bytes is exactly ``n - 1`` hops of ``b`` bytes (REFERENCE.md, ring
  all-gather ``(n−1)·α + (n−1)/n · S/B``), so the hops cost ``collective_time("all_gather", n · b)`` on that axis;
- backward: ``n`` hops (the last brings the K/V gradients home) of K, V, dK and dV: ``n / (n − 1)`` times
  the all-gather of ``2 · n · b``;
- overlap: each hop overlaps the block computed meanwhile, so only communication beyond the node's own
  compute shows: ``max(0, comm − compute)`` per pass;
- causal work: under ``is_causal`` the FLOPs count the causal triangle, and so does the price of an
  explicit mask proven causal at capture (``NodeInfo.causal_mask``, :mod:`autoshard.capture.causal`:
  Hugging Face models) wherever it runs causal (:mod:`autoshard.problem.attention`): a ring skips the chunk
  pairs the mask hides, and head and batch splits run ``is_causal`` without the mask.  The proof decides the
  layout: they differ by the triangle's imbalance below;
- balance, by sequence layout (``Plan.context_layout``, :mod:`autoshard.codegen.context`): under a causal
  mask the *contiguous* layout's last device does ``(2n − 1)/n`` times the average work (the triangle's),
  and the step waits for it.  The *zigzag* layout (device ``k`` holds chunks ``k`` and ``2n − 1 − k`` of
  ``2n``) gives every device the same causal work: no imbalance term;
- permutation (zigzag only): a split on the ring axis is a copy either way, but a gather, reduce-scatter or
  all-to-all on that axis reorders the chunks: one more copy of the buffer through HBM (read and write),
  :func:`reorder_seconds`, part of that collective's price on a :class:`ZigzagCluster`;
- ops that read one ``(start, length)`` run of a split dim (``_ONE_RUN``: vocab-parallel lookups, sharded
  losses, triangular masks) cannot take the two runs a zigzag device holds: infinite on the zigzag axis.

Which layout, in the search.  The layout is a plan option, priced inside the solve: a problem built on a
:class:`ZigzagCluster` for axis ``a`` prices the zigzag layout on ``a`` (rings on ``a`` balanced, every
collective on ``a`` with its reordering copy, one-run ops split on ``a`` refused) and contiguous elsewhere;
``CostOptions.cp_layout="contiguous"`` on a plain cluster prices every ring contiguous.  Every (plan,
layout) pair is priced exactly by one of these problems, so the best of their optima is the optimum over
both (:mod:`autoshard.planner_layout` solves them).  ``cp_layout="auto"`` on a plain cluster prices every
ring balanced with no reordering: a lower bound on all of them, solved first; when its optimum rings on no
axis it is the optimum, layout contiguous, and nothing more is solved.  :func:`choose_layout` reads the
layout back from the problem a plan was solved on.

Pure: functions of the node record, the strategy and the cluster.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

from autoshard.capture.meta import TensorMeta
from autoshard.cluster import Cluster
from autoshard.errors import ShardingError
from autoshard.placement import Shard
from autoshard.problem.attention import ring_block_bytes
from autoshard.problem.graph import NodeInfo
from autoshard.strategies import OpStrategy

if TYPE_CHECKING:
    from autoshard.problem.build import BuiltProblem
    from autoshard.search.problem import SearchProblem
    from cost_models.memory import PrecisionPolicy

__all__ = [
    "ContextChoice",
    "ZigzagCluster",
    "choose_layout",
    "context_degrees",
    "needs_one_run",
    "one_run_op",
    "one_run_ops",
    "permutation_seconds",
    "plain_cluster",
    "reorder_seconds",
    "ring_axis_of",
    "ring_axis_of_plan",
    "ring_free",
    "ring_seconds",
    "ring_variable",
    "zigzag_axis_of",
    "zigzag_cluster",
    "zigzag_masks",
]

Layout = Literal["contiguous", "zigzag"]

_SDPA = "scaled_dot_product_attention"


@dataclass(frozen=True, slots=True, repr=False)
class ZigzagCluster(Cluster):
    """``Cluster`` whose mesh axis ``zigzag_axis`` lays the sequence out in the zigzag layout: every gather,
    reduce-scatter and all-to-all on it pays its reordering copy (:func:`reorder_seconds`)."""

    zigzag_axis: int = 0

    def collective_time(self, kind: str, nbytes: float, axis: int | str = 0) -> float:
        seconds = Cluster.collective_time(self, kind, nbytes, axis)
        if self.axis_index(axis) != self.zigzag_axis:
            return seconds
        return seconds + reorder_seconds(kind, nbytes, self.mesh_shape[self.zigzag_axis], self)

    def __repr__(self) -> str:
        return f"{Cluster.__repr__(self)[:-1]}, zigzag_axis={self.zigzag_axis})"


def zigzag_cluster(cluster: Cluster, axis: int) -> ZigzagCluster:
    """``cluster`` with the zigzag layout on mesh axis ``axis``."""
    return ZigzagCluster(cluster.profile, cluster.nodes, cluster.mesh_shape, cluster.axis_names, axis)


def plain_cluster(cluster: Cluster) -> Cluster:
    """The cluster a :class:`ZigzagCluster` reorders on one axis (``cluster`` itself when it is plain)."""
    if not isinstance(cluster, ZigzagCluster):
        return cluster
    return Cluster(cluster.profile, cluster.nodes, cluster.mesh_shape, cluster.axis_names)


def zigzag_axis_of(cluster: Cluster) -> int | None:
    """The mesh axis a cluster prices in the zigzag layout, else None."""
    return cluster.zigzag_axis if isinstance(cluster, ZigzagCluster) else None


def reorder_seconds(kind: str, nbytes: float, n: int, cluster: Cluster) -> float:
    """One copy (read + write through HBM) of the buffer a collective of ``kind`` on a zigzag axis of ``n``
    devices reorders: the whole gathered / reduce-scattered buffer, or an all-to-all's local buffer before
    sending and after receiving."""
    if kind in ("all_gather", "reduce_scatter"):
        return cluster.compute_time(0.0, 2 * nbytes, "bfloat16")
    if kind == "all_to_all":
        return cluster.compute_time(0.0, 4 * nbytes / n, "bfloat16")
    return 0.0


def ring_seconds(
    info: NodeInfo,
    strategy: OpStrategy,
    cluster: Cluster,
    inputs: tuple[NodeInfo, ...],
    fwd: float,
    bwd: float,
    layout: str = "zigzag",
    precision: PrecisionPolicy | None = None,
) -> tuple[float, float]:
    """(forward, backward) seconds context parallelism adds to a node's priced compute (module doc): a ring
    strategy's hops, causal work and imbalance; infinity for a one-run op split on a zigzag axis.
    ``layout``: ``"contiguous"`` prices rings off the cluster's zigzag axis contiguous, ``"zigzag"`` or
    ``"auto"`` balanced; ``precision`` (``CostOptions.precision``): the bytes per element the hops carry."""
    zigzag = zigzag_axis_of(cluster)
    if zigzag is not None and needs_one_run(info, strategy, zigzag):
        return math.inf, math.inf
    if _SDPA not in info.target or len(inputs) < 3:
        return 0.0, 0.0
    k, v = (_meta(inputs[i], info.input_outputs[i]) for i in (1, 2))
    spec = strategy.inputs[1]
    if k is None or v is None or spec is None:
        return 0.0, 0.0
    seq = len(k.shape) - 2
    axis = next((a for a, p in enumerate(spec.placements) if isinstance(p, Shard) and p.dim == seq), None)
    if axis is None or cluster.mesh_shape[axis] == 1:  # no ring (an axis of one device moves nothing)
        return 0.0, 0.0
    n = cluster.mesh_shape[axis]
    local = ring_block_bytes(info, (k, v), (spec, strategy.inputs[2]), tuple(cluster.mesh_shape), precision)
    hops = functools.partial(Cluster.collective_time, cluster, axis=axis)  # the hops reorder nothing
    comm_fwd = hops("all_gather", n * local)
    comm_bwd = n / (n - 1) * hops("all_gather", 2 * n * local)
    causal = len(inputs) < 4 or info.causal_mask  # is_causal (FLOPs: the triangle) or a proven causal mask
    balanced = axis == zigzag or (zigzag is None and layout != "contiguous")
    skew = (n - 1) / n if causal and not balanced else 0.0  # fwd, bwd: the triangle's (problem/attention.py)
    extra_fwd = skew * fwd + max(0.0, comm_fwd - fwd)
    extra_bwd = skew * bwd + max(0.0, comm_bwd - bwd)
    return extra_fwd, extra_bwd


def ring_free(info: NodeInfo, cluster: Cluster, inputs: int) -> bool:
    """Whether :func:`ring_seconds` is (0, 0) for every strategy of ``info`` (``inputs``: how many it reads):
    no zigzag axis that could refuse a split, or no one-run op to refuse, and not an attention with K and V
    (its two early returns).  The builder skips the per-strategy call for such nodes (problem/arrays.py)."""
    refusable = zigzag_axis_of(cluster) is not None and one_run_op(info)
    return not refusable and (_SDPA not in info.target or inputs < 3)


@dataclass(frozen=True, slots=True)
class ContextChoice:
    """The sequence layout of a plan's ring axis and what it adds to the searched step time."""

    axis: int | None  # the ring axis (None: no ring)
    layout: Layout
    extra_seconds: float  # added to the step after the search (a plan solved with balanced rings only)
    note: str = ""


def permutation_seconds(collectives: Iterable[object], axis: int, cluster: Cluster) -> float:
    """Seconds of zigzag's chunk reordering over a plan's ``Collective`` records (kind, nbytes, mesh_axis)
    on the ring axis."""
    n = cluster.mesh_shape[axis]
    return sum(
        reorder_seconds(str(getattr(c, "kind", "")), float(getattr(c, "nbytes", 0)), n, cluster)
        for c in collectives
        if getattr(c, "mesh_axis", None) == axis
    )


def choose_layout(
    built: BuiltProblem, chosen: Mapping[str, OpStrategy], collectives: Iterable[object]
) -> ContextChoice:
    """The layout of the plan's ring axis, given the problem it was solved on and its choice (module doc).

    On a :class:`ZigzagCluster` or with ``cp_layout="contiguous"`` the search priced the layout: nothing is
    added.  A problem priced with balanced rings (``cp_layout`` ``"auto"`` or ``"zigzag"`` on a plain
    cluster: a hand plan, a bound) gets the layout chosen here, its price added after the search."""
    cluster, asked = built.cluster, built.options.cp_layout
    axis = ring_axis_of_plan(built.infos, chosen, tuple(cluster.mesh_shape))
    zigzag = zigzag_axis_of(cluster)
    if zigzag is not None and axis in (None, zigzag):  # a pipeline stage without a ring keeps its neighbours'
        return ContextChoice(zigzag, "zigzag", 0.0)
    if axis is None:
        return ContextChoice(None, "contiguous", 0.0)
    if zigzag is not None or asked == "contiguous":
        return ContextChoice(axis, "contiguous", 0.0)
    blockers = ", ".join(one_run_ops(built.infos, chosen, axis)[:3])
    if blockers:  # their local_args hooks read one (start, length) range per device; zigzag holds two
        why = (
            f"{blockers} split on mesh axis {axis} need one run of the sequence per device, zigzag holds two"
        )
        if asked == "zigzag":
            raise ShardingError(
                f"cp_layout='zigzag' cannot be emitted: {why}; use cp_layout='auto' or 'contiguous'"
            )
        return ContextChoice(
            axis, "contiguous", 0.0, f"ring attention on axis {axis}: contiguous layout ({why})"
        )
    perm = permutation_seconds(list(collectives), axis, cluster)
    if asked == "zigzag":
        return ContextChoice(axis, "zigzag", perm, f"zigzag layout pinned: {perm:.3g} s of reordering")
    from autoshard.problem.costs import node_compute, repeats

    imbalance = 0.0
    by_layout = {lay: dataclasses.replace(built.options, cp_layout=lay) for lay in ("contiguous", "zigzag")}
    for name, strategy in chosen.items():
        info = built.infos[name]
        if _SDPA not in info.target:
            continue
        ins = tuple(built.infos[i] for i in info.inputs)
        copies = built.multiplicity.get(name, 1) * repeats(built.options, parameter=False, backward=False)
        seconds = {lay: sum(node_compute(info, strategy, cluster, o, ins)) for lay, o in by_layout.items()}
        imbalance += copies * (seconds["contiguous"] - seconds["zigzag"])
    why = f"contiguous would add {imbalance:.3g} s of causal imbalance, zigzag {perm:.3g} s of reordering"
    if imbalance >= perm:
        return ContextChoice(axis, "zigzag", perm, f"ring attention on axis {axis}: zigzag layout ({why})")
    note = f"ring attention on axis {axis}: contiguous layout ({why}; searched with balanced rings)"
    return ContextChoice(axis, "contiguous", imbalance, note)


_ONE_RUN = ("embedding", "cross_entropy_loss", "nll_loss", "mse_loss", "l1_loss", "tril", "triu", "grouped_mm",
             "expert_mlp")  # fmt: skip
"""Ops whose ``local_args`` hook reads this device's offset along a split dim (vocab-parallel lookups, sharded
losses, triangular masks, expert ranges): under zigzag a device holds two runs, which they do not take."""


def one_run_ops(infos: Mapping[str, NodeInfo], chosen: Mapping[str, OpStrategy], axis: int) -> list[str]:
    return [infos[name].module or name for name, s in chosen.items() if needs_one_run(infos[name], s, axis)]


def needs_one_run(info: NodeInfo, strategy: OpStrategy, axis: int) -> bool:
    """Whether the op reads one run of a dim its strategy splits on ``axis`` (``_ONE_RUN``): a
    :class:`ZigzagCluster` on ``axis`` refuses that strategy."""
    if not one_run_op(info):
        return False
    if "embedding" in info.target:  # a lookup reads only its table's vocab offset (ids may split freely)
        table = strategy.inputs[0] if strategy.inputs else None
        return table is not None and table.placements[axis] == Shard(0)
    return any(spec is not None and isinstance(spec.placements[axis], Shard) for spec in strategy.inputs)


def one_run_op(info: NodeInfo) -> bool:
    """Whether some strategy of the node may need one run of a split dim (:func:`needs_one_run`)."""
    return any(op in info.target for op in _ONE_RUN)


def ring_axis_of(infos: Mapping[str, NodeInfo], info: NodeInfo, strategy: OpStrategy) -> int | None:
    """The mesh axis an attention node's strategy rings over (K split along its sequence), else None."""
    if _SDPA not in info.target or len(strategy.inputs) < 3 or strategy.inputs[1] is None:
        return None
    k = _meta_of_input(infos, info, 1)
    if k is None:
        return None
    seq = len(k.shape) - 2
    return next((a for a, p in enumerate(strategy.inputs[1].placements) if p == Shard(seq)), None)


def ring_axis_of_plan(
    infos: Mapping[str, NodeInfo], chosen: Mapping[str, OpStrategy], mesh_shape: tuple[int, ...]
) -> int | None:
    axes = (ring_axis_of(infos, infos[name], s) for name, s in chosen.items())
    return next((a for a in axes if a is not None and mesh_shape[a] > 1), None)


def ring_variable(built: BuiltProblem) -> str | None:
    """The one variable with strategies that ring over an axis of more than one device (None: none or
    several, where "the plan rings on ``a``" is no one variable's choice)."""
    mesh = built.cluster.mesh_shape
    found = [
        name
        for name in built.variables
        if any(
            (r := ring_axis_of(built.infos, built.infos[name], s)) is not None and mesh[r] > 1
            for s in built.strategies[name]
        )
    ]
    return found[0] if len(found) == 1 else None


def zigzag_masks(
    built: BuiltProblem, axes: tuple[int, ...], ring: str | None, problem: SearchProblem
) -> tuple[np.ndarray | None, ...]:
    """``problem``'s allowed masks (its nodes: ``built``'s variables first) less the strategies that a zigzag
    on each of ``axes`` refuses (one-run ops split on it) or, given ``ring``, that do not ring on it (that
    variable's)."""
    masks = list(problem.allowed or (None,) * problem.num_nodes)
    for k, name in enumerate(built.variables):
        info = built.infos[name]
        if name != ring and not one_run_op(info):
            continue
        axis = (ring_axis_of(built.infos, info, s) if name == ring else None for s in built.strategies[name])
        keep = np.array(
            [
                any(not needs_one_run(info, s, a) and (name != ring or r == a) for a in axes)
                for s, r in zip(built.strategies[name], axis, strict=True)
            ]
        )
        if not keep.all():
            masks[k] = keep if masks[k] is None else masks[k] & keep
    return tuple(masks)


def context_degrees(
    infos: dict[str, NodeInfo], chosen: dict[str, OpStrategy], mesh_shape: tuple[int, ...]
) -> dict[str, int]:
    """``{"cp": n}`` when some attention node of the plan rings over an axis of ``n`` devices, else ``{}``."""
    degree = 1
    for name, strategy in chosen.items():
        info = infos[name]
        if _SDPA not in info.target or len(strategy.inputs) < 3 or strategy.inputs[1] is None:
            continue
        k = _meta_of_input(infos, info, 1)
        if k is None:
            continue
        seq = len(k.shape) - 2
        for a, p in enumerate(strategy.inputs[1].placements):
            if isinstance(p, Shard) and p.dim == seq:
                degree = max(degree, mesh_shape[a])
    return {"cp": degree} if degree > 1 else {}


def _meta_of_input(infos: Mapping[str, NodeInfo], info: NodeInfo, position: int) -> TensorMeta | None:
    return _meta(infos[info.inputs[position]], info.input_outputs[position])


def _meta(info: NodeInfo, which: int) -> TensorMeta | None:
    return info.outputs[which] if which < len(info.outputs) else None
