"""Collective time against message size: a published all-reduce sweep, and the alpha-beta fit to it.

Source (:data:`SWEEP_8XH200`): stas00/ml-engineering, ``network/benchmarks/results/all-reduce-8xH200.md``
(commit c53741b): ``all_reduce_bench.py`` (torch.distributed over NCCL 2.27.7, torch 2.9.1, CUDA 13.0) on one
node of 8 x H200 SXM, NVSwitch, NVLink 4 (all pairs NV18), 2026-08-04; 5 warm-up and 20 timed trials per
payload, each trial up to 10 back-to-back calls behind a busy device so the host's per-call overhead is hidden
(device time, as a training step that runs ahead sees it).  Payload S from 32 KiB to 16 GiB; the page gives
busbw and algbw in GB/s (10^9); NCCL ran Ring/LL up to 1 MiB and NVLS/Simple from 2 MiB.  The H200's NVLink
is the H100's (NVLink 4, 18 links), so the sweep is the h100x8 profile's in-node all-reduce.

The fit (:func:`fit_latency`): the model's in-node all-reduce is ``t(S) = 2(n-1) alpha + launch + f S / busbw``
(:mod:`cost_models.collectives`, f = 2(n-1)/n); with busbw fixed at the profile's sourced 480 GB/s (NCCL
tests' large-message figure, which this sweep's 16 GiB point, 482, confirms) the one free number, the
latency ``alpha`` per ring step, minimises the mean |relative time error| over the sweep.  h100x8.json
holds the result (``intra_node.step_latency``).  Before the fit the profile took NCCL's tuning-model latency
(0.75 us a step: 16.5 us for the 8-rank call) and under-priced every call below 64 MiB by 23-58%.

The single line cannot follow NCCL's switch from Ring/LL to NVLS/Simple between 1 and 64 MiB: there the
measured time rises faster than one latency plus one bandwidth allow, and the fitted line is up to ~26% fast;
below 1 MiB and above 128 MiB it is within 10% (:func:`curve_table` prints every point).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from benchmarks.report import Table, percent
from cost_models.profile import load_profile

__all__ = ["SWEEP_8XH200", "SWEEP_SOURCE", "curve_table", "fit_latency", "model_seconds", "sweep_seconds"]

SWEEP_SOURCE = (
    "stas00/ml-engineering network/benchmarks/results/all-reduce-8xH200.md (commit c53741b), all_reduce_bench.py, "
    "NCCL 2.27.7, 8 x H200 SXM NVSwitch, 2026-08-04"
)
_KiB, _MiB, _GiB = 2**10, 2**20, 2**30
#: (payload bytes, published busbw GB/s) of an 8-rank in-node all-reduce, from SWEEP_SOURCE
SWEEP_8XH200: tuple[tuple[int, float], ...] = (
    (32 * _KiB, 1.44), (64 * _KiB, 2.93), (128 * _KiB, 5.73), (256 * _KiB, 11.74), (512 * _KiB, 23.94),
    (1 * _MiB, 39.93), (2 * _MiB, 64.53), (4 * _MiB, 107.16), (8 * _MiB, 155.53), (16 * _MiB, 219.89),
    (32 * _MiB, 275.84), (64 * _MiB, 346.51), (128 * _MiB, 401.93), (256 * _MiB, 436.15),
    (512 * _MiB, 450.29), (1 * _GiB, 463.58), (2 * _GiB, 469.17), (4 * _GiB, 473.10), (8 * _GiB, 477.45),
    (16 * _GiB, 482.26),
)  # fmt: skip
RANKS = 8


def sweep_seconds(nbytes: int, busbw_gbs: float, ranks: int = RANKS) -> float:
    """The published time of one call: ``f S / busbw`` (nccl-tests' busbw definition inverted)."""
    return 2 * (ranks - 1) / ranks * nbytes / (busbw_gbs * 1e9)


def model_seconds(nbytes: int, profile: Any = "h100x8") -> float:
    """The cost model's time of the same call on ``profile``'s node."""
    from cost_models.collectives import CollectiveGroup, collective_time

    p = load_profile(profile) if isinstance(profile, str) else profile
    return collective_time("all_reduce", nbytes, CollectiveGroup(RANKS), p)


def fit_latency(busbw: float = 480e9, launch: float = 6e-6) -> tuple[float, float, float]:
    """The per-step latency (seconds) minimising the mean |relative error| of ``2(n-1) alpha + launch + f S /
    busbw`` over the sweep (grid of 0.01 us); returns (alpha, mean |error|, max |error|)."""
    f, steps = 2 * (RANKS - 1) / RANKS, 2 * (RANKS - 1)
    measured = [(s, sweep_seconds(s, b)) for s, b in SWEEP_8XH200]

    def errors(alpha: float) -> list[float]:
        return [abs((steps * alpha + launch + f * s / busbw) / t - 1) for s, t in measured]

    best = min((sum(errors(a / 1e8)) / len(measured), a / 1e8) for a in range(1, 1001))
    worst = max(errors(best[1]))
    return best[1], best[0], worst


def curve_table() -> Table:
    rows: list[tuple[Any, ...]] = []
    errors: list[float] = []
    for nbytes, busbw in SWEEP_8XH200:
        measured = sweep_seconds(nbytes, busbw)
        predicted = model_seconds(nbytes)
        error = predicted / measured - 1
        errors.append(abs(error))
        rows.append(
            (f"{nbytes / _MiB:g}", busbw, measured * 1e6, predicted * 1e6, percent(error, signed=True))
        )
    alpha, mean, worst = fit_latency()
    h100 = load_profile("h100x8")
    tuning = dataclasses.replace(h100, intra_node=dataclasses.replace(h100.intra_node, step_latency=0.75e-6))
    before = [model_seconds(s, tuning) / sweep_seconds(s, b) - 1 for s, b in SWEEP_8XH200]
    notes = (
        f"8-rank in-node all-reduce, h100x8 profile against {SWEEP_SOURCE}.  Mean |error| "
        f"{percent(sum(errors) / len(errors))}, max {percent(max(errors))}.",
        f"Fitted: intra_node.step_latency {alpha * 1e6:.2f} us a ring step (busbw fixed at the profile's 480 GB/s, "
        f"launch 6 us): mean |error| {percent(mean)}, max {percent(worst)}.  Before the fit (0.75 us a step, "
        f"NCCL's tuning model): mean |error| {percent(sum(map(abs, before)) / len(before))}, from "
        f"{percent(min(before), signed=True)} (small messages) to {percent(max(before), signed=True)}.",
        "The one-line model cannot follow NCCL's switch from Ring/LL to NVLS/Simple between 1 and 64 MiB, where "
        "it stays fast; the A100 and V100 profiles keep NCCL's tuning-model latency (no sourced sweep found).",
    )
    columns = ("MiB", "published busbw GB/s", "published us", "model us", "error")
    return Table(
        "fidelity_nccl_curve", "All-reduce time by message size: 8 x H200 sweep", columns, rows, notes
    )
