"""Collective times: REFERENCE.md figures, relations between collectives, and lower bounds by link volume."""

from __future__ import annotations

import numpy as np
import pytest

from cost_models.collectives import (
    COLLECTIVE_KINDS,
    LOCAL_KINDS,
    CollectiveGroup,
    alpha_beta,
    bus_bandwidth,
    choose_algorithm,
    collective_time,
    collective_times,
)
from cost_models.profile import HardwareProfile, load_profile

A100 = load_profile("a100x8")
H100 = load_profile("h100x8")
PROFILES = [load_profile(n) for n in ("a100x8", "h100x8", "v100x8", "cpu")]
GIB = 2**30
NODE = CollectiveGroup(members_per_node=8)
GROUPS = [CollectiveGroup(2), NODE, CollectiveGroup(8, 2), CollectiveGroup(1, 4), CollectiveGroup(2, 8),
          CollectiveGroup(8, 64)]  # fmt: skip


def _net(p: HardwareProfile) -> float:
    return (
        p.inter_node.nics_per_node * p.inter_node.nic_bandwidth * p.inter_node.efficiency / p.devices_per_node
    )


def _fits(g: CollectiveGroup, p: HardwareProfile) -> bool:
    return g.members_per_node <= p.devices_per_node


def test_a100_all_reduce_in_one_node_matches_nccl_tests() -> None:
    t = collective_time("all_reduce", GIB, NODE, A100)
    nominal = 2 * 7 / 8 * GIB / 230e9
    assert 0.75 * nominal <= t <= 1.25 * nominal


def test_h100_all_reduce_bus_bandwidth_is_between_ring_and_nvls() -> None:
    t = collective_time("all_reduce", GIB, NODE, H100)
    implied = 2 * 7 / 8 * GIB / t
    assert 370e9 <= implied <= 480e9
    assert bus_bandwidth("all_reduce", GIB, NODE, H100) == pytest.approx(implied)


def test_two_dgx_a100_all_reduce_reproduces_the_measured_bus_bandwidth() -> None:
    # REFERENCE.md: 2 x DGX A100 over 8 x HDR, ~192 GB/s all-reduce busbw.
    assert bus_bandwidth("all_reduce", 4 * GIB, CollectiveGroup(8, 2), A100) == pytest.approx(192e9, rel=0.1)


def test_all_gather_plus_reduce_scatter_equals_all_reduce_when_bus_bandwidths_agree() -> None:
    # On A100 all three run the same ring at the same busbw.
    for g in GROUPS:
        ar = collective_time("all_reduce", GIB, g, A100)
        ag_rs = collective_time("all_gather", GIB, g, A100) + collective_time("reduce_scatter", GIB, g, A100)
        assert ag_rs == pytest.approx(ar, rel=0.03), g


def test_nvls_all_reduce_beats_reduce_scatter_plus_all_gather_on_h100() -> None:
    ar = collective_time("all_reduce", GIB, NODE, H100)
    assert ar < collective_time("all_gather", GIB, NODE, H100) + collective_time(
        "reduce_scatter", GIB, NODE, H100
    )


def test_hierarchical_all_reduce_volume_is_reduce_scatter_plus_all_gather() -> None:
    g = CollectiveGroup(8, 4)
    ar, rs, ag = (alpha_beta(k, g, A100)[1] for k in ("all_reduce", "reduce_scatter", "all_gather"))
    assert {ar.algorithm, rs.algorithm, ag.algorithm} == {"hierarchical"}
    assert ar.seconds_per_byte == pytest.approx(rs.seconds_per_byte + ag.seconds_per_byte)
    # one launch fewer: the fused all-reduce runs its inter-node phase inside the same three launches
    assert ar.latency == pytest.approx(rs.latency + ag.latency - A100.compute.launch_floor)


def test_hierarchical_all_reduce_is_the_reference_formula() -> None:
    k, m = 8, 4
    bus = A100.intra_node.bus_bandwidth.all_reduce  # = reduce_scatter = all_gather on A100
    expected = 2 * (k - 1) / k / bus + 2 * (m - 1) / m / k / _net(A100)
    assert alpha_beta("all_reduce", CollectiveGroup(k, m), A100)[1].seconds_per_byte == pytest.approx(
        expected
    )


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p.name)
@pytest.mark.parametrize("kind", COLLECTIVE_KINDS)
def test_crossing_nodes_costs_more_than_staying_inside(profile: HardwareProfile, kind: str) -> None:
    n = profile.devices_per_node
    inside = collective_time(kind, GIB, CollectiveGroup(n), profile)
    assert collective_time(kind, GIB, CollectiveGroup(n, 2), profile) > inside
    # The same 2 ranks, once on one node and once on two.
    assert collective_time(kind, GIB, CollectiveGroup(1, 2), profile) > collective_time(
        kind, GIB, CollectiveGroup(2), profile
    )


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p.name)
@pytest.mark.parametrize("kind", COLLECTIVE_KINDS)
def test_no_collective_beats_its_volume_over_its_slowest_link(profile: HardwareProfile, kind: str) -> None:
    for g in filter(lambda g: _fits(g, profile), GROUPS):
        n, k, m = g.size, g.members_per_node, g.nodes
        f = (2.0 if kind == "all_reduce" else 1.0) * (n - 1) / n
        t = collective_time(kind, GIB, g, profile)
        if m == 1:
            assert t >= f * GIB / profile.intra_node.bus_bandwidth.of(kind)
        elif kind == "all_to_all":  # (n - k)/n of each rank's buffer leaves the node through its NIC share
            assert t >= (n - k) / n * GIB / _net(profile)
        else:  # (m-1)/m of the buffer (twice for all-reduce) leaves each node through its k members' NICs
            times = 2.0 if kind == "all_reduce" else 1.0
            assert t >= times * (m - 1) / m * GIB / (k * _net(profile))


@pytest.mark.parametrize("kind", [*COLLECTIVE_KINDS, *LOCAL_KINDS])
def test_a_group_of_one_and_local_steps_are_free(kind: str) -> None:
    assert collective_time(kind, GIB, CollectiveGroup(1), A100) == 0.0
    if kind in LOCAL_KINDS:
        assert collective_time(kind, GIB, CollectiveGroup(8, 4), A100) == 0.0


@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p.name)
@pytest.mark.parametrize("kind", COLLECTIVE_KINDS)
def test_time_is_monotonic_in_bytes_and_vectorised_matches_scalar(
    profile: HardwareProfile, kind: str
) -> None:
    sizes = np.concatenate([[0.0], np.logspace(0, 11, 45)])
    for g in filter(lambda g: _fits(g, profile), GROUPS):
        times = collective_times(kind, sizes, g, profile)
        assert np.all(np.diff(times) > 0), g
        scalar = [collective_time(kind, s, g, profile) for s in sizes]
        np.testing.assert_allclose(times, scalar, rtol=1e-12)


def test_small_messages_over_many_nodes_take_the_hierarchical_path() -> None:
    many = CollectiveGroup(8, 64)
    small = choose_algorithm("all_reduce", 1024, many, A100)
    assert small.algorithm == "hierarchical"
    assert choose_algorithm("all_reduce", 4 * GIB, CollectiveGroup(8, 2), A100).algorithm == "ring"
    # Whatever is chosen is the cheapest candidate.
    for s in (1024.0, float(GIB)):
        best = min(ab.time(s) for ab in alpha_beta("all_reduce", many, A100))
        assert collective_time("all_reduce", s, many, A100) == best


def test_all_to_all_across_nodes_is_bounded_by_the_nic_share() -> None:
    g = CollectiveGroup(8, 4)
    t = collective_time("all_to_all", GIB, g, A100)
    assert t == pytest.approx(24 / 32 * GIB / _net(A100), rel=0.01)
    assert t > collective_time("all_to_all", GIB, NODE, A100)


def test_latency_dominates_tiny_messages() -> None:
    t = collective_time("all_reduce", 8, NODE, A100)
    assert t == pytest.approx(2 * 7 * A100.intra_node.step_latency + A100.compute.launch_floor, rel=1e-3)


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown collective kind 'allreduce'"):
        collective_time("allreduce", GIB, NODE, A100)
    with pytest.raises(ValueError, match="nbytes >= 0"):
        collective_time("all_reduce", -1, NODE, A100)
    with pytest.raises(ValueError, match="members_per_node"):
        CollectiveGroup(0)
    with pytest.raises(ValueError, match="nodes"):
        CollectiveGroup(8, nodes=0)


def test_group_record() -> None:
    g = CollectiveGroup(2, 8)
    assert (g.size, g.crosses_nodes, str(g)) == (16, True, "16 ranks (2/node x 8 nodes)")
    assert not NODE.crosses_nodes
    assert len({CollectiveGroup(2, 8), g}) == 1
