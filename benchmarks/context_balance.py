"""Causal ring attention per rank, contiguous against zigzag sequence layout (issue 17): is the work balanced?

Run: ``OMP_NUM_THREADS=1 python -m benchmarks.context_balance [--ranks 4] [--seq 4096] [--repeats 3]``

Each of ``--ranks`` gloo ranks runs :func:`autoshard.codegen.context.ring_attention` forward and backward on its
piece of one causal sequence (GQA: 8 query heads over 2 kv heads, head dim 64, float32) in both layouts.  Printed
per layout: the attention FLOPs each rank computes (counted from the chunk pairs the kernel visits: exact), and
the CPU seconds each rank spent (``time.process_time``, best of ``--repeats``; the ranks share this machine's
cores, so compare ratios, not seconds).  The step waits for the slowest rank: max / mean is the imbalance.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import torch
import torch.distributed as dist

from autoshard.codegen.context import _blocks, chunk_ids, ring_attention, shard_sequence
from autoshard.runtime.launch import launch

HEADS, KV_HEADS, DIM = 8, 2, 64


def _flops(layout: str, size: int, rank: int, seq: int) -> float:
    """Forward attention FLOPs (QK^T and PV, 4 per multiply-add pair) of one rank over the whole ring."""
    ids = chunk_ids(rank, size, layout)  # type: ignore[arg-type]
    chunk = seq // (2 * size if layout == "zigzag" else size)
    total = 0.0
    for owner in range(size):
        for _, _, visible in _blocks(ids, chunk_ids(owner, size, layout), chunk, torch.device("cpu"), None):  # type: ignore[arg-type]
            total += 4.0 * HEADS * chunk * chunk * DIM * (0.5 if visible == "causal" else 1.0)
    return total


def _rank(seq: int, repeats: int) -> dict[str, Any]:
    rank, size = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(0)
    whole = [torch.randn(1, h, seq, DIM, generator=g) for h in (HEADS, KV_HEADS, KV_HEADS, HEADS)]
    result: dict[str, Any] = {}
    for layout in ("contiguous", "zigzag"):
        best = float("inf")
        for _ in range(repeats):
            q, k, v, grad = (shard_sequence(t, 2, rank, size, layout) for t in whole)  # type: ignore[arg-type]
            q, k, v = (t.requires_grad_(True) for t in (q, k, v))
            dist.barrier()
            c0 = time.process_time()
            ring_attention(q, k, v, None, layout).backward(grad)  # type: ignore[arg-type]
            best = min(best, time.process_time() - c0)
        result[layout] = best
    return result


def run(ranks: int = 4, seq: int = 4096, repeats: int = 3, log: Any = print) -> dict[str, Any]:
    times = launch(_rank, ranks, seq, repeats, timeout=900.0)
    out: dict[str, Any] = {}
    for layout in ("contiguous", "zigzag"):
        flops = [_flops(layout, ranks, r, seq) for r in range(ranks)]
        cpu = [t[layout] for t in times]
        out[layout] = {"flops": flops, "cpu_s": cpu}
        log(
            f"{layout:>10}: forward GFLOP per rank {[round(f / 1e9, 2) for f in flops]} "
            f"(max/mean {max(flops) / (sum(flops) / ranks):.3f}); fwd+bwd CPU s per rank "
            f"{[round(c, 3) for c in cpu]} (max/mean {max(cpu) / (sum(cpu) / ranks):.3f})"
        )
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=3)
    a = parser.parse_args()
    log = print
    log(f"ring attention, causal, GQA {HEADS}/{KV_HEADS} heads x {DIM}, seq {a.seq}, {a.ranks} gloo ranks")
    run(a.ranks, a.seq, a.repeats, log)
    sys.exit(0)
