"""Complex tensors are priced, never rejected: a complex element is a pair of reals at their peak."""

from __future__ import annotations

import pytest
import torch

from cost_models.profile import load_profile


@pytest.mark.parametrize("profile", ["cpu", "a100x8"])
def test_complex_peaks_are_their_real_pairs(profile: str) -> None:
    compute = load_profile(profile).compute
    assert compute.peak(torch.complex64) == compute.peak(torch.float32)
    assert compute.peak("complex128") == compute.peak("float64")
