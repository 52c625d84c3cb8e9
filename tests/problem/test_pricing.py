"""Whole-table redistribution prices equal the per-pair Dijkstra search, bit for bit."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

import autoshard
from autoshard.placement import Partial, Replicate, Shard, ShardingSpec
from autoshard.problem.costs import StepCache


def _all_specs(ndim: int, mesh_ndim: int) -> list[ShardingSpec]:
    options = [Replicate(), Partial(), *(Shard(d) for d in range(ndim))]
    return [ShardingSpec(tuple(p)) for p in itertools.product(options, repeat=mesh_ndim)]


@pytest.mark.parametrize(
    ("mesh", "nodes", "shape"),
    [((2, 2, 2), 1, (4, 8, 6)), ((2, 4, 8), 8, (16, 6, 64)), ((2, 4), 1, (2, 3)), ((4, 2, 2, 2), 4, (8, 8))],
)
def test_table_equals_the_search_for_every_pair(
    mesh: tuple[int, ...], nodes: int, shape: tuple[int, ...]
) -> None:
    cluster = autoshard.load_cluster("a100x8", nodes=nodes, mesh=mesh)
    every = _all_specs(len(shape), len(mesh))
    specs: list[ShardingSpec | None] = [*every[:: max(1, len(every) // 80)], None]  # <= ~80 + 2 per side
    specs.append(ShardingSpec((Partial("max"), *(Replicate() for _ in mesh[1:]))))  # may only stay as it is
    cache = StepCache(cluster)
    ids = [cache.intern(s) for s in specs]
    table = cache.prices.pairwise(specs, specs, shape, 2)
    expected = np.array([[cache.time(a, b, shape, 2) for b in ids] for a in ids])
    assert np.isinf(expected).any() and (expected > 0).any()  # the case covers unfit specs and real moves
    same = (table == expected) | (np.isinf(table) & np.isinf(expected))
    assert same.all(), [(str(specs[i]), str(specs[j])) for i, j in zip(*np.nonzero(~same), strict=True)][:5]


def test_table_rows_grow_lazily_and_stay_consistent() -> None:
    cluster = autoshard.load_cluster("a100x8", nodes=2, mesh=(2, 2, 4))
    shape = (8, 16)
    specs = _all_specs(2, 3)
    cache = StepCache(cluster)
    first = cache.prices.pairwise(specs[:5], specs, shape, 4)
    whole = cache.prices.pairwise(specs, specs, shape, 4)
    assert np.array_equal(first, whole[:5])
    assert math.isfinite(whole[0, -1])
