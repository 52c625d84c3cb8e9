"""Redistribution plans: the step chosen for each change, orders that save bytes, costs, and errors.

Numeric correctness over every spec pair lives in ``test_redistribute_numeric.py``.
"""

from __future__ import annotations

import doctest
import functools
import itertools

import pytest
import torch
from test_redistribute_numeric import check_pair

import autoshard.redistribute as rd
from autoshard.cluster import Cluster, load_cluster
from autoshard.errors import ShardingError
from autoshard.local_mesh import distribute
from autoshard.placement import Partial, ShardingSpec
from autoshard.redistribute import (
    Step,
    count_kinds,
    plan_redistribute,
    redistribute_time,
)
from autoshard.redistribute_local import apply_steps_local

SPEC = ShardingSpec.parse


@functools.lru_cache
def two_nodes() -> Cluster:
    """2 nodes of 8 A100s, mesh (2, 8): axis 0 crosses nodes, axis 1 stays on NVLink."""
    return load_cluster("a100x8", nodes=2, mesh=(2, 8))


def _time(steps: tuple[Step, ...], cluster: Cluster) -> float:
    return sum(cluster.collective_time(s.kind, s.nbytes, axis=s.mesh_axis) for s in steps)


def _one(src: str, dst: str, shape: tuple[int, ...] = (8, 8), mesh: tuple[int, ...] = (4,)) -> list[str]:
    return [str(s) for s in plan_redistribute(SPEC(src), SPEC(dst), shape, 4, mesh)]


def _volume(steps: tuple[Step, ...], mesh: tuple[int, ...]) -> float:
    """Ring volume of a plan (the search's default price)."""
    n = [mesh[s.mesh_axis] for s in steps]
    return sum(
        (2 if s.kind == "all_reduce" else 1) * (k - 1) / k * s.nbytes
        for s, k in zip(steps, n, strict=True)
        if s.is_collective
    )


# -- one axis: one step per change, with nbytes in the nccl-tests convention (S = 8*8*4 = 256 B) -------------
@pytest.mark.parametrize(
    ("src", "dst", "step"),
    [
        ("S(0)", "R", "all_gather(axis=0, dim=0, 256 B)"),
        ("R", "S(1)", "local_slice(axis=0, dim=1, 256 B)"),
        ("S(0)", "S(1)", "all_to_all(axis=0, dim=0->1, 64 B)"),
        ("P", "R", "all_reduce(axis=0, 256 B)"),
        ("P", "S(0)", "reduce_scatter(axis=0, dim=0, 256 B)"),
        ("R", "P", "local_zero(axis=0, 256 B)"),
        ("S(1)", "P", "local_pad(axis=0, dim=1, 256 B)"),
    ],
)
def test_each_change_on_one_axis_is_one_step(src: str, dst: str, step: str) -> None:
    assert _one(src, dst) == [step]


def test_nothing_to_do_gives_no_steps() -> None:
    assert _one("(S(0), P)", "(S(0), P)", mesh=(2, 2)) == []
    # A size-1 axis carries no layout: its placement may change for free.
    assert _one("(S(0), S(1))", "(P, S(1))", mesh=(1, 4)) == []
    assert _one("(R, S(1))", "(S(1), S(1))", mesh=(1, 4)) == []


def test_step_prints_and_validates() -> None:
    assert str(Step("all_gather", 1, 0, None, 4 << 20)) == "all_gather(axis=1, dim=0, 4.0 MiB)"
    assert str(Step("all_reduce", 0, None, None, 3 << 10)) == "all_reduce(axis=0, 3.0 KiB)"
    assert (
        Step("all_to_all", 0, 0, 1, 8).is_collective
        and not Step("local_zero", 0, None, None, 8).is_collective
    )
    with pytest.raises(ValueError, match="all_gather takes src_dim=a dim"):
        Step("all_gather", 0, None, 0, 8)
    with pytest.raises(ValueError, match="unknown step kind"):
        Step("broadcast", 0, None, None, 8)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="mesh_axis >= 0"):
        Step("all_reduce", -1, None, None, 8)


def test_count_kinds() -> None:
    steps = plan_redistribute(SPEC("(S(0), S(0))"), SPEC("(R, S(0))"), (8, 8), 4, (2, 2))
    assert count_kinds(steps) == {"all_to_all": 2, "all_gather": 1}


# -- nesting: several axes on one dim ------------------------------------------------------------------------
def test_gathering_the_inner_of_two_axes_on_a_dim_is_one_step() -> None:
    assert _one("(S(0), S(0))", "(S(0), R)", mesh=(2, 2)) == ["all_gather(axis=1, dim=0, 128 B)"]


def test_changing_the_outer_of_two_axes_on_a_dim_moves_the_inner_out_of_the_way() -> None:
    src, dst, mesh = SPEC("(S(0), S(0))"), SPEC("(R, S(0))"), (2, 2)
    steps = plan_redistribute(src, dst, (8, 8), 4, mesh)
    assert [str(s) for s in steps] == [
        "all_to_all(axis=1, dim=0->1, 64 B)",
        "all_gather(axis=0, dim=0, 128 B)",
        "all_to_all(axis=1, dim=1->0, 128 B)",
    ]
    # Cheaper than gathering inner then outer and slicing again (DTensor's greedy order), and no device ever
    # holds more than half the tensor.
    greedy = (Step("all_gather", 1, 0, None, 128), Step("all_gather", 0, 0, None, 256))  # + a free slice
    assert _volume(steps, mesh) < _volume(greedy, mesh)
    assert max(s.nbytes for s in steps) == 128


# -- orders that save bytes ----------------------------------------------------------------------------------
def test_slices_come_before_reductions() -> None:
    assert _one("(R, P)", "(S(0), R)", mesh=(2, 2)) == [
        "local_slice(axis=0, dim=0, 256 B)",
        "all_reduce(axis=1, 128 B)",
    ]
    assert _one("(P, R)", "(S(0), S(1))", mesh=(2, 2)) == [
        "local_slice(axis=1, dim=1, 256 B)",
        "reduce_scatter(axis=0, dim=0, 128 B)",
    ]


def test_partial_on_two_axes_reduces_hierarchically() -> None:
    # Reduce-scatter on the inner (fast) axis, all-reduce 1/8 of the bytes on the outer, all-gather inside.
    assert _one("(P, P)", "(R, R)", shape=(16, 8), mesh=(2, 8)) == [
        "reduce_scatter(axis=1, dim=0, 512 B)",
        "all_reduce(axis=0, 64 B)",
        "all_gather(axis=1, dim=0, 512 B)",
    ]


def test_partial_axes_reduce_only_once() -> None:
    steps = plan_redistribute(SPEC("(P, S(0))"), SPEC("(R, S(1))"), (8, 8), 4, (2, 2))
    assert count_kinds(steps) == {"all_to_all": 1, "all_reduce": 1}
    assert next(s for s in steps if s.kind == "all_reduce").nbytes == 128  # the half a device holds


def test_plans_are_deterministic() -> None:
    args = (SPEC("(S(0), P, S(1))"), SPEC("(S(1), S(0), R)"), (8, 8, 4), 2, (2, 2, 2))
    first = plan_redistribute(*args)
    for cache in (rd._plan_cached, rd._shortest_tree, rd._edge_table, rd._layout):
        cache.cache_clear()
    assert plan_redistribute(*args) == first


# -- costs on a cluster --------------------------------------------------------------------------------------
def test_cost_relations_on_a_two_node_cluster() -> None:
    cluster = two_nodes()
    shape, item = (4096, 4096), 2

    def t(src: str, dst: str) -> float:
        return redistribute_time(SPEC(src), SPEC(dst), shape, item, cluster)

    assert t("(R, P)", "(R, R)") == pytest.approx(
        t("(R, P)", "(R, S(0))") + t("(R, S(0))", "(R, R)"), rel=0.03
    )
    assert t("(S(0), R)", "(R, R)") > t("(R, S(0))", "(R, R)")  # inter-node gather dearer than intra-node
    assert t("(R, R)", "(S(0), S(1))") == 0.0
    assert t("(S(0), P)", "(S(0), P)") == 0.0
    assert t("(P, P)", "(R, R)") < t("(P, R)", "(R, R)") + t("(R, P)", "(R, R)")  # hierarchical pays


def test_cluster_prices_choose_the_plan() -> None:
    """Priced by the cluster, no plan chosen by volume alone is faster; and the choice does change: on a real
    two-node cluster the volume-optimal detour over the slow axis loses to one NVLink all-reduce."""
    cluster, shape, item = two_nodes(), (4096, 4096), 2
    choices = ["R", "P", "S(0)", "S(1)"]
    differ = 0
    for a, b, c, d in itertools.product(choices, repeat=4):
        src, dst = SPEC(f"({a}, {b})"), SPEC(f"({c}, {d})")
        priced = plan_redistribute(src, dst, shape, item, cluster.mesh_shape, cluster=cluster)
        by_volume = plan_redistribute(src, dst, shape, item, cluster.mesh_shape)
        assert _time(priced, cluster) <= _time(by_volume, cluster) * (1 + 1e-9), f"{src} -> {dst}"
        assert redistribute_time(src, dst, shape, item, cluster) == pytest.approx(_time(priced, cluster))
        differ += priced != by_volume
    assert differ > 0
    src, dst = SPEC("(R, P)"), SPEC("(R, R)")
    assert [str(s) for s in plan_redistribute(src, dst, shape, item, (2, 8), cluster=cluster)] == [
        "all_reduce(axis=1, 32.0 MiB)"
    ]
    assert len(plan_redistribute(src, dst, shape, item, (2, 8))) == 4  # less volume, but over axis 0


def test_cluster_priced_plans_execute_correctly() -> None:
    cluster, shape = two_nodes(), (64, 32)
    specs = [SPEC(f"({a}, {b})") for a, b in itertools.product(["R", "P", "S(0)", "S(1)"], repeat=2)]
    for src, dst in itertools.product(specs, specs):
        check_pair(src, dst, shape, cluster.mesh_shape, cluster)


# -- errors --------------------------------------------------------------------------------------------------
def test_bad_requests_raise_sharding_errors() -> None:
    with pytest.raises(ShardingError, match="2 placements but the mesh"):
        plan_redistribute(SPEC("(S(0), R)"), SPEC("(R, R)"), (8, 8), 4, (4,))
    with pytest.raises(ShardingError, match="does not divide"):
        plan_redistribute(SPEC("S(0)"), SPEC("R"), (6, 8), 4, (4,))
    with pytest.raises(ShardingError, match="target tensor"):
        plan_redistribute(SPEC("R"), SPEC("S(2)"), (8, 8), 4, (4,))
    with pytest.raises(ShardingError, match="only sum-partials"):
        plan_redistribute(ShardingSpec((Partial("max"),)), SPEC("R"), (8, 8), 4, (4,))
    with pytest.raises(ShardingError, match="itemsize"):
        plan_redistribute(SPEC("R"), SPEC("S(0)"), (8, 8), 0, (4,))
    assert (
        plan_redistribute(ShardingSpec((Partial("max"),)), ShardingSpec((Partial("max"),)), (8,), 4, (4,))
        == ()
    )


def test_apply_rejects_steps_that_do_not_fit_the_layout() -> None:
    x = torch.randn(8, 8)
    src = SPEC("(S(0), S(0))")
    pieces = distribute(x, src, (2, 2))
    with pytest.raises(ShardingError, match=r"step 0 .* does not apply to layout \(S\(0\), S\(0\)\)"):
        apply_steps_local(pieces, src, [Step("all_gather", 0, 0, None, 128)], (2, 2))
    with pytest.raises(ShardingError, match="one tensor per device"):
        apply_steps_local(pieces, src, [], (4,))


def test_integer_tensors_cannot_become_partial() -> None:
    x = torch.arange(16).reshape(4, 4)
    src = SPEC("S(0)")
    steps = plan_redistribute(src, SPEC("P"), (4, 4), 8, (2,))
    with pytest.raises(ShardingError, match="only floats are summed"):
        apply_steps_local(distribute(x, src, (2,)), src, steps, (2,))
    # Integer tensors move freely otherwise.
    out = apply_steps_local(
        distribute(x, src, (2,)), src, plan_redistribute(src, SPEC("S(1)"), (4, 4), 8, (2,)), (2,)
    )
    assert torch.equal(out[(1,)], x[:, 2:])


def test_module_docstring_example_runs() -> None:
    assert doctest.testmod(rd, raise_on_error=True).attempted > 0
