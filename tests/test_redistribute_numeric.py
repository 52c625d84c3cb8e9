"""Numeric proof of redistribution: every planned step list, executed on the simulated mesh, yields ``dst``.

For each (src, dst) pair: distribute a random tensor under ``src``, run the planned steps with
``apply_steps_local``, and compare against ``distribute`` under ``dst``.  A ``Partial`` target is checked
exactly where it matters: summing over its partial axes must give, on every device, the piece that the same
spec with ``R`` in place of ``P`` holds (so shard layout and replica agreement are checked too).
"""

from __future__ import annotations

import functools
import itertools
import math
import random
from collections.abc import Iterator

import pytest
import torch

from autoshard.errors import ShardingError
from autoshard.local_mesh import Coord, coords, distribute
from autoshard.placement import Partial, Placement, Replicate, Shard, ShardingSpec
from autoshard.redistribute import CollectiveCost, Step, plan_redistribute
from autoshard.redistribute_local import apply_steps_local

SHAPE = (8, 8, 4)
CHOICES: tuple[Placement, ...] = (Replicate(), Partial(), Shard(0), Shard(1), Shard(2))


def specs(mesh_shape: tuple[int, ...], shape: tuple[int, ...] = SHAPE) -> list[ShardingSpec]:
    """Every spec over CHOICES that fits ``shape`` on ``mesh_shape``."""
    out = []
    for placements in itertools.product(CHOICES, repeat=len(mesh_shape)):
        spec = ShardingSpec(placements)
        try:
            spec.check_fits(shape, mesh_shape)
        except ShardingError:
            continue
        out.append(spec)
    return out


def pairs(
    mesh_shape: tuple[int, ...], sample: int | None = None
) -> Iterator[tuple[ShardingSpec, ShardingSpec]]:
    every = list(itertools.product(specs(mesh_shape), specs(mesh_shape)))
    if sample is not None and sample < len(every):
        every = random.Random(0).sample(every, sample)
    return iter(every)


def _reduce_partials(
    pieces: dict[Coord, torch.Tensor], spec: ShardingSpec, mesh_shape: tuple[int, ...]
) -> dict[Coord, torch.Tensor]:
    """Sum every device's piece over ``spec``'s partial axes (what an all-reduce there would leave)."""
    out = dict(pieces)
    for axis in spec.partial_axes():
        summed = {}
        for c in out:
            group = [(*c[:axis], k, *c[axis + 1 :]) for k in range(mesh_shape[axis])]
            summed[c] = torch.stack([out[g] for g in group]).sum(dim=0)
        out = summed
    return out


@functools.lru_cache(maxsize=4096)
def _pieces(
    spec: ShardingSpec, shape: tuple[int, ...], mesh_shape: tuple[int, ...]
) -> dict[Coord, torch.Tensor]:
    """The pieces of the test tensor of ``shape`` under ``spec`` (cached: each spec recurs in many pairs)."""
    return distribute(_x(shape), spec, mesh_shape, seed=1)


def check_pair(
    src: ShardingSpec,
    dst: ShardingSpec,
    shape: tuple[int, ...],
    mesh_shape: tuple[int, ...],
    cluster: CollectiveCost | None = None,
) -> None:
    """Plan ``src`` -> ``dst`` (priced by ``cluster`` if given), run it on float64 pieces, check them."""
    steps = plan_redistribute(src, dst, shape, 8, mesh_shape, cluster=cluster)
    check_nbytes(src, steps, shape, 8, mesh_shape)
    got = apply_steps_local(_pieces(src, shape, mesh_shape), src, steps, mesh_shape)
    unpartial = ShardingSpec(tuple(Replicate() if isinstance(p, Partial) else p for p in dst.placements))
    want = _pieces(unpartial, shape, mesh_shape)
    reduced = _reduce_partials(got, dst, mesh_shape)
    label = f"{src} -> {dst} on {mesh_shape}: {[str(s) for s in steps]}"
    local = dst.local_shape(shape, mesh_shape)
    for c in coords(mesh_shape):
        assert tuple(got[c].shape) == local, f"{label}: device {c} holds {tuple(got[c].shape)}, not {local}"
        if src.partial_axes() or dst.partial_axes():
            if not torch.allclose(reduced[c], want[c]):  # (assert_close is slow; call it only to report)
                torch.testing.assert_close(
                    reduced[c], want[c], msg=f"{label}: device {c} holds the wrong sum"
                )
        else:  # only copies happened: bit-exact
            assert torch.equal(got[c], want[c]), f"{label}: device {c} holds the wrong piece"


def check_nbytes(
    src: ShardingSpec, steps: tuple[Step, ...], shape: tuple[int, ...], itemsize: int, mesh: tuple[int, ...]
) -> None:
    """Each step's nbytes is max(bytes per device before, after), recomputed here from the specs it passes."""
    spec = src
    for step in steps:
        placements = list(spec.placements)
        if step.kind in ("all_gather", "all_reduce"):
            placements[step.mesh_axis] = Replicate()
        elif step.kind in ("local_zero", "local_pad"):
            placements[step.mesh_axis] = Partial()
        else:
            assert step.dst_dim is not None
            placements[step.mesh_axis] = Shard(step.dst_dim)
        after = ShardingSpec(tuple(placements))
        before_bytes, after_bytes = (math.prod(s.local_shape(shape, mesh)) * itemsize for s in (spec, after))
        assert step.nbytes == max(before_bytes, after_bytes), f"{spec} -> {after} by {step}"
        spec = after


@functools.lru_cache
def _x(shape: tuple[int, ...]) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)


@pytest.mark.parametrize("mesh_shape", [(2,), (4,), (1, 2), (2, 2), (4, 2), (2, 4)], ids=str)
def test_every_pair_on_small_meshes(mesh_shape: tuple[int, ...]) -> None:
    n = 0
    for src, dst in pairs(mesh_shape):
        check_pair(src, dst, SHAPE, mesh_shape)
        n += 1
    assert n == len(specs(mesh_shape)) ** 2


def test_sampled_pairs_on_a_cube_mesh() -> None:
    for src, dst in pairs((2, 2, 2), sample=800):
        check_pair(src, dst, SHAPE, (2, 2, 2))


def test_nested_sharding_on_a_cube_mesh() -> None:
    """All pairs where some dim is sharded by two or more axes in src or dst: the cases that need ordering."""

    def nested(spec: ShardingSpec) -> bool:
        return any(spec.shard_count(d, (2, 2, 2)) >= 4 for d in range(len(SHAPE)))

    for src, dst in pairs((2, 2, 2)):
        if nested(src) and nested(dst):
            check_pair(src, dst, SHAPE, (2, 2, 2))


@pytest.mark.slow
def test_every_pair_on_a_cube_mesh() -> None:
    for src, dst in pairs((2, 2, 2)):
        check_pair(src, dst, SHAPE, (2, 2, 2))


def test_sampled_pairs_on_a_4d_mesh() -> None:
    mesh = (2, 2, 2, 2)
    every = list(itertools.product(specs(mesh, (16, 8, 8)), specs(mesh, (16, 8, 8))))
    for src, dst in random.Random(1).sample(every, 80):
        check_pair(src, dst, (16, 8, 8), mesh)
