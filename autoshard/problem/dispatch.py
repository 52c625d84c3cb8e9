"""The price of all-to-all token dispatch: the collectives a routed-experts node runs inside itself.

A routed-experts strategy that splits tokens and experts on the same mesh axis of ``n`` devices
(:func:`autoshard.strategies.rules.dispatch.dispatch_axis`) runs, per MoE layer and microbatch
(:func:`autoshard.codegen.dispatch.all_to_all_routed_experts`):

- forward: one all-to-all of the per-expert row counts (``E`` int64: the split sizes), the **dispatch**
  and the **combine** all-to-all of the rows;
- backward: the two row all-to-alls again, in reverse (and the forward's three once more when recomputation
  re-runs the block).

Volume.  Each device holds ``T`` tokens (the batch rows left on it after every token split) and routes each to
``k`` experts, so its send buffer is ``S = c · T · k · H · b`` bytes (``H`` hidden, ``b`` bytes per element).
Dropless routing (transformers' grouped-GEMM experts: Mixtral, Qwen3-MoE, DeepSeek-V3) sends every row, the
*expected* volume ``c = 1``; the share ``E_local / E = 1/n`` of the rows whose expert is local stays home, which
is the ``(n − 1)/n`` of the all-to-all's nccl-tests cost ``(n−1)·α + (n−1)/n · S/B`` (REFERENCE.md; all-to-all
``S`` is each rank's buffer, ``cost_models.collectives``).  With a capacity (GShard, Lepikhin et al. 2020,
§2.2: expert capacity ``C = c · T·k / E`` rows per expert, the dispatched tensor ``(E, C, H)``) the buffer is
``E · C · H · b = c · T·k·H·b``: the same formula with the model's capacity factor ``c``.  Megatron-Core's MoE
documentation describes the same two dispatchers (``--moe-token-dispatcher-type allgather`` / ``alltoall``).

Against the all-gather dispatcher on the same axis (``T·n`` tokens gathered, a ``T·n × H`` Partial reduced:
``2(n−1) · T·H·b`` on the wire per device) the all-to-all moves ``2(n−1)/n · T·k·H·b``: cheaper by ``n / k``,
so it wins once the axis is wider than top-k.  Which one runs is the solver's choice, by these costs.

Uneven routing (a hot expert) makes the real all-to-all longer than the expected volume: not modelled.
"""

from __future__ import annotations

from typing import Any

from autoshard.capture.meta import TensorMeta
from autoshard.cluster import Cluster
from autoshard.placement import Shard
from autoshard.problem.costs import CostOptions, Recompute
from autoshard.problem.graph import NodeInfo
from autoshard.redistribute import Step
from autoshard.strategies import OpStrategy
from autoshard.strategies.rules.dispatch import dispatch_axis

__all__ = [
    "DROPLESS_CAPACITY_FACTOR", "dispatch_seconds", "dispatch_steps", "dispatch_times", "dispatch_total",
    "may_dispatch", "rerun_in_backward"
]  # fmt: skip

DROPLESS_CAPACITY_FACTOR = 1.0
"""``c`` for dropless routing: the expected volume, every routed row sent once (module doc)."""

_COUNT_BYTES = 8  # the split sizes travel as int64 (codegen.dispatch: torch.bincount)


def may_dispatch(info: NodeInfo, inputs: tuple[NodeInfo, ...]) -> bool:
    """Whether any strategy of the node can run all-to-alls (:func:`dispatch_steps` is empty otherwise)."""
    return info.target.endswith("routed_experts") and len(inputs) >= 4


def dispatch_steps(
    info: NodeInfo,
    strategy: OpStrategy,
    cluster: Cluster,
    inputs: tuple[NodeInfo, ...],
    capacity_factor: float = DROPLESS_CAPACITY_FACTOR,
) -> tuple[tuple[Step, ...], tuple[Step, ...]]:
    """(forward, backward) all-to-alls that ``strategy`` runs inside a routed-experts node; ``((), ())`` for
    any other node or strategy."""
    if not may_dispatch(info, inputs):
        return (), ()
    axis = dispatch_axis(strategy)
    mesh = cluster.mesh_shape
    if axis is None or mesh[axis] == 1:
        return (), ()
    hidden, gate_up, index = (_meta(inputs[i], info.input_outputs[i]) for i in (0, 1, 3))
    spec = strategy.inputs[0]
    if hidden is None or gate_up is None or index is None or spec is None:
        return (), ()
    tokens = hidden.shape[0]
    for a, p in enumerate(spec.placements):
        tokens //= mesh[a] if isinstance(p, Shard) else 1
    rows = int(capacity_factor * tokens * index.shape[-1])
    send = rows * hidden.shape[-1] * hidden.itemsize
    counts = Step("all_to_all", axis, 0, 0, gate_up.shape[0] * _COUNT_BYTES)
    row_steps = (Step("all_to_all", axis, 0, 0, send),) * 2  # dispatch, combine
    return (counts, *row_steps), row_steps if info.requires_grad else ()


def dispatch_times(
    info: NodeInfo, strategy: OpStrategy, cluster: Cluster, inputs: tuple[NodeInfo, ...]
) -> tuple[float, float]:
    """(forward, backward) seconds per microbatch of :func:`dispatch_steps`."""
    forward, backward = dispatch_steps(info, strategy, cluster, inputs)

    def seconds(steps: tuple[Step, ...]) -> float:
        return sum(cluster.collective_time(s.kind, s.nbytes, axis=s.mesh_axis) for s in steps)

    return seconds(forward), seconds(backward)


def rerun_in_backward(info: NodeInfo, opts: CostOptions) -> bool:
    """Whether backward re-runs the node's forward all-to-alls: recomputation re-runs a whole block
    (``codegen.recompute``), and the collectives inside this node with it."""
    return opts.training and opts.recompute is not Recompute.NONE and info.block is not None


def dispatch_seconds(
    info: NodeInfo, strategy: OpStrategy, cluster: Cluster, inputs: tuple[NodeInfo, ...], opts: CostOptions
) -> float:
    """Seconds per microbatch of :func:`dispatch_steps`: backward when training, the forward again when
    backward recomputes the block."""
    fwd, bwd = dispatch_times(info, strategy, cluster, inputs)
    return float(dispatch_total(info, fwd, bwd, opts))


def dispatch_total(info: NodeInfo, fwd: Any, bwd: Any, opts: CostOptions) -> Any:
    """:func:`dispatch_seconds` from :func:`dispatch_times`: floats for one strategy or arrays over a node's
    strategies alike (the builder composes every recomputation policy from them)."""
    if not opts.training:
        return fwd
    return fwd * (1 + (opts.recompute_share if rerun_in_backward(info, opts) else 0)) + bwd


def _meta(info: NodeInfo, which: int) -> TensorMeta | None:
    return info.outputs[which] if which < len(info.outputs) else None
