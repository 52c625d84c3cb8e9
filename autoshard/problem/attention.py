"""What attention over an explicit mask proven causal runs, and so what it costs.

Hugging Face models hand ``scaled_dot_product_attention`` an explicit ``(B, 1, S, S)`` boolean mask;
:mod:`autoshard.capture.causal` proves it causal where it is (``NodeInfo.causal_mask``).  Its counted FLOPs
(:mod:`autoshard.capture.flops`) are the full square, since ``is_causal`` is false in the graph.  What the
emitted program runs depends on the node's strategy (one rule, :func:`runs_causal`, read by the attention
rule's ``local_args`` hook in :mod:`autoshard.strategies.rules.attention` and by the pricing here):

- query rows whole on every axis (replicated, batch or head splits): ``is_causal=True`` without the mask,
  the kernel skips the hidden blocks;
- a ring over the sequence (context parallelism, q, k and v all split along it):
  :func:`autoshard.codegen.context.context_sdpa` runs each chunk pair causal from global positions;
- query rows split with the keys whole (the query-length split): each piece needs its rows of the mask, and
  the kernel computes the full square of that piece.

Priced (:func:`causal_attention`, called from :func:`autoshard.problem.costs.node_compute`): when it runs
causal, the FLOPs are the triangle's share of the square (:func:`cost_models.compute.causal_share`, the same
share an ``is_causal`` node's count keeps) and the mask's bytes are not read.  A ring's imbalance and hops are
priced on top by :mod:`autoshard.problem.context`.

Grouped-query K/V and the ring.  Where K and V are grouped-query copies (``NodeInfo.kv_repeats`` ``r``:
each K/V head repeated ``r`` times in a row, proven by :mod:`autoshard.capture.gqa`), a device's ``h``
contiguous heads of them come in runs of :func:`kv_stride` ``= gcd(r, h)`` equal heads.  The ring rotates one
head of each run and copies it back per hop (:func:`autoshard.codegen.context.context_sdpa`), so a hop
carries ``1 / kv_stride`` of the copied K/V's local bytes; :func:`ring_block_bytes` prices exactly that
(read by :mod:`autoshard.problem.context` and :mod:`autoshard.problem.ring_hops`), at the bytes per element
the ring sends them in: under the amp recipe autocast's 16-bit dtype, whatever the captured one
(:func:`autoshard.problem.autocast.ring_itemsize`).

Pure: functions of the node record and the strategy.

Example::

    share, unread = causal_attention(info, strategy, inputs, (2,))  # (0.5…, mask bytes) under a head split
    kv_stride(16, 16)   # LLaMA-3-405B's 128 heads over 8 K/V heads, TP 8: a hop carries 1/16 of the copies
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

from autoshard.capture.meta import TensorMeta
from autoshard.placement import Shard, ShardingSpec
from autoshard.problem.autocast import ring_itemsize
from autoshard.problem.graph import NodeInfo
from autoshard.strategies import OpStrategy
from cost_models.compute import causal_share

if TYPE_CHECKING:
    from cost_models.memory import PrecisionPolicy

__all__ = ["causal_attention", "kv_stride", "ring_block_bytes", "rows_split", "runs_causal"]


def rows_split(spec: ShardingSpec | None, rank: int) -> bool:
    """Whether ``spec`` splits a rank-``rank`` attention operand along its sequence (dim ``rank - 2``)."""
    return spec is not None and any(isinstance(p, Shard) and p.dim == rank - 2 for p in spec.placements)


def runs_causal(
    proven: bool, out: ShardingSpec | None, out_rank: int, operands: Iterable[tuple[ShardingSpec | None, int]]
) -> bool:
    """Whether attention over a mask proven causal (``proven``) runs a causal kernel without the mask under a
    strategy whose output spec is ``out`` and whose q, k, v have ``(spec, rank)`` ``operands`` (module doc):
    unless its query rows are split while some operand (the keys) stays whole."""
    if not proven:
        return False
    return not rows_split(out, out_rank) or all(rows_split(spec, rank) for spec, rank in operands)


def causal_attention(
    info: NodeInfo, strategy: OpStrategy, inputs: tuple[NodeInfo, ...], mesh: tuple[int, ...]
) -> tuple[float, float]:
    """(share of the counted FLOPs the kernel computes, local mask bytes it does not read) for an attention
    node under ``strategy``: ``(causal_share(S, S), mask bytes)`` where :func:`runs_causal`, else ``(1, 0)``."""
    out = info.outputs[0] if info.outputs else None
    if not info.causal_mask or out is None or len(out.shape) < 2:
        return 1.0, 0.0
    operands: list[tuple[ShardingSpec | None, int]] = []
    mask_bytes, seq_kv = 0.0, out.shape[-2]
    for src, which, spec in zip(inputs, info.input_outputs, strategy.inputs, strict=True):
        meta = src.outputs[which] if which < len(src.outputs) else None
        if meta is None:
            continue
        if meta.dtype == "bool":  # the mask: (..., S, S), its broadcast dims whole
            mask_bytes += meta.nbytes / _shards(spec, mesh)
        else:
            operands.append((spec, len(meta.shape)))
            seq_kv = meta.shape[-2] if len(meta.shape) >= 2 else seq_kv
    if not runs_causal(True, strategy.outputs[0], len(out.shape), operands):
        return 1.0, 0.0
    return causal_share(out.shape[-2], seq_kv), mask_bytes


def kv_stride(repeats: int, local_heads: int) -> int:
    """How many heads in a row of a device's ``local_heads`` contiguous heads of grouped-query K/V copies
    (each K/V head repeated ``repeats`` times, the block starting at a multiple of ``local_heads``) are copies
    of one head: ``gcd(repeats, local_heads)``.  The ring rotates every ``kv_stride``-th head (module doc)."""
    return math.gcd(max(1, repeats), max(1, local_heads))


def ring_block_bytes(
    info: NodeInfo,
    kv: tuple[TensorMeta, TensorMeta],
    specs: tuple[ShardingSpec | None, ShardingSpec | None],
    mesh: tuple[int, ...],
    precision: PrecisionPolicy | None = None,
) -> float:
    """Bytes of this device's K and V as the ring rotates them, one forward hop (module doc): the local
    pieces of K and V under ``specs``, each divided by its :func:`kv_stride`, at the bytes per element
    ``precision`` (``CostOptions.precision``) sends them in."""
    total = 0.0
    for meta, spec in zip(kv, specs, strict=True):
        size = ring_itemsize(info, meta.itemsize, precision)
        nbytes = meta.nbytes if size == meta.itemsize else meta.nbytes // meta.itemsize * size
        local = nbytes / _shards(spec, mesh)
        if info.kv_repeats > 1 and len(meta.shape) == 4:  # (B, H, S, E): heads on dim 1
            local /= kv_stride(info.kv_repeats, meta.shape[1] // _shards(spec, mesh, dim=1))
        total += local
    return total


def _shards(spec: ShardingSpec | None, mesh: tuple[int, ...], dim: int | None = None) -> int:
    """Pieces ``spec`` cuts a tensor into over ``mesh`` (along ``dim`` only, when given)."""
    shards = 1
    if spec is not None:
        for p, size in zip(spec.placements, mesh, strict=True):
            if isinstance(p, Shard) and dim in (None, p.dim):
                shards *= size
    return shards
