"""The H100 profile's in-node all-reduce against a published 32 KiB - 16 GiB sweep (benchmarks/fidelity_nccl.py)."""

from __future__ import annotations

import pytest

from benchmarks.fidelity_nccl import SWEEP_8XH200, fit_latency, model_seconds, sweep_seconds
from cost_models.profile import load_profile

H100 = load_profile("h100x8")


def test_the_profile_holds_the_fitted_latency() -> None:
    alpha, mean, worst = fit_latency()
    assert H100.intra_node.step_latency == pytest.approx(alpha)
    assert "all-reduce-8xH200" in H100.source_of("intra_node.step_latency")
    assert mean <= 0.10 and worst <= 0.30


def test_the_fit_reproduces_the_cited_points_within_tolerance() -> None:
    """Stated tolerance: within 10% below 1 MiB (latency-bound) and from 128 MiB up (bandwidth-bound); within
    30% in between, where NCCL switches from Ring/LL to NVLS/Simple and one line cannot follow; mean <= 10%."""
    errors = {s: model_seconds(s, H100) / sweep_seconds(s, b) - 1 for s, b in SWEEP_8XH200}
    for nbytes, error in errors.items():
        bound = 0.10 if nbytes <= 2**20 or nbytes >= 128 * 2**20 else 0.30
        assert abs(error) <= bound, (nbytes, error)
    assert sum(abs(e) for e in errors.values()) / len(errors) <= 0.10
    assert len(errors) == 20 and min(errors) == 32 * 2**10 and max(errors) == 16 * 2**30
