"""Roofline time of one op on one device.

Input: the op's FLOPs and the bytes it moves through device memory (inputs read once, outputs written once),
its dtype, and a :class:`~cost_models.profile.HardwareProfile`.
Output: seconds.

    t = max(launch_floor, t_flops, t_mem)
    t_flops = F / (peak(dtype) · η(F)),  η(F) = η_max · F / (F + F½),  F½ = τ · peak(dtype) · η_max
            = F / (peak(dtype) · η_max) + τ                                       (0 when F = 0)
    t_mem   = bytes / (HBM bandwidth · η_mem)

The saturating η(F) makes small matrix products reach a small fraction of peak.  Its half point is given as a
time τ (``compute.efficiency_half_time``) rather than a FLOP count: measured on an H100, the extra time of a
small GEMM over its ideal time is a few µs in bf16, tf32 and fp32 alike, whereas one F½ in FLOPs would
charge a float32 op 15× the ramp of a bf16 one.  Bundled profiles keep τ at or below the launch floor, so a
small elementwise op (which has FLOPs but is memory-bound) is priced by the floor, not by the ramp.

The launch floor enters through ``max``, not ``+``: in eager mode the host issues kernels ahead of the device,
so a stream of tiny ops runs at the host's issue rate (measured 6.3 µs per op on an H100 host) while a large
op hides the host's cost entirely.  Adding the floor would overcharge every mid-sized op by up to 2×.

Shape matters beyond F for matrix products and attention (:func:`matmul_time`, :func:`attention_time`):

* **tile and wave quantisation** (NVIDIA's *Matrix Multiplication Background* guide): a GEMM's M × N output
  is cut into T × T tiles (``compute.gemm_tile``), one per multiprocessor at a time (``compute.multiprocessors``
  of them), so the device does ``ceil(M/T)·ceil(N/T)`` tiles in whole waves (split-K when they are fewer
  than the multiprocessors).  The useful fraction ``gemm_efficiency`` = useful work / the waves' tile slots
  multiplies η_max: ≈ 1 for large products, lower when a ragged edge wastes part of a tile or the last wave
  leaves multiprocessors idle;
* small K is memory-bound through the roofline's byte term (intensity ≈ K FLOP/byte when M, N ≫ K);
* a fused attention kernel (FlashAttention, behind torch's SDPA) runs at ``compute.attention_efficiency`` of
  peak rather than η_max, its FLOPs cut to the causal triangle when causal (the kernel skips hidden blocks:
  :func:`causal_share`);
* memory-bound ops (norms, activations, elementwise) stream at the achieved HBM bandwidth (the byte term).

Integer and bool dtypes are priced at the float32 peak (see :meth:`ComputeSpec.peak`); pure data movement
(F = 0) needs no peak at all.

Example::

    >>> from cost_models.profile import load_profile
    >>> p = load_profile("h100x8")
    >>> bound(2 * 4096**3, 3 * 2 * 4096**2, "bfloat16", p), bound(1e8, 6e8, "bfloat16", p)
    ('compute', 'memory')
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from cost_models.memory import itemsize
from cost_models.profile import HardwareProfile

__all__ = [
    "ALIGN1_BYTES",
    "Bound",
    "aligned",
    "attention_time",
    "bound",
    "causal_share",
    "compute_time",
    "compute_times",
    "gemm_efficiency",
    "matmul_time",
    "ridge_intensity",
    "row_alignment",
]

Bound = Literal["compute", "memory", "launch"]


def compute_time(flops: float, bytes_moved: float, dtype: object, profile: HardwareProfile) -> float:
    """Seconds one device spends on an op of ``flops`` FLOPs moving ``bytes_moved`` bytes (see module doc)."""
    t_flops, t_mem = _terms(float(flops), float(bytes_moved), dtype, profile)
    return max(profile.compute.launch_floor, t_flops, t_mem)


def compute_times(
    flops: ArrayLike, bytes_moved: ArrayLike, dtype: object, profile: HardwareProfile
) -> NDArray[np.float64]:
    """Vectorised :func:`compute_time` over arrays (broadcast together) of FLOPs and bytes, one dtype."""
    f = np.asarray(flops, dtype=np.float64)
    b = np.asarray(bytes_moved, dtype=np.float64)
    if np.any(f < 0) or np.any(b < 0):
        raise ValueError("compute_times needs flops >= 0 and bytes_moved >= 0")
    c = profile.compute
    t_flops = np.zeros_like(f)
    if np.any(f > 0):
        rate = c.peak(dtype, profile.name) * c.efficiency_max
        t_flops = np.where(f > 0, f / rate + c.efficiency_half_time, 0.0)
    t_mem = b / (profile.memory.bandwidth * profile.memory.efficiency)
    return np.maximum(np.maximum(t_flops, t_mem), c.launch_floor)


def bound(flops: float, bytes_moved: float, dtype: object, profile: HardwareProfile) -> Bound:
    """Which term of the roofline sets the op's time: ``"compute"``, ``"memory"`` or ``"launch"``."""
    t_flops, t_mem = _terms(float(flops), float(bytes_moved), dtype, profile)
    if profile.compute.launch_floor >= max(t_flops, t_mem):
        return "launch"
    return "compute" if t_flops >= t_mem else "memory"


def ridge_intensity(dtype: object, profile: HardwareProfile) -> float:
    """FLOPs per byte above which a large op is compute-bound: (peak · η_max) / (bandwidth · η_mem)."""
    c, m = profile.compute, profile.memory
    return c.peak(dtype, profile.name) * c.efficiency_max / (m.bandwidth * m.efficiency)


def _terms(flops: float, bytes_moved: float, dtype: object, profile: HardwareProfile) -> tuple[float, float]:
    if flops < 0 or bytes_moved < 0:
        raise ValueError(f"compute_time needs flops >= 0 and bytes_moved >= 0, got {flops}, {bytes_moved}")
    c = profile.compute
    t_flops = 0.0
    if flops > 0:
        t_flops = flops / (c.peak(dtype, profile.name) * c.efficiency_max) + c.efficiency_half_time
    return t_flops, bytes_moved / (profile.memory.bandwidth * profile.memory.efficiency)


def gemm_efficiency(
    m: float, n: float, profile: HardwareProfile, batch: int = 1, k: float = 0, itemsize: int = 0
) -> float:
    """Useful fraction of the multiprocessors' tile slots for an M × N output (``batch`` of them): (0, 1],
    times ``compute.unaligned_gemm_efficiency`` when a row of K or N elements of ``itemsize`` bytes is not a
    multiple of 16 bytes (:func:`aligned`; an ``itemsize`` of 0 skips the check).

    Each output dim d is cut into tiles of edge ``T = compute.gemm_tile`` or T/2 (the library holds kernels of
    several tile shapes; the best of the four is taken), or, when d is shorter, of the power of two
    that holds it (the library picks a narrower kernel for a skinny product): a ragged edge wastes part of a
    tile.  When the tiles are fewer than the multiprocessors and K is long, the library splits K (split-K)
    into up to ``ceil(K / T)`` parts to fill them.  The units run in whole waves of ``SMs``; the efficiency is
    useful work over the slots those waves hold (module docstring).  1 for a profile without a tile, and for
    a product of less than one wave: a small kernel's cost is the ramp τ (fitted on measured small GEMMs)
    and the launch floor, and the library would pick a narrower tile than we can model.
    """
    if m <= 0 or n <= 0 or batch < 1:
        raise ValueError(f"gemm_efficiency needs m, n > 0 and batch >= 1, got {m}, {n}, {batch}")
    c = profile.compute
    tile, sms = c.gemm_tile, c.multiprocessors
    best = 0.0
    for tm in (tile, tile // 2 or 1):  # the library holds kernels of several tile shapes and picks the best
        for tn in (tile, tile // 2 or 1):
            best = max(best, _tiled(m, n, k, batch, tm, tn, sms))
    if c.unaligned_gemm_efficiency is not None and itemsize and not aligned(n, k, itemsize):
        return best * min(1.0, c.unaligned_gemm_efficiency * row_alignment(n, k, itemsize) / ALIGN1_BYTES)
    return best


ALIGN1_BYTES = 2
"""Row alignment (bytes) at which ``compute.unaligned_gemm_efficiency`` was measured: an odd count of 16-bit
elements (N = 50257, 4097, K = 4097: cuBLAS's ``align1`` kernels).  A row aligned to ``a`` bytes loads
``a / 2`` elements per vector, so the rate scales by ``a / ALIGN1_BYTES`` up to the aligned rate: N = 30522
(4-byte rows) ran 0.334 x the padded rate against 0.164 x 2 = 0.328 priced (benchmarks/results/
h100_gpu_probe_2026-11-24.json, linear_fwd_bwd; 8-byte rows were not measured and are interpolated)."""


def row_alignment(n: float, k: float, itemsize: int) -> int:
    """The largest power of two up to 16 that divides both the N and the K row of ``itemsize``-byte
    elements, in bytes (16: the fast kernels' vector width)."""
    rows = (int(n * itemsize), int(k * itemsize))
    align = 16
    while align > 1 and any(r % align for r in rows):
        align //= 2
    return align


def aligned(n: float, k: float, itemsize: int) -> bool:
    """Whether the rows a product reads and writes (K and N elements of ``itemsize`` bytes: the operands' and
    output's leading dimensions; M is only a count of rows) are whole multiples of 16 bytes, the vector width
    cuBLAS's fast kernels load (NVIDIA, *Matrix Multiplication Background*: dimensions that are multiples of 8
    for 16-bit data).  Measured on an H100 (benchmarks/gpu_probe.py, 2026-11-24): N = 50257 or 4097, K = 4097
    ran 0.15-0.17 × the padded product's rate (fallback ``align1`` kernels); M = 8193 ran at full rate."""
    return (n * itemsize) % 16 == 0 and (k * itemsize) % 16 == 0


def _tiled(m: float, n: float, k: float, batch: int, tile_m: int, tile_n: int, sms: int) -> float:
    """gemm_efficiency for one tile shape (a dim shorter than its tile uses the power of two that holds it)."""

    def edge(d: float, t: int) -> tuple[float, int]:  # (tile edge used, tiles along d)
        t = t if d >= t else 2 ** max(0, math.ceil(math.log2(d)))
        return float(t), math.ceil(d / t)

    (tm, nm), (tn, nn) = edge(m, tile_m), edge(n, tile_n)
    tiles = nm * nn * batch
    split = 1
    if tiles < sms and k > 0:
        split = max(1, min(sms // tiles, math.ceil(k / max(tile_m, tile_n))))
    units = tiles * split
    if units < sms:  # less than one wave: a small kernel, priced by the ramp τ and the launch floor
        return 1.0
    waves = math.ceil(units / sms)
    useful = m * n * batch / (tiles * tm * tn)  # ragged edges
    return float(min(1.0, useful * units / (waves * sms)))


def matmul_time(m: int, n: int, k: int, dtype: object, profile: HardwareProfile, batch: int = 1) -> float:
    """Seconds of ``batch`` products (M × K) · (K × N) on one device: the roofline at η_max · gemm_efficiency."""
    if min(m, n, k) <= 0:
        return profile.compute.launch_floor
    flops = 2.0 * batch * m * n * k
    moved = float(itemsize(dtype)) * batch * (m * k + k * n + m * n)
    factor = gemm_efficiency(m, n, profile, batch, k, itemsize(dtype))
    return _shaped_time(flops, moved, dtype, profile, factor)


def attention_time(
    batch_heads: int,
    seq_q: int,
    seq_kv: int,
    head_dim: int,
    dtype: object,
    profile: HardwareProfile,
    causal: bool = True,
) -> float:
    """Seconds of one fused attention forward (QKᵀ, softmax, ·V) over ``batch_heads`` heads on one device.

    FLOPs 4·BH·S_q·S_kv·d, times :func:`causal_share` when causal; rate ``attention_efficiency`` of peak
    (η_max when the profile gives none); bytes: Q, K, V read and O written once (the fused kernel keeps the
    S × S scores on chip).
    """
    flops = 4.0 * batch_heads * seq_q * seq_kv * head_dim * (causal_share(seq_q, seq_kv) if causal else 1.0)
    moved = float(itemsize(dtype)) * batch_heads * head_dim * (2 * seq_q + 2 * seq_kv)
    c = profile.compute
    factor = (c.attention_efficiency or c.efficiency_max) / c.efficiency_max
    return _shaped_time(flops, moved, dtype, profile, factor)


def causal_share(seq_q: int, seq_kv: int) -> float:
    """Share of the ``S_q × S_kv`` score square a causal attention computes: the (query, key) pairs with
    ``j <= i`` under torch's top-left alignment (``is_causal``'s ``tril``), counted exactly:
    ``Σ_i min(i + 1, S_kv) / (S_q · S_kv)``, which is ``(S + 1) / 2S`` for a square (FlashAttention skips the
    blocks above the diagonal; the diagonal blocks' waste is inside the measured ``attention_efficiency``)."""
    if seq_q < 1 or seq_kv < 1:
        return 1.0
    rows = min(seq_q, seq_kv)  # queries that see fewer than every key: 1, 2, ..., rows
    visible = rows * (rows + 1) / 2 + (seq_q - rows) * seq_kv
    return visible / (seq_q * seq_kv)


def _shaped_time(flops: float, moved: float, dtype: object, profile: HardwareProfile, factor: float) -> float:
    """The roofline with the FLOP term at ``factor`` · η_max (``factor`` from the op's shape)."""
    t_flops, t_mem = _terms(flops / factor, moved, dtype, profile)
    return max(profile.compute.launch_floor, t_flops, t_mem)
