"""The sharding vocabulary: notation, specs, MindSpore tuples, and the simulated mesh."""

from __future__ import annotations

import pickle

import pytest
import torch

from autoshard.errors import AutoshardError, ShardingError
from autoshard.local_mesh import assemble, coords, distribute, replicas_agree
from autoshard.placement import (
    Partial,
    Replicate,
    Shard,
    ShardingSpec,
    format_placement,
    from_strategy_tuple,
    parse_placement,
)


@pytest.mark.parametrize(
    ("placement", "text"), [(Shard(0), "S(0)"), (Shard(2), "S(2)"), (Replicate(), "R"), (Partial(), "P")]
)
def test_notation_round_trips(placement, text: str) -> None:
    assert format_placement(placement) == text
    assert parse_placement(text) == placement


def test_spec_notation_one_and_two_axes() -> None:
    assert str(ShardingSpec((Shard(0),))) == "S(0)"
    spec = ShardingSpec.parse("(S(0), R)")
    assert str(spec) == "(S(0), R)" and spec.as_strings() == ("S(0)", "R")
    assert ShardingSpec.parse(["R", "P"]) == ShardingSpec((Replicate(), Partial()))


def test_local_shape_and_divisibility() -> None:
    spec = ShardingSpec.parse("(S(0), S(0))")
    assert spec.shard_count(0, (2, 4)) == 8
    assert spec.local_shape((16, 3), (2, 4)) == (2, 3)
    with pytest.raises(ShardingError, match="does not divide into 8 shards"):
        spec.local_shape((12, 3), (2, 4))
    with pytest.raises(ShardingError, match="one placement per mesh axis"):
        spec.local_shape((16, 3), (8,))
    with pytest.raises(ShardingError, match="shards dim 3"):
        ShardingSpec.parse("S(3)").local_shape((4, 4), (2,))


@pytest.mark.parametrize("bad", ["S(x)", "Q", "", "S()"])
def test_bad_notation_is_a_sharding_error(bad: str) -> None:
    with pytest.raises(ShardingError) as info:
        ShardingSpec.parse(bad) if bad else ShardingSpec(())
    assert isinstance(info.value, AutoshardError)


def test_mindspore_matmul_tuple() -> None:
    # MatMul ((2, 1), (1, 4)) on 8 devices: the input's dim 0 in 2, the weight's dim 1 in 4
    assert from_strategy_tuple((2, 1), (2, 4)) == ShardingSpec.parse("(S(0), R)")
    assert from_strategy_tuple((1, 4), (2, 4)) == ShardingSpec.parse("(R, S(1))")
    assert from_strategy_tuple((8, 1), (2, 4)) == ShardingSpec.parse("(S(0), S(0))")
    assert from_strategy_tuple((1, 1), (8,)) == ShardingSpec.parse("R")
    with pytest.raises(ShardingError, match="matches no product"):
        from_strategy_tuple((3, 1), (2, 4))
    with pytest.raises(ShardingError, match="split below 1"):
        from_strategy_tuple((0, 1), (8,))


def test_specs_hash_and_pickle_consistently() -> None:
    a, b = ShardingSpec.parse("(P, S(1))"), ShardingSpec.parse(["P", "S(1)"])
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    c = pickle.loads(pickle.dumps(a))
    assert c == a and hash(c) == hash(a)
    # equality answers by the cached hash first: unequal specs, other types and the spec itself
    d = ShardingSpec.parse("(R, S(1))")
    assert a != d and a != "(P, S(1))" and a == a and len({a, b, d}) == 2


@pytest.mark.parametrize("text", ["(S(0), S(0))", "(S(1), P)", "(P, R)", "(R, P)", "(P, P)", "(R, S(1))"])
def test_simulated_mesh_round_trip(text: str) -> None:
    spec, mesh = ShardingSpec.parse(text), (2, 2)
    value = torch.randn(4, 6, dtype=torch.float64)
    pieces = distribute(value, spec, mesh, seed=3)
    assert set(pieces) == set(coords(mesh))
    assert torch.allclose(assemble(pieces, spec, mesh), value)
    assert replicas_agree(pieces, spec, mesh), "devices along a replicated axis must hold the same piece"


def test_simulated_mesh_outer_axis_splits_first() -> None:
    pieces = distribute(torch.arange(8.0), ShardingSpec.parse("(S(0), S(0))"), (2, 2))
    assert [pieces[c].tolist() for c in coords((2, 2))] == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_partial_needs_floats() -> None:
    with pytest.raises(ValueError, match="cannot be Partial"):
        distribute(torch.arange(4), ShardingSpec.parse("P"), (2,))
