"""Non-causal ring attention without a mask (an encoder's attention under context parallelism) on 2 and 4 real
gloo ranks: it matches one device's attention forward and backward, the ring really hops, and no boolean mask
of (local queries x global keys) is built -- the ring op is told "every key" by its ``causal`` argument."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from autoshard.codegen.collectives import MeshComm
from autoshard.codegen.context import _blocks, chunk_ids, context_sdpa, shard_sequence, unshard_sequence
from autoshard.runtime.launch import launch

B, H, HKV, L, E = 1, 4, 2, 16, 8  # GQA: 2 query heads per kv head


def _inputs(ev: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(1)
    shapes = ((B, H, L, E), (B, HKV, L, E), (B, HKV, L, ev), (B, H, L, ev))
    return tuple(torch.randn(s, dtype=torch.float64, generator=g) for s in shapes)


class _Seen(TorchDispatchMode):
    """The ring op's arguments, and the largest boolean tensor any op outside it makes."""

    def __init__(self) -> None:
        super().__init__()
        self.ring: list[tuple[Any, ...]] = []
        self.largest_bool = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.autoshard.ring_attention.default:
            self.ring.append(args)
        result = func(*args, **(kwargs or {}))
        for t in result if isinstance(result, tuple | list) else (result,):
            if isinstance(t, torch.Tensor) and t.dtype == torch.bool:
                self.largest_bool = max(self.largest_bool, t.numel())
        return result


def _rank(layout: str, ev: int) -> dict[str, Any]:
    rank, size = dist.get_rank(), dist.get_world_size()
    comm = MeshComm((size,), (rank,), [dist.group.WORLD], record=True)
    comm.zigzag_axis = 0 if layout == "zigzag" else None
    hops = {"p2p": 0}
    real = dist.batch_isend_irecv

    def counted(ops):
        hops["p2p"] += 1
        return real(ops)

    q, k, v, grad = (shard_sequence(t, 2, rank, size, layout) for t in _inputs(ev))  # type: ignore[arg-type]
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    dist.batch_isend_irecv = counted
    try:
        with _Seen() as seen:
            k2, v2 = (t.repeat_interleave(H // HKV, dim=1) for t in (k, v))  # HF's repeat_kv copies
            out = context_sdpa(q, k2, v2, None, axis=0, comm=comm, kv_repeats=H // HKV)
            out.backward(grad)
    finally:
        dist.batch_isend_irecv = real
    (args,) = seen.ring
    return {
        "out": out.detach(),
        "dq": q.grad,
        "dk": k.grad,
        "dv": v.grad,
        "mask": args[3],
        "causal": args[7],
        "largest_bool": seen.largest_bool,
        "p2p": hops["p2p"],
        "hops": [(h.phase, h.mesh_axis, h.nbytes) for h in comm.hops or []],
    }


@pytest.mark.slow
@pytest.mark.parametrize(
    ("ranks", "layout", "ev"),
    [(2, "contiguous", E), (4, "zigzag", E), (2, "zigzag", E + 4)],  # ev != e: the math path, not fused
)
def test_non_causal_ring_without_mask_matches_one_device(ranks: int, layout: str, ev: int) -> None:
    q, k, v, grad = (t.clone().requires_grad_(i < 3) for i, t in enumerate(_inputs(ev)))
    want = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    want.backward(grad)
    results = launch(_rank, ranks, layout, ev)
    for name, expected in (("out", want.detach()), ("dq", q.grad), ("dk", k.grad), ("dv", v.grad)):
        whole = unshard_sequence([r[name] for r in results], 2, layout)  # type: ignore[arg-type]
        torch.testing.assert_close(whole, expected, rtol=1e-12, atol=1e-12)
    for r in results:
        assert r["mask"] is None and r["causal"] is False  # the op is told "every key", not handed a mask
        assert r["largest_bool"] < (L // ranks) * L  # no (local queries x global keys) mask anywhere
        # the ring ran: n - 1 hops forward, n backward (the last brings dK, dV home), logged and sent, with
        # one head per run of grouped-query copies (K and V; backward also dK and dV)
        kv = B * HKV * (L // ranks) * (E + ev) * 8
        assert r["hops"] == [("forward", 0, kv)] * (ranks - 1) + [("backward", 0, 2 * kv)] * ranks
        assert r["p2p"] == 2 * ranks - 1


@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
def test_every_block_is_whole_without_mask_or_causality(layout: str) -> None:
    size = 4
    for rank in range(size):
        ids = chunk_ids(rank, size, layout)  # type: ignore[arg-type]
        for owner in range(size):
            held = chunk_ids(owner, size, layout)  # type: ignore[arg-type]
            blocks = _blocks(ids, held, 2, torch.device("cpu"), None, causal=False)
            assert [vis for _, _, vis in blocks] == ["all"] * (len(ids) * len(held))
