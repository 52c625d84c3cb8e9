"""Expert parallelism with all-to-all token dispatch: what an emitted module runs for a routed-experts node
(:func:`autoshard.capture.dispatch.routed_experts`) whose experts are split over one mesh axis together with
its tokens.

On each of the ``n`` devices of that axis's group, holding ``T`` tokens and experts
``[r·E/n, (r+1)·E/n)`` -- or, on the zigzag axis of context parallelism, where every split is stored zigzag,
chunks ``r`` and ``2n-1-r`` of ``2n`` (``expert_order``: expert ids are renumbered in storage order first):

1. sort the ``T·k`` token-expert pairs by expert (:func:`~autoshard.capture.dispatch.route_rows`); the rows
   for device ``d``'s experts are one contiguous run;
2. exchange the per-expert row counts (one all-to-all of ``E`` integers): each device learns how many rows of
   each of its experts every other device sends;
3. **dispatch**: ``all_to_all_single`` of the rows with uneven splits (c10d's ``alltoallv``; gloo and NCCL
   both run it);
4. regroup the received rows by expert and run the local experts
   (:func:`~autoshard.strategies.rules.moe.windowed_expert_mlp`, so an FFN split on another axis still works);
5. **combine**: ``all_to_all_single`` back with the splits swapped, then weight and sum each token's ``k``
   rows (:func:`~autoshard.capture.dispatch.combine_rows`).

Backward runs the two token all-to-alls again in reverse (autograd of :class:`_AllToAll`).  Each collective is
logged on the module's :class:`~autoshard.codegen.collectives.MeshComm` with the send buffer's planned size,
``T·k·H`` elements for the rows (the same on every rank; the actual split is data-dependent), as the plan lists
them (:mod:`autoshard.problem.dispatch`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from autoshard.capture.dispatch import combine_rows, route_rows
from autoshard.cluster import Cluster
from autoshard.codegen.collectives import CollectiveRecord, MeshComm
from autoshard.problem.dispatch import dispatch_steps
from autoshard.problem.graph import NodeInfo
from autoshard.strategies import OpStrategy

if TYPE_CHECKING:
    from autoshard.codegen.lower import LoweredGraph

__all__ = ["META_DISPATCH", "all_to_all_routed_experts", "with_dispatch", "zigzag_expert_order"]

META_DISPATCH = "autoshard_dispatch"
"""``node.meta`` key on a lowered routed-experts node: the forward all-to-alls it runs inside itself, which
backward runs again when it recomputes the node's block (``codegen.recompute``)."""


def _log(comm: MeshComm, phase: str, axis: int, nbytes: int) -> None:
    if comm.log is not None:
        comm.log.append(CollectiveRecord(phase, "all_to_all", axis, nbytes))


def _exchange(x: torch.Tensor, send: list[int], recv: list[int], group: Any) -> torch.Tensor:
    out = x.new_empty((sum(recv), *x.shape[1:]))
    dist.all_to_all_single(out, x.contiguous(), recv, send, group=group)
    return out


class _AllToAll(torch.autograd.Function):
    """Rows ``send[d]`` to device ``d``, ``recv[d]`` from it; backward sends the gradients back."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, send: list[int], recv: list[int], comm: MeshComm, axis: int, nbytes: int
    ) -> torch.Tensor:
        ctx.send, ctx.recv, ctx.comm, ctx.axis, ctx.nbytes = send, recv, comm, axis, nbytes
        _log(comm, "forward", axis, nbytes)
        return _exchange(x, send, recv, comm.group(axis))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        _log(ctx.comm, "backward", ctx.axis, ctx.nbytes)
        return _exchange(grad, ctx.recv, ctx.send, ctx.comm.group(ctx.axis)), None, None, None, None, None


def all_to_all_routed_experts(
    hidden: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    index: torch.Tensor,
    weights: torch.Tensor,
    act: Callable[[torch.Tensor], torch.Tensor],
    use_aten: bool,
    *,
    n_experts: int,
    axis: int,
    ffn_start: int,
    comm: MeshComm,
    expert_order: tuple[int, ...] | None = None,
) -> torch.Tensor:
    """This device's tokens through the experts of the whole axis group (module doc): ``hidden`` (T, H),
    ``index``/``weights`` (T, k) are this device's tokens; ``gate_up``/``down`` its experts; ``expert_order``
    the expert ids in the axis's storage order (None: in order)."""
    from autoshard.strategies.rules.moe import windowed_expert_mlp

    n, local = comm.mesh_shape[axis], gate_up.shape[0]
    k, group = index.shape[-1], comm.group(axis)
    if expert_order is not None:  # expert id -> its position in storage order
        position = torch.empty(n_experts, dtype=index.dtype, device=index.device)
        position[torch.tensor(expert_order, device=index.device)] = torch.arange(
            n_experts, dtype=index.dtype, device=index.device
        )
        index = position[index]
    perm, _ = route_rows(index, n_experts)
    rows = hidden[perm // k]  # (T*k, H) in expert order
    counts = torch.bincount(index.reshape(-1), minlength=n_experts).to(torch.int64)
    received = torch.empty_like(counts)  # block s: device s's rows for each of this device's experts
    dist.all_to_all_single(received, counts, group=group)
    _log(comm, "forward", axis, counts.numel() * counts.element_size())
    send = counts.view(n, local).sum(1).tolist()
    recv = received.view(n, local).sum(1).tolist()
    nbytes = rows.numel() * rows.element_size()
    mine = _AllToAll.apply(rows, send, recv, comm, axis, nbytes)  # (R, H): per source, by expert
    expert_of_row = torch.arange(local, device=mine.device).repeat(n).repeat_interleave(received)
    order = torch.argsort(expert_of_row, stable=True)
    offs = torch.cumsum(received.view(n, local).sum(0), 0, dtype=torch.int32)
    y = windowed_expert_mlp(mine[order], gate_up, down, offs, act, use_aten, 0, 0, ffn_start)
    back = torch.empty_like(order)
    back[order] = torch.arange(order.numel(), device=order.device)
    returned = _AllToAll.apply(y[back], recv, send, comm, axis, nbytes)  # (T*k, H) in expert order
    return combine_rows(returned, weights, perm, k).to(hidden.dtype)


def zigzag_expert_order(n_experts: int, n: int) -> tuple[int, ...]:
    """Expert ids in storage order when the experts' dim is split zigzag over ``n`` devices (module doc)."""
    from autoshard.strategies.local import zigzag_chunks

    chunk = n_experts // (2 * n)
    return tuple(e for r in range(n) for c in zigzag_chunks(r, n) for e in range(c * chunk, (c + 1) * chunk))


all_to_all_routed_experts.takes_comm = True  # type: ignore[attr-defined]  # codegen passes the MeshComm


def with_dispatch(
    lowered: LoweredGraph,
    infos: Mapping[str, NodeInfo],
    strategies: Mapping[str, OpStrategy],
    cluster: Cluster,
    training: bool,
) -> LoweredGraph:
    """``lowered`` with the all-to-alls its routed-experts nodes run inside themselves listed like an edge's
    moves (:mod:`autoshard.problem.dispatch`, the steps the plan lists), and marked on those nodes."""
    from autoshard.codegen.lower import EdgeRecord

    records = []
    by_name = {n.name: n for n in lowered.graph.nodes}
    for name, strategy in strategies.items():
        info = infos.get(name)
        if info is None or not info.target.endswith("routed_experts"):
            continue
        forward, backward = dispatch_steps(info, strategy, cluster, tuple(infos[s] for s in info.inputs))
        if forward and name in by_name:
            by_name[name].meta[META_DISPATCH] = forward
            records.append(EdgeRecord(name, name, forward, backward if training else ()))
    return dataclasses.replace(lowered, edges=(*lowered.edges, *records)) if records else lowered
