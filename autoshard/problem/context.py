"""The price of context parallelism: what a ring-attention strategy adds to an SDPA node's time.

A ring strategy (:mod:`autoshard.strategies.rules.attention`) splits q, k, v and the output along the
sequence over one mesh axis of ``n`` devices; :func:`autoshard.codegen.context.context_sdpa` runs it.  Per
step of the ring each device attends its queries to the K/V block it holds while sending that block on:

- forward: ``n - 1`` hops of the local K and V.  A ring all-gather of ``S = n · b`` bytes is exactly
  ``n - 1`` hops of ``b`` bytes (REFERENCE.md, ring all-gather ``(n−1)·α + (n−1)/n · S/B``), so the
  hops cost ``collective_time("all_gather", n · b)`` on that axis;
- backward: ``n`` hops (the last brings the K/V gradients home) of K, V, dK and dV: ``n / (n − 1)`` times
  the all-gather of ``2 · n · b``;
- overlap: each hop overlaps the block computed meanwhile, so only communication beyond the node's own
  compute shows: ``max(0, comm − compute)`` per pass;
- balance, by sequence layout (``Plan.context_layout``, :mod:`autoshard.codegen.context`): with the
  *contiguous* layout under an implicit causal mask (FLOPs counted for the triangle) the last device does
  ``(2n − 1)/n`` times the average work, and the step waits for it.  The *zigzag* layout (device ``k`` holds
  chunks ``k`` and ``2n − 1 − k`` of ``2n``) gives every device the same causal work: no imbalance term.  With
  an explicit mask the FLOPs already count the full square (the mask's contents are unknown when planning),
  which is what the contiguous layout's last device computes under a causal mask; both layouts are priced so.
- permutation (zigzag only, :func:`permutation_seconds`): a split on the ring axis is a copy either way, but a
  gather, reduce-scatter or all-to-all on that axis reorders the chunks: one more copy of the buffer through
  HBM (read and write), priced after the search from the plan's collectives on that axis.

Choosing (:func:`choose_layout`): the search prices rings balanced (``CostOptions.cp_layout`` ``"auto"`` or
``"zigzag"``); then the zigzag price is the plan's plus its permutation copies, the contiguous price the plan's
plus each ring's imbalance; the cheaper wins (zigzag on a tie: at run time it never computes more, and under a
causal mask the model builds itself it computes half as much on the busiest device).

Pure: functions of the node record, the strategy and the cluster.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from autoshard.capture.meta import TensorMeta
from autoshard.cluster import Cluster
from autoshard.errors import ShardingError
from autoshard.placement import Shard, ShardingSpec
from autoshard.problem.graph import NodeInfo
from autoshard.strategies import OpStrategy

if TYPE_CHECKING:
    from autoshard.problem.build import BuiltProblem

__all__ = [
    "ContextChoice",
    "choose_layout",
    "context_degrees",
    "permutation_seconds",
    "ring_axis_of",
    "ring_seconds",
]

Layout = Literal["contiguous", "zigzag"]

_SDPA = "scaled_dot_product_attention"


def ring_seconds(
    info: NodeInfo,
    strategy: OpStrategy,
    cluster: Cluster,
    inputs: tuple[NodeInfo, ...],
    fwd: float,
    bwd: float,
    layout: str = "zigzag",
) -> tuple[float, float]:
    """(forward, backward) seconds a ring strategy adds on top of the node's balanced compute, for the
    sequence ``layout`` (``"contiguous"``; ``"zigzag"`` or ``"auto"``: balanced)."""
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
    local = _local_bytes(k.nbytes, spec, cluster) + _local_bytes(v.nbytes, strategy.inputs[2], cluster)
    comm_fwd = cluster.collective_time("all_gather", n * local, axis=axis)
    comm_bwd = n / (n - 1) * cluster.collective_time("all_gather", 2 * n * local, axis=axis)
    causal_triangle = len(inputs) < 4  # no explicit mask: FLOPs counted for the causal triangle
    skew = (n - 1) / n if causal_triangle and layout == "contiguous" else 0.0
    return skew * fwd + max(0.0, comm_fwd - fwd), skew * bwd + max(0.0, comm_bwd - bwd)


@dataclass(frozen=True, slots=True)
class ContextChoice:
    """The sequence layout of a plan's ring axis and what it adds to the searched step time."""

    axis: int | None  # the ring axis (None: no ring)
    layout: Layout
    extra_seconds: float  # added to the step: zigzag's permutation copies, or contiguous's imbalance
    note: str = ""


def permutation_seconds(collectives: Iterable[object], axis: int, cluster: Cluster) -> float:
    """Seconds of zigzag's chunk reordering: one copy (read + write through HBM) of each gathered,
    reduce-scattered or all-to-all buffer on the ring axis (``Collective`` records: kind, nbytes, mesh_axis)."""
    n = cluster.mesh_shape[axis]
    total = 0.0
    for c in collectives:
        if getattr(c, "mesh_axis", None) != axis:
            continue
        kind, nbytes = getattr(c, "kind", ""), float(getattr(c, "nbytes", 0))
        if kind in ("all_gather", "reduce_scatter"):
            total += cluster.compute_time(0.0, 2 * nbytes, "bfloat16")
        elif kind == "all_to_all":  # the local buffer, reordered before sending and after receiving
            total += cluster.compute_time(0.0, 4 * nbytes / n, "bfloat16")
    return total


def choose_layout(
    built: BuiltProblem, chosen: Mapping[str, OpStrategy], collectives: Iterable[object]
) -> ContextChoice:
    """The layout of the plan's ring axis (module doc), given the search's problem and choice; the layout
    asked for is ``built.options.cp_layout``."""
    from autoshard.problem.costs import node_compute, repeats

    cluster, asked = built.cluster, built.options.cp_layout
    axis = _ring_axis_of_plan(built.infos, chosen, tuple(cluster.mesh_shape))
    if axis is None:
        return ContextChoice(None, "contiguous", 0.0)
    if asked == "contiguous":
        return ContextChoice(axis, "contiguous", 0.0)
    blockers = ", ".join(_one_run_ops(built.infos, chosen, axis)[:3])
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


def _one_run_ops(infos: Mapping[str, NodeInfo], chosen: Mapping[str, OpStrategy], axis: int) -> list[str]:
    out = []
    for name, strategy in chosen.items():
        info = infos[name]
        if "embedding" in info.target:  # a lookup reads only its table's vocab offset (ids may split freely)
            table = strategy.inputs[0]
            blocked = table is not None and table.placements[axis] == Shard(0)
        else:
            blocked = any(op in info.target for op in _ONE_RUN) and any(
                spec is not None and isinstance(spec.placements[axis], Shard) for spec in strategy.inputs
            )
        if blocked:
            out.append(info.module or name)
    return out


def ring_axis_of(infos: Mapping[str, NodeInfo], info: NodeInfo, strategy: OpStrategy) -> int | None:
    """The mesh axis an attention node's strategy rings over (K split along its sequence), else None."""
    if _SDPA not in info.target or len(strategy.inputs) < 3 or strategy.inputs[1] is None:
        return None
    k = _meta_of_input(infos, info, 1)
    if k is None:
        return None
    seq = len(k.shape) - 2
    return next((a for a, p in enumerate(strategy.inputs[1].placements) if p == Shard(seq)), None)


def _ring_axis_of_plan(
    infos: Mapping[str, NodeInfo], chosen: Mapping[str, OpStrategy], mesh_shape: tuple[int, ...]
) -> int | None:
    axes = (ring_axis_of(infos, infos[name], s) for name, s in chosen.items())
    return next((a for a in axes if a is not None and mesh_shape[a] > 1), None)


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


def _local_bytes(nbytes: int, spec: ShardingSpec | None, cluster: Cluster) -> float:
    if spec is None:
        return float(nbytes)
    shards = 1
    for p, size in zip(spec.placements, cluster.mesh_shape, strict=True):
        if isinstance(p, Shard):
            shards *= size
    return nbytes / shards
