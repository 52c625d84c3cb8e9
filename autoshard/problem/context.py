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
- balance: the plan's blocks are contiguous, so under an implicit causal mask (FLOPs counted for the
  triangle) the last device does ``(2n − 1)/n`` times the average work, and the step waits for it.  With an
  explicit mask the FLOPs already count the full square, which is what the last device computes.

Pure: functions of the node record, the strategy and the cluster.
"""

from __future__ import annotations

from autoshard.capture.meta import TensorMeta
from autoshard.cluster import Cluster
from autoshard.placement import Shard, ShardingSpec
from autoshard.problem.graph import NodeInfo
from autoshard.strategies import OpStrategy

__all__ = ["context_degrees", "ring_seconds"]

_SDPA = "scaled_dot_product_attention"


def ring_seconds(
    info: NodeInfo,
    strategy: OpStrategy,
    cluster: Cluster,
    inputs: tuple[NodeInfo, ...],
    fwd: float,
    bwd: float,
) -> tuple[float, float]:
    """(forward, backward) seconds a ring strategy adds on top of the node's balanced compute."""
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
    skew = (n - 1) / n if causal_triangle else 0.0
    return skew * fwd + max(0.0, comm_fwd - fwd), skew * bwd + max(0.0, comm_bwd - bwd)


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


def _meta_of_input(infos: dict[str, NodeInfo], info: NodeInfo, position: int) -> TensorMeta | None:
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
