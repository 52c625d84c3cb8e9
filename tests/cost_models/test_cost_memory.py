"""Bytes per device: the ZeRO example of REFERENCE.md exactly, recipes, and sharded tensors."""

from __future__ import annotations

import pytest

from cost_models.memory import (
    FP32_ADAM,
    MIXED_PRECISION_ADAM,
    itemsize,
    local_shard_bytes,
    sharded_bytes,
    training_state_bytes,
)

PSI, N_D = 7.5e9, 64


def test_zero_example_of_the_paper_exactly() -> None:
    totals = [training_state_bytes(PSI, MIXED_PRECISION_ADAM, stage, N_D).total for stage in range(4)]
    # The formulas of REFERENCE.md (Rajbhandari et al., SC'20), evaluated independently.
    assert totals == [16 * PSI, 4 * PSI + 12 * PSI / N_D, 2 * PSI + 14 * PSI / N_D, 16 * PSI / N_D]
    assert [t / 1e9 for t in totals] == [120.0, 31.40625, 16.640625, 1.875]
    # ... which round to the published figures: 120 GB -> 31.4 -> 16.6 -> 1.9 GB (decimal).
    assert [round(t / 1e9, 1) for t in totals] == [120.0, 31.4, 16.6, 1.9]


def test_zero_stages_shard_the_parts_they_name() -> None:
    s1 = training_state_bytes(PSI, MIXED_PRECISION_ADAM, 1, N_D)
    assert (s1.weights, s1.gradients, s1.optimizer) == (2 * PSI, 2 * PSI, 12 * PSI / N_D)
    s2 = training_state_bytes(PSI, MIXED_PRECISION_ADAM, 2, N_D)
    assert (s2.weights, s2.gradients) == (2 * PSI, 2 * PSI / N_D)


@pytest.mark.parametrize("recipe", [MIXED_PRECISION_ADAM, FP32_ADAM], ids=lambda r: r.name)
def test_recipes_are_16_bytes_per_parameter_and_stages_only_shrink(recipe) -> None:
    assert recipe.total == 16
    totals = [training_state_bytes(1e9, recipe, s, 8).total for s in range(4)]
    assert totals[0] == 16e9 and totals[3] == 16e9 / 8
    assert totals == sorted(totals, reverse=True)
    # One data-parallel rank: nothing to shard over.
    assert {training_state_bytes(1e9, recipe, s, 1).total for s in range(4)} == {16e9}


def test_fp32_adam_parts() -> None:
    s1 = training_state_bytes(1e9, FP32_ADAM, 1, 4)
    assert (s1.weights, s1.gradients, s1.optimizer) == (4e9, 4e9, 8e9 / 4)


def test_bad_training_state_arguments() -> None:
    with pytest.raises(ValueError, match="zero_stage"):
        training_state_bytes(1e9, FP32_ADAM, 4, 8)
    with pytest.raises(ValueError, match="dp_degree"):
        training_state_bytes(1e9, FP32_ADAM, 1, 0)


def test_sharded_bytes_is_the_average_share() -> None:
    assert sharded_bytes(1024, 2, 8) == 1024 * 2 / 8
    assert sharded_bytes(10, 4) == 40
    with pytest.raises(ValueError):
        sharded_bytes(10, 4, 0)


def test_local_shard_is_the_largest_chunk() -> None:
    # torch.chunk splits 10 into 3, 3, 3, 1: the largest piece sets the peak.
    assert local_shard_bytes((10, 6), 4, (4, 1)) == 3 * 6 * 4
    assert local_shard_bytes((8, 6), 2, (4, 2)) == sharded_bytes(48, 2, 8)  # even split = average
    assert local_shard_bytes((8, 6), 2) == 96
    assert local_shard_bytes((3,), 4, (8,)) == 4  # more shards than elements: one element at most
    with pytest.raises(ValueError, match="one entry per dim"):
        local_shard_bytes((8, 6), 2, (2,))


@pytest.mark.parametrize(
    ("dtype", "size"),
    [
        ("float32", 4),
        ("bf16", 2),
        ("torch.bfloat16", 2),
        ("half", 2),
        ("int64", 8),
        ("bool", 1),
        ("float8", 1),
    ],
)
def test_itemsize(dtype: str, size: int) -> None:
    assert itemsize(dtype) == size


def test_unknown_dtype_itemsize() -> None:
    with pytest.raises(ValueError, match="unknown dtype"):
        itemsize("float128")
