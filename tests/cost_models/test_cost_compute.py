"""Roofline compute time: which term binds, relations between ops, and a check against measured H100 GEMMs."""

from __future__ import annotations

import numpy as np
import pytest

from autoshard.errors import ProfileError
from cost_models.compute import bound, compute_time, compute_times, ridge_intensity
from cost_models.profile import load_profile

A100 = load_profile("a100x8")
H100 = load_profile("h100x8")


def _gemm(m: int, k: int, n: int, itemsize: int = 2) -> tuple[float, float]:
    """(FLOPs, bytes) of an (m, k) @ (k, n) product: read both inputs, write the output once."""
    return 2.0 * m * k * n, float(itemsize * (m * k + k * n + m * n))


def _elementwise(numel: int, itemsize: int = 2) -> tuple[float, float]:
    """(FLOPs, bytes) of c = a + b."""
    return float(numel), float(3 * itemsize * numel)


@pytest.mark.parametrize("profile", [A100, H100], ids=lambda p: p.name)
def test_big_gemm_is_compute_bound_and_never_beats_peak(profile) -> None:
    flops, nbytes = _gemm(8192, 8192, 8192)
    assert bound(flops, nbytes, "bfloat16", profile) == "compute"
    t = compute_time(flops, nbytes, "bfloat16", profile)
    peak = profile.compute.peak("bfloat16")
    assert t >= flops / peak
    # At this size the ramp is negligible: the achieved fraction of peak is close to eta_max.
    assert flops / t / peak == pytest.approx(profile.compute.efficiency_max, rel=0.02)


@pytest.mark.parametrize("profile", [A100, H100], ids=lambda p: p.name)
def test_elementwise_op_is_memory_bound_at_stream_bandwidth(profile) -> None:
    flops, nbytes = _elementwise(2**28)
    assert bound(flops, nbytes, "bfloat16", profile) == "memory"
    t = compute_time(flops, nbytes, "bfloat16", profile)
    assert t == pytest.approx(nbytes / (profile.memory.bandwidth * profile.memory.efficiency))
    assert t >= nbytes / profile.memory.bandwidth


@pytest.mark.parametrize("profile", [A100, H100], ids=lambda p: p.name)
def test_tiny_op_hits_the_launch_floor(profile) -> None:
    floor = profile.compute.launch_floor
    for flops, nbytes in [_elementwise(16), (0.0, 0.0), (1.0, 8.0)]:
        assert bound(flops, nbytes, "float32", profile) == "launch"
        assert compute_time(flops, nbytes, "float32", profile) == floor


def test_ridge_point_separates_compute_from_memory_bound() -> None:
    ridge = ridge_intensity("bfloat16", H100)
    nbytes = 1e10  # large enough that the ramp and the floor do not matter
    assert bound(4 * ridge * nbytes, nbytes, "bfloat16", H100) == "compute"
    assert bound(0.25 * ridge * nbytes, nbytes, "bfloat16", H100) == "memory"


def test_efficiency_grows_with_gemm_size_and_stays_below_eta_max() -> None:
    achieved = []
    for n in (256, 512, 1024, 2048, 4096, 8192):
        flops, nbytes = _gemm(n, n, n)
        achieved.append(flops / compute_time(flops, nbytes, "bfloat16", H100) / H100.compute.peak("bfloat16"))
    assert achieved == sorted(achieved)
    assert achieved[-1] < H100.compute.efficiency_max
    assert achieved[0] < 0.1 * achieved[-1]


# Measured on one H100 80GB HBM3, 2026-11 (torch 2.11+cu130, cuBLAS, median of 50 back-to-back products):
# (m, k, n) -> seconds.  These calibrated h100x8.json; the model must stay within 15% of each.
H100_BF16_GEMMS = {
    (2048, 2048, 2048): 25.9e-6,
    (3072, 3072, 3072): 78.2e-6,
    (4096, 4096, 4096): 182e-6,
    (8192, 8192, 8192): 1.53e-3,
    (8192, 4096, 4096): 388e-6,
    (8192, 4096, 14336): 1.42e-3,
    (4096, 4096, 1024): 54.8e-6,
    (2048, 8192, 8192): 382e-6,
}


@pytest.mark.parametrize(("shape", "measured"), H100_BF16_GEMMS.items(), ids=lambda x: str(x))
def test_h100_model_tracks_measured_gemms(shape: tuple[int, int, int], measured: float) -> None:
    predicted = compute_time(*_gemm(*shape), "bfloat16", H100)
    assert predicted == pytest.approx(measured, rel=0.15)


def test_times_are_monotonic_in_flops_and_bytes() -> None:
    grid = np.logspace(0, 13, 40)
    by_flops = compute_times(grid, 1e6, "bfloat16", A100)
    by_bytes = compute_times(1e6, grid, "bfloat16", A100)
    assert np.all(np.diff(by_flops) >= 0) and np.all(np.diff(by_bytes) >= 0)
    assert by_flops[-1] > by_flops[0] and by_bytes[-1] > by_bytes[0]


def test_vectorised_matches_scalar() -> None:
    rng = np.random.default_rng(0)
    flops = np.concatenate([[0.0], 10 ** rng.uniform(0, 13, 50)])
    nbytes = 10 ** rng.uniform(0, 10, 51)
    vec = compute_times(flops, nbytes, "float16", A100)
    scalar = [compute_time(f, b, "float16", A100) for f, b in zip(flops, nbytes, strict=True)]
    np.testing.assert_allclose(vec, scalar, rtol=1e-12)


def test_lower_precision_is_faster_for_a_big_gemm() -> None:
    flops, nbytes = _gemm(8192, 8192, 8192, itemsize=4)
    t32 = compute_time(flops, nbytes, "float32", A100)
    assert compute_time(flops, nbytes, "tf32", A100) < t32
    assert compute_time(flops, nbytes, "bfloat16", A100) < compute_time(flops, nbytes, "tf32", A100)


def test_dtype_spellings_agree_and_integers_use_float32() -> None:
    flops, nbytes = _gemm(4096, 4096, 4096)
    ref = compute_time(flops, nbytes, "bfloat16", A100)
    for spelling in ("bf16", "torch.bfloat16"):
        assert compute_time(flops, nbytes, spelling, A100) == ref
    assert compute_time(flops, nbytes, "int64", A100) == compute_time(flops, nbytes, "float32", A100)


def test_missing_dtype_peak_raises_only_when_flops_need_it() -> None:
    v100 = load_profile("v100x8")
    with pytest.raises(ProfileError, match="bfloat16"):
        compute_time(1e9, 1e6, "bfloat16", v100)
    assert compute_time(0.0, 1e9, "bfloat16", v100) == pytest.approx(
        1e9 / (v100.memory.bandwidth * v100.memory.efficiency)
    )


def test_negative_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="flops >= 0"):
        compute_time(-1.0, 0.0, "float32", A100)
    with pytest.raises(ValueError, match="bytes_moved >= 0"):
        compute_times([1.0], [-1.0], "float32", A100)
