"""The zigzag (load-balanced) sequence layout of context parallelism: which positions a device holds, and every
planned redistribution step on the zigzag axis run on real gloo ranks, checked against the global tensor."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch import fx

from autoshard.codegen.collectives import MeshComm, format_steps, run_steps
from autoshard.codegen.shard import gather_full, local_piece
from autoshard.errors import ShardingError
from autoshard.placement import ShardingSpec
from autoshard.redistribute import plan_redistribute
from autoshard.runtime.launch import device_mesh, launch
from autoshard.strategies import registry
from autoshard.strategies.local import shard_intervals, shard_range

SHAPE = (8, 8)  # 2n = 8 chunks of one row on 4 ranks


@pytest.mark.parametrize(
    ("spec", "mesh", "coord", "zigzag", "runs"),
    [
        ("(S(0),)", (4,), (1,), None, ((4, 4),)),
        ("(S(0),)", (4,), (1,), 0, ((2, 2), (12, 2))),  # chunks 1 and 6 of 8
        ("(S(0),)", (4,), (3,), 0, ((6, 2), (8, 2))),  # chunks 3 and 4: the middle pair
        (
            "(S(0), S(0))",
            (2, 2),
            (1, 0),
            0,
            ((4, 4),),
        ),  # axis 0 keeps chunks 1, 2 of 4; axis 1 the first half
        ("(S(0), S(0))", (2, 2), (1, 1), 0, ((8, 4),)),
        ("(S(0), S(0))", (2, 2), (0, 1), 1, ((2, 2), (4, 2))),  # inner zigzag cuts the outer block 0..8
        ("(R, S(0))", (2, 2), (1, 0), 0, ((0, 8),)),  # the zigzag axis does not split this dim
    ],
)
def test_a_device_holds_the_zigzag_chunks(spec, mesh, coord, zigzag, runs) -> None:  # type: ignore[no-untyped-def]
    assert shard_intervals(ShardingSpec.parse(spec), 0, 16, mesh, coord, zigzag) == runs


def test_ops_that_need_one_run_refuse_a_zigzag_piece() -> None:
    with pytest.raises(ShardingError, match=r"zigzag layout on mesh axis 0.*cp_layout='contiguous'"):
        shard_range(ShardingSpec.parse("(S(0),)"), 0, 16, (4,), (1,), 0)


def test_local_piece_is_chunks_k_and_2n_minus_1_minus_k() -> None:
    whole = torch.arange(16)
    pieces = [local_piece(whole, ShardingSpec.parse("(S(0),)"), (4,), (k,), 0) for k in range(4)]
    assert [p.tolist() for p in pieces] == [[0, 1, 14, 15], [2, 3, 12, 13], [4, 5, 10, 11], [6, 7, 8, 9]]


def test_arange_split_on_the_zigzag_axis_gives_its_global_positions() -> None:
    graph = fx.Graph()
    node = graph.call_function(torch.ops.aten.arange.default, (16,), {"device": torch.device("cpu")})
    node.meta["val"] = torch.empty(16, dtype=torch.int64, device="meta")
    (split,) = [s for s in registry.strategies_for(node, (4,)) if str(s) == "-> S(0)"]
    for k, want in enumerate(([0, 1, 14, 15], [2, 3, 12, 13], [4, 5, 10, 11], [6, 7, 8, 9])):
        call = registry.local_call(node, split, (4,), (k,), (16,), dict(node.kwargs), zigzag_axis=0)
        assert call.run().tolist() == want
    plain = registry.local_call(node, split, (4,), (1,), (16,), dict(node.kwargs))
    assert plain.run().tolist() == [4, 5, 6, 7]


def _specs(mesh: tuple[int, ...]) -> list[ShardingSpec]:
    one = ["R", *(f"S({d})" for d in range(len(SHAPE)))]
    return [ShardingSpec.parse(list(c)) for c in itertools.product(one, repeat=len(mesh))]


def _check_all(mesh: tuple[int, ...], zigzag: int) -> set[str]:
    comm = MeshComm.from_device_mesh(device_mesh(mesh))
    comm.zigzag_axis = zigzag
    value = torch.randn(SHAPE, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    kinds: set[str] = set()
    for src, dst in itertools.product(_specs(mesh), repeat=2):
        steps = plan_redistribute(src, dst, SHAPE, 8, mesh)
        got = run_steps(local_piece(value, src, mesh, comm.coord, zigzag), steps, comm)
        want = local_piece(value, dst, mesh, comm.coord, zigzag)
        if not torch.equal(got, want):
            raise AssertionError(f"{src} -> {dst} via {format_steps(steps)} differs on {comm.coord}")
        kinds.update(s.kind for s in steps if s.mesh_axis == zigzag)
    for spec in _specs(mesh):  # back to the whole tensor: what gather_outputs / full_state_dict run
        if not torch.equal(
            gather_full(local_piece(value, spec, mesh, comm.coord, zigzag), spec, SHAPE, comm), value
        ):
            raise AssertionError(f"gathering {spec} does not restore the global order on {comm.coord}")
    return kinds


@pytest.mark.slow
@pytest.mark.parametrize(("mesh", "zigzag"), [((4,), 0), ((2, 2), 0), ((2, 2), 1)], ids=str)
def test_every_step_on_the_zigzag_axis_keeps_the_layout(mesh: tuple[int, ...], zigzag: int) -> None:
    kinds = launch(_check_all, math.prod(mesh), mesh, zigzag)[0]
    assert {"all_gather", "all_to_all", "local_slice"} <= kinds


def _reduce_and_pad() -> tuple[torch.Tensor, torch.Tensor]:
    comm = MeshComm.from_device_mesh(device_mesh((4,)))
    comm.zigzag_axis = 0
    value = torch.arange(64, dtype=torch.float64).reshape(8, 8)
    spec = ShardingSpec.parse("(S(1),)")
    (scatter,) = plan_redistribute(ShardingSpec.parse("(P,)"), spec, SHAPE, 8, (4,))
    summed = run_steps(value, (scatter,), comm)  # every rank's P piece is the whole value
    (pad,) = plan_redistribute(spec, ShardingSpec.parse("(P,)"), SHAPE, 8, (4,))
    padded = run_steps(local_piece(value, spec, (4,), comm.coord, 0), (pad,), comm)
    torch.distributed.all_reduce(padded)
    return summed - 4 * local_piece(value, spec, (4,), comm.coord, 0), padded - value


@pytest.mark.slow
def test_reduce_scatter_and_pad_on_the_zigzag_axis() -> None:
    for diff_scatter, diff_pad in launch(_reduce_and_pad, 4):
        assert not diff_scatter.any() and not diff_pad.any()


def test_the_layout_is_torchs_head_tail_load_balancer() -> None:
    """torch's own context parallelism (``context_parallel``, which fails on CPU: no sharding strategy for the
    CPU flash kernel) balances causal work with the same permutation: cross-check against its private one."""
    balancer = pytest.importorskip("torch.distributed.tensor.experimental._context_parallel._load_balancer")
    torch_order = balancer._HeadTailLoadBalancer(16, 4, "cpu")._generate_indices()[0]
    ours = [local_piece(torch.arange(16), ShardingSpec.parse("(S(0),)"), (4,), (k,), 0) for k in range(4)]
    assert torch.cat(ours).tolist() == torch_order.tolist()


def test_dropout_draws_the_single_device_mask_in_the_zigzag_layout() -> None:
    from autoshard.runtime.rng import seeded_dropout

    x, spec = torch.ones(2, 16), "(S(1),)"
    torch.manual_seed(0)
    whole = seeded_dropout(x, 0.5, True, "(R,)", (4,), (0,))
    for k in range(4):
        torch.manual_seed(0)
        piece = seeded_dropout(x[:, :4], 0.5, True, spec, (4,), (k,), 0)
        assert torch.equal(piece, local_piece(whole, ShardingSpec.parse(spec), (4,), (k,), 0))
