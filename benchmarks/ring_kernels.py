"""CPU milliseconds per ring step of :func:`autoshard.codegen.context.ring_attention`'s block compute: the old
hand-written math against torch's fused attention (:mod:`autoshard.codegen.ring_kernels`).

Run: ``OMP_NUM_THREADS=1 python -m benchmarks.ring_kernels [--ranks 4] [--seq 4096] [--repeats 3]``

One zigzag rank (rank 1 of ``--ranks``) of a causal sequence of ``--seq`` tokens, 8 query heads over 2 K/V
heads (GQA), head dim 64, batch 1.  Each ring step's blocks (the held K/V's chunk pairs) run forward, merge by
log-sum-exp, then backward given the global out and lse -- no communication, only what a step computes.
Variants, per input dtype:

- ``math``: chunk pairs, scores materialised, softmax by hand, in float32 (what the ring ran before);
- ``fused``: the CPU flash op, one call per step (pairs folded), as the ring runs it: on the CPU 16-bit inputs
  compute in float32 (``ring_kernels.block_dtype``);
- ``fused-16``: (16-bit inputs only) the same op on the 16-bit tensors, as CUDA's flash runs it.

Printed: CPU ms per step (``time.process_time``, best of ``--repeats``, mean over the ``--ranks`` steps) and
wall ms; the home step (causal) and the others (whole blocks) averaged together.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import torch

from autoshard.codegen.context import _blocks, _expand_kv, _fold_kv, chunk_ids
from autoshard.codegen.ring_kernels import Kernel, block_backward, block_forward, fused_calls, merge

HEADS, KV_HEADS, DIM = 8, 2, 64


def _step(
    fused: Kernel | None, dtype: torch.dtype, tensors: tuple[torch.Tensor, ...], blocks: list, scale: float
) -> None:
    """Forward (merge), then backward of one step's blocks, in ``dtype``."""
    q, k, v, grad = (t.to(dtype) for t in tensors)
    ke, ve = _expand_kv(k, HEADS), _expand_kv(v, HEADS)
    lse = torch.full(q.shape[:3], -math.inf)
    out = torch.zeros(q.shape)
    for qs, ks, visible in blocks:
        merge(out, lse, qs, *block_forward(fused, q[:, :, qs], ke[:, :, ks], ve[:, :, ks], visible, scale))
    o = out.to(dtype)
    delta = (grad.float() * out).sum(-1, keepdim=True)  # read by math blocks (float32)
    dk = torch.zeros(k.shape)
    for qs, ks, visible in blocks:
        rows = (grad[:, :, qs], q[:, :, qs], ke[:, :, ks], ve[:, :, ks], o[:, :, qs])
        _, dk_b, _ = block_backward(fused, *rows, lse[:, :, qs], delta[:, :, qs], visible, scale)
        dk[:, :, ks] += _fold_kv(dk_b.float(), KV_HEADS)


def measure(ranks: int, seq: int, dtype: torch.dtype, variant: str, repeats: int) -> tuple[float, float]:
    """(CPU ms, wall ms) per ring step, mean over one rank's steps, best of ``repeats``."""
    g = torch.Generator().manual_seed(0)
    local = seq // ranks
    shapes = (
        (1, HEADS, local, DIM),
        (1, KV_HEADS, local, DIM),
        (1, KV_HEADS, local, DIM),
        (1, HEADS, local, DIM),
    )
    tensors = tuple(torch.randn(s, generator=g).to(dtype) for s in shapes)
    rank, chunk = 1, local // 2
    fused: Kernel | None = None if variant == "math" else "cpu"
    compute = dtype if variant == "fused-16" else torch.float32
    steps = []
    for owner in range(ranks):
        blocks = _blocks(
            chunk_ids(rank, ranks, "zigzag"),
            chunk_ids(owner, ranks, "zigzag"),
            chunk,
            torch.device("cpu"),
            None,
        )
        steps.append(blocks if fused is None else fused_calls(blocks, chunk))
    best = (math.inf, math.inf)
    for _ in range(repeats):
        cpu, wall = time.process_time(), time.perf_counter()
        for blocks in steps:
            _step(fused, compute, tensors, blocks, 1 / math.sqrt(DIM))
        took = (time.process_time() - cpu, time.perf_counter() - wall)
        best = min(best, (1e3 * took[0] / ranks, 1e3 * took[1] / ranks))
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    print(f"ring step, rank 1 of {args.ranks} (zigzag), seq {args.seq}, {HEADS}/{KV_HEADS} heads, dim {DIM}")
    print(f"{'dtype':<10} {'variant':<9} {'CPU ms/step':>12} {'wall ms/step':>13} {'vs math (CPU)':>14}")
    for dtype in (torch.float32, torch.bfloat16):
        variants = ("math", "fused") + (("fused-16",) if dtype != torch.float32 else ())
        base = None
        for variant in variants:
            cpu, wall = measure(args.ranks, args.seq, dtype, variant, args.repeats)
            base = base or cpu
            name = str(dtype).removeprefix("torch.")
            print(f"{name:<10} {variant:<9} {cpu:>12.1f} {wall:>13.1f} {base / cpu:>13.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
