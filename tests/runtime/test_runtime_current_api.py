"""A ZeRO run prints nothing of torch's own: its bucketed gradient reduce-scatters and FSDP's use torch 2.13's
``reduce_scatter_single``, not ``reduce_scatter_tensor``, which warns (FutureWarning) on every rank and call."""

from __future__ import annotations

import warnings
from typing import Any, Literal

import pytest
from test_runtime_zero import _train

from autoshard.runtime.launch import launch


def _strict(kind: str, stage: Literal[1, 2, 3], overlap: bool) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # a deprecated collective fails the rank
        return _train(kind, stage, overlap)


@pytest.mark.slow
def test_bucketed_reduce_scatters_use_the_current_collective() -> None:
    for _state, counts, *_ in launch(_strict, 2, "dp", 2, True):
        assert counts["backward:reduce_scatter"] > 0  # the buckets ran, through reduce_scatter_single
