"""Context parallelism on 4 real gloo ranks: ring and all-gather-KV attention (causal, GQA, zigzag and contiguous
layouts) match single-device attention in float64, forward and backward, and really communicate; grouped-query
K/V copies travel un-expanded, at the bytes the plan prices."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch
import torch.distributed as dist

from autoshard.capture.meta import TensorMeta
from autoshard.codegen.collectives import MeshComm
from autoshard.codegen.context import (
    _blocks,
    chunk_ids,
    context_sdpa,
    ring_attention,
    shard_sequence,
    unshard_sequence,
)
from autoshard.codegen.context_gather import allgather_kv_attention
from autoshard.placement import Shard, ShardingSpec
from autoshard.problem.attention import kv_stride, ring_block_bytes
from autoshard.problem.graph import NodeInfo
from autoshard.runtime.launch import launch

B, H, HKV, L, E = 2, 4, 2, 16, 8  # GQA: 2 query heads per kv head; 16 tokens = 8 chunks of 2 on 4 ranks


def _inputs() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, L, E, dtype=torch.float64, generator=g)
    k = torch.randn(B, HKV, L, E, dtype=torch.float64, generator=g)
    v = torch.randn(B, HKV, L, E, dtype=torch.float64, generator=g)
    grad = torch.randn(B, H, L, E, dtype=torch.float64, generator=g)
    return q, k, v, grad


def _reference() -> dict[str, torch.Tensor]:
    q, k, v, grad = (t.clone().requires_grad_(i < 3) for i, t in enumerate(_inputs()))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    out.backward(grad)
    return {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}


def _rank(variant: str, layout: str, masked: bool = False) -> dict[str, Any]:
    rank, size = dist.get_rank(), dist.get_world_size()
    calls = {"p2p": 0, "collective": 0}
    real_batch, real_gather, real_reduce = dist.batch_isend_irecv, dist.all_gather, dist.all_reduce

    def counted(real, kind):  # type: ignore[no-untyped-def]
        def call(*args, **kwargs):  # type: ignore[no-untyped-def]
            calls[kind] += 1
            return real(*args, **kwargs)

        return call

    dist.batch_isend_irecv = counted(real_batch, "p2p")  # type: ignore[assignment]
    dist.all_gather = counted(real_gather, "collective")  # type: ignore[assignment]
    dist.all_reduce = counted(real_reduce, "collective")  # type: ignore[assignment]
    try:
        q, k, v, grad = (shard_sequence(t, 2, rank, size, layout) for t in _inputs())  # type: ignore[arg-type]
        q, k, v = (t.requires_grad_(True) for t in (q, k, v))
        if masked:  # the model's own causal mask: this rank's query rows (in its layout) over every key
            rows = shard_sequence(torch.ones(L, L, dtype=torch.bool).tril(), 0, rank, size, layout)  # type: ignore[arg-type]
            out = ring_attention(q, k, v, None, layout, rows)  # type: ignore[arg-type]
        else:
            fn = ring_attention if variant == "ring" else allgather_kv_attention
            out = fn(q, k, v, None, layout)  # type: ignore[arg-type]
        out.backward(grad)
    finally:
        dist.batch_isend_irecv, dist.all_gather, dist.all_reduce = real_batch, real_gather, real_reduce
    return {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad, "calls": calls}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("variant", "layout", "masked"),
    [
        ("ring", "zigzag", False),
        ("ring", "contiguous", False),
        ("allgather", "zigzag", False),
        ("ring", "zigzag", True),
        ("ring", "contiguous", True),
    ],
)
def test_context_parallel_attention_matches_one_device(variant: str, layout: str, masked: bool) -> None:
    ranks = launch(_rank, 4, variant, layout, masked)
    expected = _reference()
    for name in ("out", "dq", "dk", "dv"):
        whole = unshard_sequence([r[name] for r in ranks], 2, layout)  # type: ignore[arg-type]
        torch.testing.assert_close(whole, expected[name], rtol=1e-12, atol=1e-12)
    for r in ranks:
        if variant == "ring":  # 3 hops forward, 4 backward (the last brings dK, dV home)
            assert r["calls"] == {"p2p": 7, "collective": 0}
        else:  # gather K and V; all-reduce their gradients
            assert r["calls"] == {"p2p": 0, "collective": 4}


def _work(layout: str, size: int, rank: int) -> float:
    """Causal work of one rank over the whole ring, in units of one zigzag chunk pair (a diagonal pair: half);
    a contiguous chunk is two zigzag chunks long."""
    ids = chunk_ids(rank, size, layout)  # type: ignore[arg-type]
    chunk = 2 if layout == "zigzag" else 4
    total = 0.0
    for owner in range(size):
        for _, _, visible in _blocks(ids, chunk_ids(owner, size, layout), chunk, torch.device("cpu"), None):  # type: ignore[arg-type]
            area = (chunk / 2) ** 2  # in zigzag-pair units of 2 x 2
            total += area * (0.5 if visible == "causal" else 1.0)
    return total


@pytest.mark.parametrize("size", [2, 4, 8])
def test_zigzag_gives_every_rank_the_same_causal_work(size: int) -> None:
    zigzag = [_work("zigzag", size, r) for r in range(size)]
    contiguous = [_work("contiguous", size, r) for r in range(size)]
    assert len(set(zigzag)) == 1  # balanced: 2n pairs each (two of them half) = the average
    assert sum(zigzag) == sum(contiguous)  # the same causal triangle in total
    # contiguous: the last rank does (2n - 1) / n times the average, the imbalance problem/context.py prices
    assert max(contiguous) / (sum(contiguous) / size) == pytest.approx((2 * size - 1) / size)


def _strided_rank() -> dict[str, torch.Tensor]:
    """Ring attention on transposed (non-contiguous) q, k, v, as a model without repeat_kv hands them over."""
    rank, size = dist.get_rank(), dist.get_world_size()
    q, k, v, grad = (shard_sequence(t, 2, rank, size, "zigzag") for t in _inputs())
    k, v = (t.repeat_interleave(H // HKV, dim=1) for t in (k, v))  # multi-head: no expand, no reshape copy
    q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2).requires_grad_(True) for t in (q, k, v))
    assert not k.is_contiguous()
    out = ring_attention(q, k, v, None, "zigzag")
    out.backward(grad)
    return {"out": out.detach(), "dk": k.grad}


@pytest.mark.slow
def test_ring_attention_takes_strided_inputs() -> None:
    """Regression: gloo refused the ring's receive buffers (``empty_like`` copied a transposed K's strides)."""
    q, k, v, grad = _inputs()
    k, v = (t.repeat_interleave(H // HKV, dim=1).requires_grad_(True) for t in (k, v))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    out.backward(grad)
    ranks = launch(_strided_rank, 2)
    torch.testing.assert_close(
        unshard_sequence([r["out"] for r in ranks], 2), out.detach(), rtol=1e-12, atol=1e-12
    )
    torch.testing.assert_close(unshard_sequence([r["dk"] for r in ranks], 2), k.grad, rtol=1e-12, atol=1e-12)


R, HEADS = 4, 8  # grouped-query copies: 8 query heads over 2 K/V heads
BLOCKS = 4  # the heads split 4 ways on another mesh axis (TP 4): 2 local heads, half a run of 4 copies


def _gqa_rank() -> dict[str, Any]:
    """Every head block of a TP-4 split in turn, on a ring of 4: the block's K/V copies come from the
    un-expanded K/V as HF's ``repeat_kv`` makes them, the ring sends one head per run of copies and the
    gradients flow back through the copy.  Each hop's bytes are counted where gloo gets them."""
    rank, size = dist.get_rank(), dist.get_world_size()
    comm = MeshComm((size,), (rank,), [dist.group.WORLD], record=True)
    comm.zigzag_axis = 0  # the plan's layout on the ring axis
    sent: list[int] = []
    real_batch = dist.batch_isend_irecv

    def counted(ops):  # type: ignore[no-untyped-def]
        sent.append(sum(op.tensor.numel() * op.tensor.element_size() for op in ops if op.op is dist.isend))
        return real_batch(ops)

    dist.batch_isend_irecv = counted  # type: ignore[assignment]
    g = torch.Generator().manual_seed(3)
    q, k, v, grad = (torch.randn(B, h, L, E, dtype=torch.float64, generator=g) for h in (HEADS, 2, 2, HEADS))
    q, k, v, grad = (shard_sequence(t, 2, rank, size, "zigzag") for t in (q, k, v, grad))
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    outs = []
    try:
        for j in range(BLOCKS):
            heads = slice(j * HEADS // BLOCKS, (j + 1) * HEADS // BLOCKS)
            copies = [
                t[:, :, None].expand(B, 2, R, *t.shape[2:]).reshape(B, HEADS, *t.shape[2:]) for t in (k, v)
            ]
            out = context_sdpa(
                q[:, heads],
                copies[0][:, heads],
                copies[1][:, heads],
                axis=0,
                comm=comm,
                is_causal=True,
                kv_repeats=R,
            )
            out.backward(grad[:, heads])
            outs.append(out.detach())
    finally:
        dist.batch_isend_irecv = real_batch  # type: ignore[assignment]
    return {
        "out": torch.cat(outs, 1),
        "dq": q.grad,
        "dk": k.grad,
        "dv": v.grad,
        "sent": sent,
        "hops": comm.hops,
    }


@pytest.mark.slow
def test_grouped_query_copies_travel_un_expanded_and_match_one_device() -> None:
    g = torch.Generator().manual_seed(3)
    q, k, v, grad = (torch.randn(B, h, L, E, dtype=torch.float64, generator=g) for h in (HEADS, 2, 2, HEADS))
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    out.backward(grad)
    ranks = launch(_gqa_rank, 4)
    for name, want in (("out", out.detach()), ("dq", q.grad), ("dk", k.grad), ("dv", v.grad)):
        whole = unshard_sequence([r[name] for r in ranks], 2)
        torch.testing.assert_close(whole, want, rtol=1e-12, atol=1e-12)
    # 2 local heads of copies in runs of 4: kv_stride 2, one head of K and one of V per hop, not two
    stride = kv_stride(R, HEADS // BLOCKS)
    assert stride == 2
    head = B * (L // 4) * E * 8  # one head of this rank's sequence piece, float64
    for r in ranks:  # per head block: 3 hops forward (K, V), 4 backward (K, V, dK, dV)
        assert r["sent"] == ([2 * head] * 3 + [4 * head] * 4) * BLOCKS
        assert [h.nbytes for h in r["hops"]] == r["sent"]
    # the price reads the same rule: the plan's K/V block of one hop under this split
    kv = TensorMeta((B, HEADS, L, E), "float64", 8)
    spec = ShardingSpec((Shard(2), Shard(1)))  # sequence on the ring axis, heads on the TP axis
    info = NodeInfo(
        "sdpa", "scaled_dot_product_attention", "", "op", "", "", (), (), (), 0, True, None, False
    )
    assert ring_block_bytes(replace(info, kv_repeats=R), (kv, kv), (spec, spec), (4, BLOCKS)) == 2 * head
    assert ring_block_bytes(info, (kv, kv), (spec, spec), (4, BLOCKS)) == 2 * stride * head  # copies: 2x
