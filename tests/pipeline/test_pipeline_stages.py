"""The stage DP against brute force over every cut, with memory limits and pins."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from autoshard.pipeline.schedules import Schedule
from autoshard.pipeline.stages import Part, StageCosts, best_split, price_split


def _costs(rng: random.Random, layers: int) -> StageCosts:
    def part(scale: float) -> Part:
        return Part(
            forward=rng.uniform(0.1, 1.0) * scale,
            backward=rng.uniform(0.2, 2.0) * scale,
            once=rng.uniform(0.0, 0.5) * scale,
            static=rng.uniform(1.0, 4.0) * scale,
            activation=rng.uniform(0.5, 2.0) * scale,
        )

    return StageCosts(part(1.0), part(rng.uniform(0.0, 3.0)), part(rng.uniform(0.0, 3.0)), layers, 0.05)


def _brute(costs, schedule, p, v, m, limit, pins=()):
    best = None
    for inner in itertools.combinations(range(1, costs.layers), p * v - 1):
        if pins and set(inner) != set(pins):
            continue
        split = price_split(costs, (0, *inner, costs.layers), schedule, p, v, m)
        if max(split.memory) > limit:
            continue
        if best is None or split.step_seconds < best.step_seconds - 1e-12:
            best = split
    return best


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("schedule", [Schedule.GPIPE, Schedule.ONE_F_ONE_B])
def test_dp_equals_brute_force(seed: int, schedule: Schedule) -> None:
    rng = random.Random(seed)
    layers, p, m = rng.randint(3, 8), rng.randint(2, 3), rng.randint(1, 6)
    costs = _costs(rng, layers)
    limit = math.inf if seed % 3 == 0 else rng.uniform(8.0, 30.0)
    want = _brute(costs, schedule, p, 1, m, limit)
    got = best_split(costs, schedule, p, 1, m, limit)
    if want is None:
        assert got is None
        return
    assert got is not None and max(got.memory) <= limit
    assert got.step_seconds == pytest.approx(want.step_seconds, rel=1e-12)


@pytest.mark.parametrize("seed", range(6))
def test_interleaved_dp_is_feasible_and_near_brute_force(seed: int) -> None:
    rng = random.Random(100 + seed)
    costs = _costs(rng, rng.randint(5, 8))
    for schedule in (Schedule.INTERLEAVED_1F1B, Schedule.ZB_V):
        want = _brute(costs, schedule, 2, 2, 4, math.inf)
        got = best_split(costs, schedule, 2, 2, 4)
        assert want is not None and got is not None
        assert got.step_seconds >= want.step_seconds - 1e-12  # brute force is the optimum
        assert got.step_seconds <= want.step_seconds * 1.25  # the chunk-bottleneck DP stays close


def test_identical_layers_split_evenly_and_pins_are_kept() -> None:
    layer = Part(forward=1.0, backward=2.0, once=0.1, static=1.0, activation=1.0)
    costs = StageCosts(layer, Part(), Part(), 8, 0.0)
    even = best_split(costs, Schedule.ONE_F_ONE_B, 4, 1, 8)
    assert even is not None and even.bounds == (0, 2, 4, 6, 8)
    pinned = best_split(costs, Schedule.ONE_F_ONE_B, 2, 1, 8, pinned_cuts=(3,))
    assert pinned is not None and pinned.bounds == (0, 3, 8)


def test_heavy_head_gets_fewer_layers() -> None:
    layer = Part(forward=1.0, backward=2.0)
    costs = StageCosts(layer, Part(), Part(forward=3.0, backward=6.0), 10, 0.0)  # the head weighs 3 layers
    split = best_split(costs, Schedule.ONE_F_ONE_B, 2, 1, 16)
    assert split is not None and split.bounds == (0, 6, 10)  # 6 layers vs 4 layers + head


def test_memory_limit_decides_the_cut_and_can_refuse() -> None:
    layer = Part(forward=1.0, backward=2.0, static=10.0, activation=1.0)
    costs = StageCosts(layer, Part(static=25.0), Part(), 6, 0.0)
    split = best_split(costs, Schedule.ONE_F_ONE_B, 2, 1, 4, memory_limit=50.0)
    assert split is not None and max(split.memory) <= 50.0
    assert split.bounds == (0, 2, 6)  # stage 0 holds the embedding: it can take only 2 layers
    assert best_split(costs, Schedule.ONE_F_ONE_B, 2, 1, 4, memory_limit=20.0) is None
