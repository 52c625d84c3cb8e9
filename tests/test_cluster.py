"""Cluster: loading, the mesh laid over nodes, collectives priced per axis, mesh errors that say the fix."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections import Counter
from pathlib import Path

import pytest

import hardware_profiles
from autoshard.cluster import Cluster, load_cluster
from autoshard.errors import AutoshardError, MeshError, ProfileError
from cost_models.collectives import CollectiveGroup, collective_time
from cost_models.compute import compute_time
from cost_models.profile import load_profile

GIB = 2**30


def _groups_by_enumeration(mesh: tuple[int, ...], per_node: int, axis: int) -> set[tuple[int, int]]:
    """(members per node, nodes) of every process group of ``axis``, from mesh coordinates directly."""
    coords = list(itertools.product(*(range(n) for n in mesh)))
    rank = {c: r for r, c in enumerate(coords)}  # row-major: last axis fastest
    shapes = set()
    for c in coords:
        if c[axis] != 0:
            continue
        members = [rank[(*c[:axis], i, *c[axis + 1 :])] for i in range(mesh[axis])]
        per = Counter(r // per_node for r in members)
        assert len(set(per.values())) == 1
        shapes.add((next(iter(per.values())), len(per)))
    return shapes


def test_load_by_name_suffix_path_and_record_are_equal() -> None:
    path = Path(hardware_profiles.__file__).parent / "a100x8.json"
    clusters = [
        load_cluster("a100x8"),
        load_cluster("a100x8.json"),
        load_cluster(path),
        load_cluster(str(path)),
        load_cluster(load_profile("a100x8")),
    ]
    assert len(set(clusters)) == 1
    assert clusters[0] == Cluster(load_profile("a100x8"))


def test_defaults_one_axis_over_all_devices() -> None:
    c = load_cluster("h100x8", nodes=2)
    assert c.mesh_shape == (16,)
    assert c.axis_names == ("axis0",)
    assert (c.num_devices, c.devices_per_node, c.nodes) == (16, 8, 2)
    assert c.device_memory == load_profile("h100x8").memory.capacity


def test_axes_are_laid_outermost_first_over_nodes() -> None:
    c = load_cluster("a100x8", nodes=4, mesh=(4, 8))
    assert c.axis_crosses_nodes(0) and not c.axis_crosses_nodes(1)
    assert c.axis_group(0) == CollectiveGroup(members_per_node=1, nodes=4)
    assert c.axis_group(1) == CollectiveGroup(members_per_node=8, nodes=1)


@pytest.mark.parametrize(
    ("nodes", "mesh"),
    [
        (8, (16, 4)),
        (8, (4, 16)),
        (4, (2, 4, 4)),
        (2, (2, 2, 4)),
        (1, (2, 4)),
        (16, (8, 2, 8)),
        (3, (3, 8)),
        (3, (6, 4)),
    ],
)
def test_axis_groups_match_brute_force_enumeration(nodes: int, mesh: tuple[int, ...]) -> None:
    c = load_cluster("a100x8", nodes=nodes, mesh=mesh)
    for axis in range(len(mesh)):
        g = c.axis_group(axis)
        assert _groups_by_enumeration(mesh, 8, axis) == {(g.members_per_node, g.nodes)}


def test_partially_spanning_axis() -> None:
    c = load_cluster("a100x8", nodes=8, mesh=(16, 4))
    assert c.axis_group(0) == CollectiveGroup(members_per_node=2, nodes=8)
    assert c.axis_crosses_nodes(0) and not c.axis_crosses_nodes(1)


def test_collective_time_prices_the_axis_group() -> None:
    c = load_cluster("a100x8", nodes=2, mesh=(2, 8), axis_names=("dp", "tp"))
    p = c.profile
    for axis, name in enumerate(c.axis_names):
        expected = collective_time("all_reduce", GIB, c.axis_group(axis), p)
        assert c.collective_time("all_reduce", GIB, axis) == expected
        assert c.collective_time("all_reduce", GIB, name) == expected
    assert c.collective_time("all_reduce", GIB, "dp") > c.collective_time("all_reduce", GIB, "tp")


def test_crossing_axis_costs_more_than_one_node() -> None:
    one_node = load_cluster("a100x8").collective_time("all_reduce", GIB)
    assert load_cluster("a100x8", nodes=2, mesh=(16,)).collective_time("all_reduce", GIB) > one_node
    assert load_cluster("a100x8", nodes=2, mesh=(2, 8)).collective_time("all_reduce", GIB, axis=0) > one_node


def test_size_one_axis_is_free() -> None:
    c = load_cluster("a100x8", mesh=(1, 8))
    assert c.collective_time("all_reduce", GIB, axis=0) == 0.0
    assert c.collective_time("all_gather", GIB, axis=1) > 0.0


def test_compute_time_delegates() -> None:
    c = load_cluster("h100x8")
    assert c.compute_time(1e12, 1e9, "bfloat16") == compute_time(1e12, 1e9, "bfloat16", c.profile)


def test_cluster_is_hashable_frozen_and_a_cache_key() -> None:
    a, b = load_cluster("a100x8", nodes=2, mesh=(2, 8)), load_cluster("a100x8", nodes=2, mesh=(2, 8))
    assert a == b and hash(a) == hash(b)
    cache = {a: 1}
    assert cache[b] == 1
    assert a != load_cluster("a100x8", nodes=2, mesh=(16,))
    assert a != load_cluster("h100x8", nodes=2, mesh=(2, 8))
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.nodes = 3  # type: ignore[misc]


def test_describe_names_the_hardware_and_the_axes() -> None:
    text = load_cluster("a100x8", nodes=4, mesh=(4, 8), axis_names=("dp", "tp")).describe()
    assert 1 <= len(text.splitlines()) <= 2
    for words in ("a100x8", "32 x", "(4, 8)", "dp=4 (across 4 nodes", "tp=8 (in node)"):
        assert words in text
    assert "a100x8" in repr(load_cluster("a100x8"))


def test_mesh_that_does_not_fit_says_how_to_fix_it() -> None:
    with pytest.raises(MeshError) as info:
        load_cluster("a100x8", nodes=2, mesh=(4, 3))
    message = str(info.value)
    assert isinstance(info.value, AutoshardError)
    assert "(4, 3) has 12 devices" in message and "2 nodes x 8 = 16" in message
    assert "multiply to 16" in message and "(2, 8)" in message
    suggested = (2, 8)
    assert math.prod(suggested) == 16  # the suggestion itself fits
    load_cluster("a100x8", nodes=2, mesh=suggested)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"nodes": 0}, "nodes must be a whole number >= 1"),
        ({"nodes": 1.5}, "nodes must be a whole number"),
        ({"mesh": (8, 0)}, "axis 1 has size 0"),
        ({"mesh": (-2, -4)}, "axis 0 has size -2"),
        ({"mesh": (2, 4), "axis_names": ("dp",)}, "give one per axis"),
        ({"mesh": (2, 4), "axis_names": ("x", "x")}, "distinct"),
        ({"nodes": 3, "mesh": (4, 6)}, "straddle node boundaries unevenly"),
    ],
)
def test_mesh_errors(kwargs: dict, words: str) -> None:
    with pytest.raises(MeshError, match=words):
        load_cluster("a100x8", **kwargs)


@pytest.mark.parametrize("axis", [2, -1, "pp", True])
def test_invalid_axis_is_a_mesh_error(axis: object) -> None:
    c = load_cluster("a100x8", nodes=2, mesh=(2, 8), axis_names=("dp", "tp"))
    with pytest.raises(MeshError, match="no axis"):
        c.collective_time("all_reduce", GIB, axis)  # type: ignore[arg-type]


def test_unknown_profile_lists_the_bundled_ones() -> None:
    with pytest.raises(ProfileError, match=r"a100x8.*h100x8"):
        load_cluster("b200x8")
