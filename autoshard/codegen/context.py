"""Context parallelism: causal attention with the sequence split over one mesh axis's process group.

torch's ``context_parallel`` fails on CPU (ARCHITECTURE.md), so the two variants are written here with plain
``torch.distributed`` point-to-point and collective calls:

- :func:`ring_attention`: K/V chunks travel around the ring (``isend``/``irecv`` to the next rank) while each
  rank attends its queries to the chunk it holds -- with torch's fused attention op per block where one applies
  (:mod:`autoshard.codegen.ring_kernels` says which path runs when); partial results merge by log-sum-exp.
  Backward runs the ring again, the K/V gradients travelling with their chunks and arriving home after one
  extra hop.  It is an op of its own (``torch.ops.autoshard.ring_attention``, with its autograd formula), so
  that selective recomputation saves its output as it saves a fused attention's
  (:mod:`autoshard.codegen.recompute`), and every hop can be logged (``MeshComm.hops``, counted by verify
  against ``Plan.ring_transfers``).
  Grouped-query K/V copies (HF's ``repeat_kv``) travel as one head per run of copies (:func:`context_sdpa`).
- :func:`autoshard.codegen.context_gather.allgather_kv_attention`: K and V are all-gathered once; backward
  all-reduces their gradients and keeps the local chunks (gloo has no reduce-scatter).

Sequence layout.  With ``layout="zigzag"`` (the load-balanced one) the sequence is cut into ``2n`` chunks and
rank ``r`` holds chunks ``r`` and ``2n-1-r``: under a causal mask every rank then does the same work.  With
``"contiguous"`` rank ``r`` holds chunk ``r`` of ``n`` (rank ``n-1`` does ``2n-1`` times rank 0's work).
:func:`shard_sequence` / :func:`unshard_sequence` map a whole tensor to a rank's piece and back.

Shapes: ``q (B, H, L, E)``, ``k (B, Hkv, L, E)``, ``v (B, Hkv, L, Ev)`` with ``L`` the local length and
``H`` a multiple of ``Hkv`` (grouped-query attention: query head ``h`` reads kv head ``h // (H / Hkv)``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Literal

import torch
import torch.distributed as dist

from autoshard.codegen.collectives import RingHop
from autoshard.codegen.ring_kernels import (
    Block,
    Visibility,
    block_backward,
    block_dtype,
    block_forward,
    fused_calls,
    kernel,
    merge,
    visibility,
)
from autoshard.problem.attention import kv_stride
from autoshard.strategies.local import zigzag_chunks

__all__ = [
    "Layout",
    "chunk_ids",
    "ring_attention",
    "ring_op",
    "shard_sequence",
    "unshard_sequence",
]

Layout = Literal["zigzag", "contiguous"]
Chunks = tuple[int, ...]  # global chunk indices, in local order


def chunk_ids(rank: int, size: int, layout: Layout) -> tuple[int, ...]:
    """Global chunk indices a rank holds, in local order (chunks are ``L_global / (2n)`` or ``/ n`` long)."""
    return zigzag_chunks(rank, size) if layout == "zigzag" else (rank,)


def _chunks(size: int, layout: Layout) -> int:
    return 2 * size if layout == "zigzag" else size


def shard_sequence(
    x: torch.Tensor, dim: int, rank: int, size: int, layout: Layout = "zigzag"
) -> torch.Tensor:
    """The piece of ``x`` (whole sequence along ``dim``) that ``rank`` of ``size`` holds."""
    pieces = x.chunk(_chunks(size, layout), dim=dim)
    return torch.cat([pieces[i] for i in chunk_ids(rank, size, layout)], dim=dim)


def unshard_sequence(pieces: list[torch.Tensor], dim: int, layout: Layout = "zigzag") -> torch.Tensor:
    """The whole sequence from every rank's piece (``pieces[r]`` from rank ``r``)."""
    size = len(pieces)
    ordered: dict[int, torch.Tensor] = {}
    for rank, piece in enumerate(pieces):
        ids = chunk_ids(rank, size, layout)
        for i, part in zip(ids, piece.chunk(len(ids), dim=dim), strict=True):
            ordered[i] = part
    return torch.cat([ordered[i] for i in range(_chunks(size, layout))], dim=dim)


def _expand_kv(t: torch.Tensor, heads: int) -> torch.Tensor:
    return t if t.shape[1] == heads else t.repeat_interleave(heads // t.shape[1], dim=1)


def _fold_kv(grad: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """Sum the gradient of an expanded K/V over each group of query heads."""
    b, h, length, e = grad.shape
    return grad if h == kv_heads else grad.reshape(b, kv_heads, h // kv_heads, length, e).sum(2)


def _positions(ids: tuple[int, ...], chunk: int, device: torch.device) -> torch.Tensor:
    return torch.cat([torch.arange(i * chunk, (i + 1) * chunk, device=device) for i in ids])


def _mask(
    q_ids: tuple[int, ...],
    k_ids: tuple[int, ...],
    chunk: int,
    device: torch.device,
    rows: torch.Tensor | None,
) -> torch.Tensor:
    """Visibility (True = attend) of the held key chunks from the local queries: causal by global position,
    or the columns of ``rows`` (this rank's rows of an explicit boolean mask over every key)."""
    pos_k = _positions(k_ids, chunk, device)
    if rows is not None:
        return rows[..., pos_k]
    return pos_k[None, :] <= _positions(q_ids, chunk, device)[:, None]


def _blocks(
    q_ids: tuple[int, ...],
    k_ids: tuple[int, ...],
    chunk: int,
    device: torch.device,
    rows: torch.Tensor | None,
    causal: bool = True,
) -> list[Block]:
    """The (query chunk, key chunk) pairs with something to compute: a causal pair below the diagonal is whole
    (``"all"``), on it the lower triangle (``"causal"``), above it skipped; without a mask and not ``causal``
    every pair is whole (nothing is materialised for it); under an explicit mask, pairs with no
    visible entry are skipped, wholly visible ones are ``"all"``, ones equal to the triangle ``"causal"`` (both
    run fused, :mod:`autoshard.codegen.ring_kernels`), the rest keep their boolean visibility (math).
    Skipping is what makes the zigzag layout balanced: every rank computes ``2n`` chunk pairs (two of them
    half), where the contiguous layout's last rank computes ``n`` blocks of four pairs each."""
    out: list[Block] = []
    for a, qi in enumerate(q_ids):
        for b, ki in enumerate(k_ids):
            qs, ks = slice(a * chunk, (a + 1) * chunk), slice(b * chunk, (b + 1) * chunk)
            if rows is not None:
                visible = _mask((qi,), (ki,), chunk, device, rows[..., qs, :])
                if not visible.any():
                    continue
                out.append((qs, ks, visibility(visible)))
            elif ki < qi or not causal:
                out.append((qs, ks, "all"))
            elif ki == qi:
                out.append((qs, ks, "causal"))
    return out


def _peers(group: Any) -> tuple[int, int, int, int]:
    group = group if group is not None else dist.group.WORLD
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    nxt = dist.get_global_rank(group, (rank + 1) % size)
    prv = dist.get_global_rank(group, (rank - 1) % size)
    return rank, size, nxt, prv


HopLog = Callable[[str, int, int, int], None]  # (phase, bytes this rank sends in one hop, sends, elements)


def _note(hops: HopLog | None, phase: str, tensors: list[torch.Tensor]) -> None:
    if hops is not None:
        nbytes = sum(t.numel() * t.element_size() for t in tensors)
        hops(phase, nbytes, len(tensors), sum(t.numel() for t in tensors))


def _rotate(tensors: list[torch.Tensor], nxt: int, prv: int, group: Any) -> list[torch.Tensor]:
    """Send each tensor to the next rank, receive the previous rank's (one ring hop).  Both buffers are
    contiguous whatever the strides of ``tensors`` (a transposed K, or ``zeros_like`` of one): gloo sends and
    receives only dense buffers, and ``empty_like`` would copy the strides."""
    received = [torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in tensors]
    ops = [dist.P2POp(dist.isend, t.contiguous(), nxt, group) for t in tensors]
    ops += [dist.P2POp(dist.irecv, r, prv, group) for r in received]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    return received


_RINGS: dict[int, tuple[Any, HopLog | None]] = {}  # the ring op's non-tensor arguments, by key
_KEYS: dict[tuple[int, int], int] = {}


def _ring_key(group: Any, hops: HopLog | None) -> int:
    """A stable int naming (process group, hop log) for the op's schema (both stay referenced here)."""
    ident = (id(group), id(hops))
    if ident not in _KEYS:
        _KEYS[ident] = len(_RINGS)
        _RINGS[len(_RINGS)] = (group, hops)
    return _KEYS[ident]


def _accumulation(dtype: torch.dtype) -> torch.dtype:
    """The dtype the ring merges and accumulates in (its lse, out, dQ, dK, dV sums): float32 for 16-bit inputs
    (as fused attention kernels keep their softmax statistics), float64 for float64."""
    return torch.promote_types(dtype, torch.float32)


@torch.library.custom_op("autoshard::ring_attention", mutates_args=())
def _ring_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    ring: int,
    layout: str,
    scale: float,
    causal: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of this rank's queries against every K/V block, the blocks travelling around the ring: the
    keys ``mask`` shows, else causal by global position, else (not ``causal``) every key.  An op of its own,
    so that selective recomputation keeps its output (``codegen/recompute.SAVED_OPS``) as it keeps a fused
    attention's, rather than running the ring again in backward.  Each block runs torch's fused attention
    where one applies (:mod:`autoshard.codegen.ring_kernels` says which path runs when)."""
    group, hops = _RINGS[ring]
    rank, size, nxt, prv = _peers(group)
    ids = chunk_ids(rank, size, layout)  # type: ignore[arg-type]
    chunk = q.shape[2] // len(ids)
    heads = q.shape[1]
    # the merged statistics and output accumulate in float32, as fused attention kernels keep theirs (a
    # bfloat16 lse is off by ~3% of a probability); K/V travel in their own dtype, as priced
    acc = _accumulation(q.dtype)
    lse = torch.full(q.shape[:3], -math.inf, dtype=acc, device=q.device)  # (B, H, L)
    out = torch.zeros(*q.shape[:3], v.shape[-1], dtype=acc, device=q.device)
    kv, fused = [k, v], None
    for step in range(size):
        owner = (rank - step) % size
        ke, ve = _expand_kv(kv[0], heads), _expand_kv(kv[1], heads)
        fused = kernel(q, ke, ve) if step == 0 else fused
        held = chunk_ids(owner, size, layout)  # type: ignore[arg-type]
        for qs, ks, visible in _step_blocks(fused, ids, held, chunk, q, mask, causal):
            qb, kb, vb = _block_inputs(fused, visible, q[:, :, qs], ke[:, :, ks], ve[:, :, ks])
            merge(out, lse, qs, *block_forward(fused, qb, kb, vb, visible, scale))
        if step + 1 < size:
            _note(hops, "forward", kv)
            kv = _rotate(kv, nxt, prv, group)
    return out.to(q.dtype), lse


def _step_blocks(
    fused: Any, ids: Chunks, held: Chunks, chunk: int, q: torch.Tensor, mask: Any, causal: bool
) -> list[Block]:
    """The blocks one ring step computes against the held K/V (chunks ``held``): chunk pairs, as fewer,
    larger calls when a fused op runs them (one ``"all"`` call per step on a ring without mask or causality)."""
    blocks = _blocks(ids, held, chunk, q.device, mask, causal)
    return blocks if fused is None else fused_calls(blocks, chunk)


def _block_inputs(fused: Any, visible: Visibility, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """A block's tensors in the dtype its path computes in (:func:`~autoshard.codegen.ring_kernels.block_dtype`)."""
    dtype = block_dtype(fused, visible, tensors[0].dtype)
    return tuple(t.to(dtype) for t in tensors)


@_ring_op.register_fake
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *_: Any) -> tuple[torch.Tensor, torch.Tensor]:
    return q.new_empty(*q.shape[:3], v.shape[-1]), q.new_empty(q.shape[:3], dtype=_accumulation(q.dtype))


def _save(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, torch.Tensor]) -> None:
    q, k, v, mask, ring, layout, scale, causal = inputs
    ctx.save_for_backward(q, k, v, *output, mask)
    ctx.ring, ctx.layout, ctx.scale, ctx.causal = ring, layout, scale, causal


def _ring_backward(
    ctx: Any, grad_out: torch.Tensor, _: torch.Tensor | None
) -> tuple[torch.Tensor | None, ...]:
    """The ring again: K, V and their gradients travel; the last hop brings dK, dV home.  Each block's
    backward (fused where the forward's was) is given the global out and lse of its query rows."""
    q, k, v, out, lse, mask = ctx.saved_tensors
    layout, scale = ctx.layout, ctx.scale
    group, hops = _RINGS[ctx.ring]
    rank, size, nxt, prv = _peers(group)
    ids = chunk_ids(rank, size, layout)
    chunk = q.shape[2] // len(ids)
    heads, kv_heads = q.shape[1], k.shape[1]
    acc = _accumulation(q.dtype)  # gradients accumulate in float32; what travels keeps K/V's dtype, as priced
    grad = grad_out.to(q.dtype)
    delta = (grad.to(acc) * out.to(acc)).sum(-1, keepdim=True)  # (B, H, L, 1), for math blocks
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    travelling = [k, v, torch.zeros_like(k), torch.zeros_like(v)]  # K, V and their gradients so far
    fused = None
    for step in range(size):
        owner = (rank - step) % size
        kk, vv, dk_in, dv_in = travelling
        ke, ve = _expand_kv(kk, heads), _expand_kv(vv, heads)
        fused = kernel(q, ke, ve) if step == 0 else fused
        dk, dv = dk_in.to(acc), dv_in.to(acc)
        held = chunk_ids(owner, size, layout)
        for qs, ks, visible in _step_blocks(fused, ids, held, chunk, q, mask, ctx.causal):
            gb, qb, kb, vb, ob = _block_inputs(
                fused, visible, grad[:, :, qs], q[:, :, qs], ke[:, :, ks], ve[:, :, ks], out[:, :, qs]
            )
            rows = (lse[:, :, qs], delta[:, :, qs])
            dq_b, dk_b, dv_b = block_backward(fused, gb, qb, kb, vb, ob, *rows, visible, scale)
            dq[:, :, qs] += dq_b
            dk[:, :, ks] += _fold_kv(dk_b.to(acc), kv_heads)
            dv[:, :, ks] += _fold_kv(dv_b.to(acc), kv_heads)
        sent = [kk, vv, dk.to(k.dtype), dv.to(v.dtype)]
        _note(hops, "backward", sent)
        travelling = _rotate(sent, nxt, prv, group)
    return dq.to(q.dtype), travelling[2], travelling[3], None, None, None, None, None


_ring_op.register_autograd(_ring_backward, setup_context=_save)


def ring_op() -> Any:
    """The ring's op overload (``torch.ops.autoshard.ring_attention.default``), for recomputation policies."""
    return torch.ops.autoshard.ring_attention.default


def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    group: Any = None,
    layout: Layout = "zigzag",
    mask: torch.Tensor | None = None,
    scale: float | None = None,
    hops: HopLog | None = None,
    causal: bool = True,
) -> torch.Tensor:
    """Attention of this rank's sequence piece (``layout``) against the whole sequence, by a K/V ring.

    Causal unless ``mask`` is given: then ``mask`` holds this rank's query rows over every key in global
    order (``(..., L_local, L_global)``, True = attend), e.g. a model's explicit mask split along queries.
    Without a mask, ``causal=False`` attends every key: every block runs whole (``"all"``), and no mask is
    built.  A mask decides alone (``causal`` is then not read).
    ``hops``: called ``(phase, bytes sent, sends, elements sent)`` before every hop (verify counts them,
    :class:`RingHop`); pass the same callable for every call on one ring (it keys the op's arguments).
    """
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    return _ring_op(q, k, v, mask, _ring_key(group, hops), layout, float(scale), causal and mask is None)[0]


def context_sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    *,
    axis: int,
    comm: Any,
    scale: float | None = None,
    is_causal: bool = False,
    kv_repeats: int = 1,
) -> torch.Tensor:
    """What an emitted module runs for ``scaled_dot_product_attention`` under a ring strategy on ``axis``.

    The sequence layout is the plan's for that axis: zigzag when ``axis`` is ``comm.zigzag_axis`` (the
    plan's ``context_layout``), else contiguous; ``attn_mask`` holds this rank's query rows (in that layout)
    over every key (in global order).  Without a mask and without ``is_causal`` every key is visible: the ring
    then runs every block whole, with no (local queries x global keys) mask built.
    ``comm`` is the emitted module's :class:`~autoshard.codegen.collectives.MeshComm`.

    ``kv_repeats``: ``k`` and ``v`` are grouped-query copies, each K/V head repeated that many times in a row
    (``META_KV_REPEATS``).  The ring then rotates every :func:`~autoshard.problem.attention.kv_stride`-th
    local head and copies it back per hop -- the bytes the plan prices (``Plan.ring_transfers``).  Autograd
    sends the gradient of the copies to the heads read, and the graph's own copy (``expand``) sums it back.

    Under ``torch.autocast`` q, k and v are cast to autocast's dtype first, as autocast casts the operands
    of ``scaled_dot_product_attention``, and the ring runs with autocast off on them: its K/V blocks and
    their gradients travel in that dtype, the bytes the amp recipe prices
    (:func:`autoshard.problem.autocast.ring_itemsize`).
    """
    if attn_mask is not None and attn_mask.dtype != torch.bool:
        raise TypeError(f"ring attention takes a boolean mask, got {attn_mask.dtype}")
    layout: Layout = "zigzag" if comm.zigzag_axis == axis else "contiguous"
    if kv_repeats > 1:
        k = k[:, :: kv_stride(kv_repeats, k.shape[1])]
        v = v[:, :: kv_stride(kv_repeats, v.shape[1])]
    device = q.device.type
    ring = (comm.group(axis), layout, attn_mask, scale, _hop_log(comm, axis), is_causal)
    if not torch.is_autocast_enabled(device):
        return ring_attention(q, k, v, *ring)
    low = torch.get_autocast_dtype(device)
    q, k, v = (t.to(low) if t.is_floating_point() else t for t in (q, k, v))
    with torch.autocast(device, enabled=False):
        return ring_attention(q, k, v, *ring)


_LOGS: dict[tuple[int, int], HopLog] = {}


def _hop_log(comm: Any, axis: int) -> HopLog | None:
    """One callable per (comm's hop list, axis) appending a :class:`RingHop` per hop, or None unrecorded."""
    hops = comm.hops
    if hops is None:
        return None

    def note(phase: str, nbytes: int, sends: int, elements: int) -> None:
        hops.append(RingHop(phase, axis, nbytes, sends, elements))

    return _LOGS.setdefault((id(hops), axis), note)


context_sdpa.takes_comm = True  # type: ignore[attr-defined]  # codegen passes the module's MeshComm
