"""Context parallelism's all-gather-KV variant: K and V gathered once, every rank's queries against them.

Beside the ring (:mod:`autoshard.codegen.context`, whose sequence layouts and helpers it shares): backward
all-reduces the K/V gradients and keeps this rank's chunks (gloo has no reduce-scatter).  Shapes as there.

Example (inside an initialised process group)::

    out = allgather_kv_attention(q, k, v, group, "zigzag")   # this rank's queries, causal over every key
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from autoshard.codegen.context import (
    Layout,
    _chunks,
    _expand_kv,
    _mask,
    chunk_ids,
    shard_sequence,
    unshard_sequence,
)

__all__ = ["allgather_kv_attention"]


def _local_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor
) -> torch.Tensor:
    heads = q.shape[1]
    return torch.nn.functional.scaled_dot_product_attention(
        q, _expand_kv(k, heads), _expand_kv(v, heads), attn_mask=visible
    )


class _Gathered(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: Any, layout: Layout
    ) -> torch.Tensor:
        rank, size = dist.get_rank(group), dist.get_world_size(group)
        ids = chunk_ids(rank, size, layout)
        chunk = q.shape[2] // len(ids)
        whole_k, whole_v = (_all_gather_sequence(t, group, layout) for t in (k, v))
        visible = _mask(ids, tuple(range(_chunks(size, layout))), chunk, q.device, None)
        ctx.save_for_backward(q, whole_k, whole_v, visible)
        ctx.group, ctx.layout = group, layout
        return _local_attention(q, whole_k, whole_v, visible)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, whole_k, whole_v, visible = ctx.saved_tensors
        group, layout = ctx.group, ctx.layout
        rank, size = dist.get_rank(group), dist.get_world_size(group)
        with torch.enable_grad():
            leaves = [t.detach().requires_grad_(True) for t in (q, whole_k, whole_v)]
            out = _local_attention(leaves[0], leaves[1], leaves[2], visible)
            dq, dk, dv = torch.autograd.grad(out, leaves, grad_out)
        for grad in (dk, dv):  # every rank's queries read every key: sum, then keep this rank's piece
            dist.all_reduce(grad, group=group)
        dim = 2
        return (
            dq,
            shard_sequence(dk, dim, rank, size, layout),
            shard_sequence(dv, dim, rank, size, layout),
            None,
            None,
        )


def _all_gather_sequence(t: torch.Tensor, group: Any, layout: Layout) -> torch.Tensor:
    pieces = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(pieces, t.contiguous(), group=group)
    return unshard_sequence(pieces, 2, layout)


def allgather_kv_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: Any = None, layout: Layout = "zigzag"
) -> torch.Tensor:
    """Causal attention of this rank's sequence piece against the whole sequence, K/V all-gathered once."""
    return _Gathered.apply(q, k, v, group, layout)
