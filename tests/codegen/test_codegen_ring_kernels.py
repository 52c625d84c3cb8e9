"""The ring runs torch's fused attention per block: on 4 gloo ranks the profiler sees the CPU flash op (and its
backward) once per ring step -- zigzag chunk pairs folded into one call, as torch's context parallelism makes
them -- and no hand-written softmax, for a causal ring and for an explicit mask that is the causal one; a
sliding-window mask runs its partly visible blocks by the math path and the rest fused.  Output and gradients
(grouped-query K/V) equal one device's attention."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from autoshard.codegen.context import _blocks, chunk_ids, ring_attention, shard_sequence, unshard_sequence
from autoshard.codegen.ring_kernels import block_backward, block_dtype, block_forward, fused_calls, visibility
from autoshard.runtime.launch import launch

B, H, HKV, L, E = 1, 4, 2, 32, 16  # GQA; 32 tokens = 8 zigzag chunks of 4 on 4 ranks
WINDOW = 6  # the sliding-window mask: key j visible from query i when i - WINDOW < j <= i
FLASH = "aten::_scaled_dot_product_flash_attention_for_cpu"
FLASH_BACKWARD = "aten::_scaled_dot_product_flash_attention_for_cpu_backward"
MATH = "aten::logsumexp"  # the math path's softmax normaliser (the merge uses logaddexp)


def _inputs() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(1)
    shapes = ((B, H, L, E), (B, HKV, L, E), (B, HKV, L, E), (B, H, L, E))
    return tuple(torch.randn(s, generator=g) for s in shapes)


def _mask(kind: str) -> torch.Tensor | None:
    i, j = torch.arange(L)[:, None], torch.arange(L)[None, :]
    if kind == "causal":
        return None
    return (j <= i) & (i - j < WINDOW) if kind == "window" else j <= i


def _reference(kind: str) -> dict[str, Any]:
    q, k, v, grad = (t.double().requires_grad_(n < 3) for n, t in enumerate(_inputs()))
    mask = _mask(kind)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None, enable_gqa=True)
    out.backward(grad.double())
    return {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}


def _rank(kind: str) -> dict[str, Any]:
    rank, size = dist.get_rank(), dist.get_world_size()
    q, k, v, grad = (shard_sequence(t, 2, rank, size) for t in _inputs())
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    mask = _mask(kind)
    rows = None if mask is None else shard_sequence(mask, 0, rank, size)
    hops: list[str] = []
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        out = ring_attention(q, k, v, None, "zigzag", rows, hops=lambda phase, *_: hops.append(phase))
        out.backward(grad)
    calls = {name: 0 for name in (FLASH, FLASH_BACKWARD, MATH)}
    for event in prof.events():
        if event.name in calls:
            calls[event.name] += 1
    return {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad, "calls": calls, "hops": hops}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["causal", "tril", "window"])
def test_ring_runs_fused_attention_per_step_and_matches_one_device(kind: str) -> None:
    ranks = launch(_rank, 4, kind)
    expected = _reference(kind)
    for name in ("out", "dq", "dk", "dv"):
        whole = unshard_sequence([r[name] for r in ranks], 2)
        torch.testing.assert_close(whole.double(), expected[name], rtol=1e-5, atol=1e-5)
    for r in ranks:
        assert r["hops"] == ["forward"] * 3 + ["backward"] * 4  # the ring really rotated K/V
        calls = r["calls"]
        if kind == "window":  # partly visible blocks by math, the rest fused
            assert calls[MATH] > 0 and calls[FLASH] > 0 and calls[FLASH_BACKWARD] == calls[FLASH]
        else:  # one fused call per ring step, forward and backward; no hand-written softmax
            assert calls == {FLASH: 4, FLASH_BACKWARD: 4, MATH: 0}


@pytest.mark.parametrize("size", [2, 4, 8])
def test_zigzag_ring_step_is_one_fused_call(size: int) -> None:
    """Every step of a causal zigzag ring is one rectangle (all visible) or, at home, one causal square."""
    cpu = torch.device("cpu")
    for rank in range(size):
        ids = chunk_ids(rank, size, "zigzag")
        for owner in range(size):
            blocks = _blocks(ids, chunk_ids(owner, size, "zigzag"), 4, cpu, None)
            [(qs, ks, kind)] = fused_calls(blocks, 4)
            assert kind == ("causal" if owner == rank else "all")
            area = (qs.stop - qs.start) * (ks.stop - ks.start) * (0.5 if kind == "causal" else 1.0)
            assert area == sum(16 * (0.5 if v == "causal" else 1.0) for _, _, v in blocks)  # the same work


def test_visibility_names_whole_and_triangular_blocks() -> None:
    tri = torch.ones(4, 4, dtype=torch.bool).tril()
    assert visibility(torch.ones(2, 4, 4, dtype=torch.bool)) == "all"
    assert visibility(tri.expand(3, 4, 4)) == "causal"
    band = tri & ~torch.ones(4, 4, dtype=torch.bool).tril(-2)
    assert torch.equal(visibility(band), band)  # type: ignore[arg-type]


def test_cuda_flash_branch_calls_the_ops_by_their_schemas() -> None:
    """No GPU here: on meta tensors (torch's shape functions) the CUDA branch's calls parse against the flash
    ops' schemas and unpack their outputs -- (B, H, L, E) out in bfloat16, float32 lse, gradients per input."""
    q = torch.empty(1, 4, 8, 16, dtype=torch.bfloat16, device="meta")
    k = v = torch.empty(1, 4, 12, 16, dtype=torch.bfloat16, device="meta")
    out, lse = block_forward("cuda", q, k, v, "all", 0.25)
    assert (out.shape, out.dtype, lse.shape, lse.dtype) == (q.shape, q.dtype, (1, 4, 8), torch.float32)
    grads = block_backward("cuda", out, q, k, v, out, lse, lse, "causal", 0.25)
    assert [(g.shape, g.dtype) for g in grads] == [(t.shape, torch.bfloat16) for t in (q, k, v)]
    assert block_dtype("cuda", "all", torch.bfloat16) == torch.bfloat16  # tensor cores: blocks stay 16-bit
    assert block_dtype("cpu", "all", torch.bfloat16) == torch.float32
    assert block_dtype("cuda", q, torch.bfloat16) == torch.float32  # a partial mask: math in float32


def test_a_gpu_ring_leaving_the_fused_path_says_so_once() -> None:
    """The plan priced fused attention: a ring on an accelerator that falls to the math path warns (once per
    reason); the CPU, where verify and tests run rings, stays quiet."""
    import types
    import warnings

    from autoshard.codegen import ring_kernels

    gpu = types.SimpleNamespace(device=torch.device("cuda"))
    ring_kernels._SAID.clear()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        ring_kernels._slow(gpu, "float32 has no fused op")  # type: ignore[arg-type]
        ring_kernels._slow(gpu, "float32 has no fused op")  # type: ignore[arg-type]
        cpu = torch.zeros(1, 2, 4, 8)
        assert ring_kernels.kernel(cpu, cpu, cpu) == "cpu"
    assert [str(w.message).split(" (")[0] for w in seen] == [
        "autoshard ring attention runs explicit math, not a fused kernel"
    ]
    ring_kernels._SAID.clear()
