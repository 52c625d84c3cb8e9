"""Pipeline schedules priced as pure functions: step time, bubble, microbatches in flight, p2p time.

Input: per-device times of one microbatch (forward ``f``, backward-for-inputs ``b``, backward-for-weights
``w``), the pipeline degree ``p``, virtual stages per device ``v`` and microbatches ``m``.
Output: seconds and counts as plain floats.  No torch: the schedules are named after the
``torch.distributed.pipelining`` classes that run them (:data:`TORCH_CLASS`).

Step time of one pipelined step, device ``d`` taking ``t_d = f_d + b_d + w_d`` per microbatch (all its
chunks), the slowest device ``t* = max_d t_d``:

==================  =====================================================  ====================  =========
schedule            step time                                               in flight on device d  v
==================  =====================================================  ====================  =========
gpipe               Σ_d t_d + (m − 1) t*                                    m                     1
1f1b                Σ_d t_d + (m − 1) t*                                    min(m, p − d)         1
interleaved_1f1b    Σ_d t_d / v + (m − 1/v) t*                              see in_flight         >= 2
zb_v                m t* + (p − 1) max(0, f + b − 2w)* / v                  min(m, p)             2
interleaved_zb      m t* + (p − 1) max(0, f + b − 2w)* / v                  as interleaved_1f1b   >= 2
==================  =====================================================  ====================  =========

With equal devices the first two give the textbook bubble fraction ``(p − 1) / (m + p − 1)`` (GPipe,
Huang et al. 2019; 1F1B, Narayanan et al. 2021, PipeDream-Flush), interleaving divides the bubble time by
``v`` (Narayanan et al. 2021, §2.2.2), and the zero-bubble schedules (Qi et al. 2024, ZB-V) fill the warm-up
and cool-down with the weight-gradient halves ``w``, leaving ``(p − 1)(f + b − 2w)`` per chunk where that
is positive (zero when ``f = b = w``, the paper's premise).  The unequal-stage form of the first row is
Alpa's (Zheng et al. 2022, eq. 2): the first microbatch crosses every stage, the rest are paced by the
slowest.  ``ScheduleDualPipeV`` ships in torch 2.13 too, but it overlaps the forward of one microbatch
with the backward of another (built for expert parallelism); it is not offered until that overlap is
priced.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from enum import Enum

__all__ = [
    "BACKWARD_WEIGHT_SHARE",
    "TORCH_CLASS",
    "Schedule",
    "bubble_fraction",
    "chunk_sends",
    "device_of_chunk",
    "hand_offs",
    "in_flight",
    "p2p_time",
    "step_time",
    "torch_refuses",
    "virtual_stage_options",
]

BACKWARD_WEIGHT_SHARE = 0.5
"""Share of a layer's backward that computes weight gradients (``w``); the rest computes input gradients
(``b``).  For a linear layer both are one GEMM of the forward's size (Qi et al. 2024, §2), so half."""


class Schedule(str, Enum):
    """A pipeline schedule torch.distributed.pipelining runs (values are the plan-file names)."""

    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED_1F1B = "interleaved_1f1b"
    ZB_V = "zb_v"
    INTERLEAVED_ZB = "interleaved_zb"

    @property
    def interleaved(self) -> bool:
        return self in (Schedule.INTERLEAVED_1F1B, Schedule.INTERLEAVED_ZB, Schedule.ZB_V)

    @property
    def zero_bubble(self) -> bool:
        return self in (Schedule.ZB_V, Schedule.INTERLEAVED_ZB)

    @property
    def short(self) -> str:
        """The word the report's headline uses."""
        return {
            "gpipe": "GPipe",
            "1f1b": "1F1B",
            "interleaved_1f1b": "interleaved",
            "zb_v": "ZB-V",
            "interleaved_zb": "interleaved zero-bubble",
        }[self.value]


TORCH_CLASS: dict[Schedule, str] = {
    Schedule.GPIPE: "ScheduleGPipe",
    Schedule.ONE_F_ONE_B: "Schedule1F1B",
    Schedule.INTERLEAVED_1F1B: "ScheduleInterleaved1F1B",
    Schedule.ZB_V: "ScheduleZBVZeroBubble",
    Schedule.INTERLEAVED_ZB: "ScheduleInterleavedZeroBubble",
}
"""The ``torch.distributed.pipelining.schedules`` class that runs each schedule."""


def virtual_stage_options(schedule: Schedule, degree: int, layers: int) -> tuple[int, ...]:
    """The values of ``v`` worth pricing: 1 for plain schedules, 2 for ZB-V, 2..4 chunks per device for the
    interleaved ones (each chunk needs at least one layer)."""
    if not schedule.interleaved:
        return (1,)
    if schedule is Schedule.ZB_V:
        return (2,) if 2 * degree <= layers else ()
    return tuple(v for v in (2, 3, 4) if v * degree <= layers)


def torch_refuses(schedule: Schedule, degree: int, virtual: int, microbatches: int) -> str | None:
    """Why torch 2.13's class for ``schedule`` would refuse this shape (its constructor's checks), or None:
    ``Schedule1F1B`` wants at least as many microbatches as stages; the interleaved ones a microbatch count
    that is a multiple of its rounds (``max(1, m // p)``); ``ScheduleZBVZeroBubble`` exactly 2 chunks a rank."""
    m, p = microbatches, degree
    if schedule is Schedule.ONE_F_ONE_B and m < p:
        return f"1f1b needs at least as many microbatches as stages ({m} < {p})"
    if schedule in (Schedule.INTERLEAVED_1F1B, Schedule.INTERLEAVED_ZB) and m % max(1, m // p):
        return f"{schedule.value} needs microbatches ({m}) to be a multiple of {max(1, m // p)} rounds"
    if schedule is Schedule.ZB_V and virtual != 2:
        return f"zb_v runs exactly 2 chunks per rank, not {virtual}"
    return None


def recompute_refused(schedule: Schedule, recompute: str) -> str | None:
    """Why ``schedule`` cannot run a stage's recomputation as priced, or None.  The zero-bubble schedules
    split backward into an input pass and a weight pass (``stage_backward_input`` walks the autograd graph),
    and torch re-runs a ``torch.utils.checkpoint`` region in each and more (measured: 4 one-layer ZB-V chunks
    with full recomputation re-issued every gather 10 times a microbatch, not once; pytorch/pytorch#136766)."""
    if schedule in (Schedule.ZB_V, Schedule.INTERLEAVED_ZB) and recompute != "none":
        return (
            f"{schedule.value} with {recompute} recomputation refused: torch splits {schedule.value}'s backward "
            "into an input pass and a weight pass and re-runs each checkpointed layer in both "
            "(pytorch/pytorch#136766), not once as priced; plan with schedule 1f1b, interleaved_1f1b or gpipe, "
            "or without recomputation (pinned, or a memory budget that fits every activation)"
        )
    return None


def device_of_chunk(schedule: Schedule, chunk: int, degree: int) -> int:
    """Which device runs model chunk ``chunk``: round robin (interleaved), or a V (ZB-V: down, then up, and so
    on for further laps).  The one map the pricing, ``verify`` and the runtime's stage ranks read."""
    lap, offset = divmod(chunk, degree)
    if schedule is Schedule.ZB_V and lap % 2:
        return degree - 1 - offset
    return offset


def hand_offs(schedule: Schedule, chunks: int, degree: int) -> tuple[bool, ...]:
    """Per cut between chunk ``c`` and ``c + 1``: whether it is a p2p send (one each way per microbatch) --
    False where both chunks run on one device (ZB-V's turn at the last device), which torch hands over
    in memory (``set_local_fwd_input``), no send.  The one rule pricing and ``verify`` both count by."""
    return tuple(
        device_of_chunk(schedule, c, degree) != device_of_chunk(schedule, c + 1, degree)
        for c in range(chunks - 1)
    )


def chunk_sends(schedule: Schedule, chunk: int, chunks: int, degree: int) -> tuple[bool, bool]:
    """Whether chunk ``chunk`` sends its activations to the next chunk and its input gradients to the
    previous one over p2p, per microbatch (:func:`hand_offs`)."""
    cuts = hand_offs(schedule, chunks, degree)
    return (chunk < chunks - 1 and cuts[chunk], chunk > 0 and cuts[chunk - 1])


def in_flight(schedule: Schedule, device: int, degree: int, virtual: int, microbatches: int) -> float:
    """Microbatches whose activations device ``device`` holds at its peak, in units of one microbatch through
    all of the device's chunks (Megatron's interleaved warm-up: ``2 (p − d − 1) + (v − 1) p`` chunks, +1)."""
    p, v, m = degree, virtual, microbatches
    if schedule is Schedule.GPIPE:
        return float(m)
    if schedule is Schedule.ONE_F_ONE_B:
        return float(min(m, p - device))
    if schedule is Schedule.ZB_V:
        return float(min(m, p))
    chunks = min(m * v, 2 * (p - device - 1) + (v - 1) * p + 1)
    return chunks / v


def step_time(
    schedule: Schedule,
    forward: Sequence[float],
    backward: Sequence[float],
    microbatches: int,
    virtual: int = 1,
) -> float:
    """Seconds of the pipelined part of one step, per-device per-microbatch times given (table above).

    ``forward[d]`` and ``backward[d]`` are device ``d``'s times for one microbatch over all its chunks,
    p2p transfers included.
    """
    m, v = microbatches, virtual
    totals = [f + b for f, b in zip(forward, backward, strict=True)]
    slowest = max(totals)
    p = len(totals)
    if schedule.zero_bubble:
        w = [b * BACKWARD_WEIGHT_SHARE for b in backward]
        gap = max(max(0.0, f + (b - wd) - 2 * wd) for f, b, wd in zip(forward, backward, w, strict=True))
        return m * slowest + (p - 1) * gap / v
    return math.fsum(totals) / v + (m - 1.0 / v) * slowest


def bubble_fraction(
    schedule: Schedule,
    forward: Sequence[float],
    backward: Sequence[float],
    microbatches: int,
    virtual: int = 1,
) -> float:
    """Share of the pipelined step the slowest device is idle: ``1 − m t* / step``."""
    total = step_time(schedule, forward, backward, microbatches, virtual)
    busy = microbatches * max(f + b for f, b in zip(forward, backward, strict=True))
    return 0.0 if total <= 0 else max(0.0, 1.0 - busy / total)


def tied_sync_time(nbytes: float, bandwidth: float, latency: float) -> float:
    """Seconds of the all-reduce summing a tied weight's gradient over its two stages' ranks (Megatron-LM's
    embedding group), on the inter-stage link: a ring all-reduce of ``n = 2`` ranks, ``2(n-1)/n · B/bw +
    2(n-1) · latency`` (the ring model of Thakur, Rabenseifner & Gropp 2005, as nccl-tests' bus bandwidth)."""
    if nbytes <= 0:
        return 0.0
    return nbytes / bandwidth + 2 * latency


def p2p_time(nbytes: float, bandwidth: float, latency: float) -> float:
    """Seconds to send ``nbytes`` to the next stage: one message, latency + size / bandwidth."""
    if nbytes <= 0:
        return 0.0
    return latency + nbytes / bandwidth
