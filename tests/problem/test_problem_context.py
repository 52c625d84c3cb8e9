"""The zigzag layout's price: a cluster with a zigzag axis adds one reordering copy to every gather,
reduce-scatter and all-to-all on that axis, nothing elsewhere; a ring over a mask proven causal pays the
contiguous layout's imbalance of its causal triangle."""

from __future__ import annotations

import dataclasses

import pytest

import autoshard
from autoshard.cluster import Cluster
from autoshard.problem.build import BuiltProblem
from autoshard.problem.context import ZigzagCluster, reorder_seconds, zigzag_axis_of, zigzag_cluster
from autoshard.strategies import OpStrategy


@pytest.fixture
def mesh() -> Cluster:
    return autoshard.load_cluster("h100x8", nodes=2, mesh=(2, 8))


def test_a_zigzag_axis_prices_its_reordering_copies(mesh: Cluster) -> None:
    zigzag = zigzag_cluster(mesh, 1)
    assert isinstance(zigzag, ZigzagCluster) and zigzag_axis_of(zigzag) == 1 and zigzag_axis_of(mesh) is None
    assert zigzag != mesh and hash(zigzag) != hash(mesh)  # price tables are cached per cluster
    size = 64 * 2**20
    for kind, copies in (
        ("all_gather", 2 * size),
        ("reduce_scatter", 2 * size),
        ("all_to_all", 4 * size / 8),
    ):
        copy = mesh.compute_time(0.0, copies, "bfloat16")
        assert copy > 0 and copy == reorder_seconds(kind, size, 8, mesh)
        assert zigzag.collective_time(kind, size, axis=1) == pytest.approx(
            mesh.collective_time(kind, size, 1) + copy
        )
        assert zigzag.collective_time(kind, size, axis=0) == mesh.collective_time(kind, size, axis=0)
    assert zigzag.collective_time("all_reduce", size, axis=1) == mesh.collective_time(
        "all_reduce", size, axis=1
    )
    assert "zigzag_axis=1" in repr(zigzag)


def test_a_proven_causal_mask_prices_the_contiguous_imbalance_of_its_triangle() -> None:
    from autoshard import zoo
    from autoshard.capture import capture
    from autoshard.problem.build import build_problem
    from autoshard.problem.context import ring_seconds
    from autoshard.problem.costs import CostOptions

    case = zoo.build("llama-tiny", batch=1, seq=64)
    cluster = autoshard.load_cluster("cpu", mesh=(4,))
    built = build_problem(capture(case.model, case.args), cluster, CostOptions(cp_layout="zigzag"))
    (name,) = [n for n, i in built.infos.items() if "scaled_dot" in i.target and i.block and i.block[0] == 0]
    info = built.infos[name]
    ring = next(s for s in built.strategies[name] if ring_axis(built, name, s) == 0)
    inputs = tuple(built.infos[i] for i in info.inputs)
    fwd, bwd = 1.0, 2.0  # seconds of the node's priced FLOPs here (the triangle: a ring runs causal)
    proven = ring_seconds(info, ring, cluster, inputs, fwd, bwd, "zigzag")
    unproven = ring_seconds(
        dataclasses.replace(info, causal_mask=False), ring, cluster, inputs, fwd, bwd, "zigzag"
    )
    # the hops (microseconds here) hide under either; balanced, nothing is added to the triangle node_compute
    # prices (problem/attention.py), as for the head and batch splits that run is_causal
    assert info.causal_mask and unproven == (0.0, 0.0) and proven == (0.0, 0.0)
    contiguous = ring_seconds(info, ring, cluster, inputs, fwd, bwd, "contiguous")
    # the last of 4 contiguous devices does 7/4 of the average triangle, which is what fwd and bwd price
    assert contiguous == pytest.approx((0.75 * fwd, 0.75 * bwd))
    no_proof = ring_seconds(
        dataclasses.replace(info, causal_mask=False), ring, cluster, inputs, fwd, bwd, "contiguous"
    )
    assert no_proof == (0.0, 0.0)  # an unknown mask: no imbalance is known


def ring_axis(built: BuiltProblem, name: str, strategy: OpStrategy) -> int | None:
    from autoshard.problem.context import ring_axis_of

    return ring_axis_of(built.infos, built.infos[name], strategy)


def test_the_ring_prices_grouped_query_kv_un_expanded_and_recomputed_hops_again() -> None:
    """llama-tiny reads K and V after repeat_kv (4 heads over 2): a hop carries half the copies' bytes, and the
    price scales with it; full recomputation re-runs the ring's forward, its exposed hops and imbalance."""
    from autoshard import zoo
    from autoshard.capture import capture
    from autoshard.problem.build import build_problem
    from autoshard.problem.context import ring_seconds
    from autoshard.problem.costs import CostOptions, Recompute, timed

    case = zoo.build("llama-tiny", batch=1, seq=64)
    cluster = autoshard.load_cluster("cpu", mesh=(4,))
    built = build_problem(capture(case.model, case.args), cluster, CostOptions(cp_layout="contiguous"))
    (name,) = [n for n, i in built.infos.items() if "scaled_dot" in i.target and i.block and i.block[0] == 0]
    info = built.infos[name]
    assert info.kv_repeats == 2
    ring = next(s for s in built.strategies[name] if ring_axis(built, name, s) == 0)
    inputs = tuple(built.infos[i] for i in info.inputs)
    copies = dataclasses.replace(info, kv_repeats=1)  # as priced before: the copies travel
    fwd, bwd = 0.0, 0.0  # no compute to hide the hops under: the price is the hops alone
    halved, whole = (ring_seconds(i, ring, cluster, inputs, fwd, bwd, "contiguous") for i in (info, copies))
    assert 0 < halved[0] < whole[0] and 0 < halved[1] < whole[1]
    # the hop's bytes are the all-gather's over n blocks: half the bytes, less than half the time (latency)
    assert halved[0] > whole[0] / 2

    def ring_cost(f: float, b: float) -> tuple[float, float]:
        return ring_seconds(info, ring, cluster, inputs, f, b, "contiguous")

    f = 1e-3
    plain = timed(info, f, (0.0, 0.0), 2.0, CostOptions(), ring_cost)
    full = timed(info, f, (0.0, 0.0), 2.0, CostOptions(recompute=Recompute.FULL), ring_cost)
    extra = ring_cost(f, 2 * f)[0]  # what the ring adds to one forward (its triangle's imbalance here)
    assert full[0] == plain[0] and full[1] == pytest.approx(plain[1] + f + extra)
