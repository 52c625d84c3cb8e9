"""CPU seconds of two fixed workloads, so planning times measured in different sessions can be compared.

Run: ``OMP_NUM_THREADS=1 python -m benchmarks.machine_speed``.

The dev VM is "2 cores, AMD EPYC" every session, but not the same speed: on 2026-11-25 the same commit planned
LLaMA-3-70B on 16 x 8 x 8 in 8.6-8.8 CPU s where the session before measured 2.89 s.  A timing in
``benchmarks/results`` means little without the speed of the machine it came from, so figures recorded from now
on carry these two numbers beside them:

- ``python``: a pure-Python integer loop (the planner's graph walks, dict and dataclass work are of this kind);
- ``numpy``: the min-plus reduction of :mod:`autoshard.search.minplus`'s shape (broadcast add, then min over one
  axis), on float64 tables of the sizes the exact solver meets.

Each is the least CPU time (``time.process_time``) of five runs, which a second process on the other core
barely moves.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

__all__ = ["speed"]


def _python() -> None:
    total = 0
    for i in range(3_000_000):
        total += i & 7


def _numpy() -> None:
    rng = np.random.default_rng(0)
    left = rng.random((64, 1, 96))
    right = rng.random((1, 128, 96))
    for _ in range(40):
        (left + right).min(axis=2)


def _least(work: Callable[[], None], runs: int = 5) -> float:
    best = float("inf")
    for _ in range(runs):
        start = time.process_time()
        work()
        best = min(best, time.process_time() - start)
    return best


def speed() -> dict[str, float]:
    """CPU seconds of the two reference workloads (least of five runs each)."""
    return {"python_s": round(_least(_python), 4), "numpy_s": round(_least(_numpy), 4)}


if __name__ == "__main__":
    print(" ".join(f"{k}={v}" for k, v in speed().items()))
