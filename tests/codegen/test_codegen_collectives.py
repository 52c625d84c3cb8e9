"""The emitted collectives do exactly what the reference semantics (``apply_steps_local``) say, on real gloo
ranks, for every step kind on 1-D and 2-D meshes; and an edge's backward runs its planned steps."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from autoshard.codegen.collectives import MeshComm, format_steps, parse_steps, redistribute, run_steps
from autoshard.local_mesh import distribute
from autoshard.placement import ShardingSpec
from autoshard.redistribute import Step, plan_redistribute
from autoshard.redistribute_local import apply_steps_local
from autoshard.runtime.launch import device_mesh, launch

SHAPE = (4, 8, 4)


def test_step_text_round_trips() -> None:
    steps = (
        Step("all_gather", 0, 1, None, 64),
        Step("all_to_all", 1, 0, 2, 2048),
        Step("reduce_scatter", 0, None, 2, 4 << 20),
        Step("all_reduce", 1, None, None, 8),
        Step("local_slice", 0, None, 1, 8),
        Step("local_zero", 1, None, None, 8),
        Step("local_pad", 0, 2, None, 8),
    )
    text = format_steps(steps)
    assert text.count(";") == len(steps) - 1 and "all_to_all(axis=1, dim=0->2" in text
    back = parse_steps(text)
    assert [(s.kind, s.mesh_axis, s.src_dim, s.dst_dim) for s in back] == [
        (s.kind, s.mesh_axis, s.src_dim, s.dst_dim) for s in steps
    ]
    assert parse_steps("") == ()
    with pytest.raises(ValueError, match="cannot parse"):
        parse_steps("gather(0)")


def _specs(mesh: tuple[int, ...]) -> list[ShardingSpec]:
    one = ["R", "P", *(f"S({d})" for d in range(len(SHAPE)))]
    return [ShardingSpec.parse(list(c)) for c in itertools.product(one, repeat=len(mesh))]


def _cases(mesh: tuple[int, ...]) -> list[tuple[ShardingSpec, tuple[Step, ...]]]:
    """Every planned spec -> spec change (P targets make the planner emit local_zero / local_pad)."""
    cases = []
    for src, dst in itertools.product(_specs(mesh), repeat=2):
        try:
            cases.append((src, plan_redistribute(src, dst, SHAPE, 8, mesh)))
        except Exception:  # a spec that does not fit SHAPE on this mesh
            continue
    return cases


def _check_all(mesh: tuple[int, ...]) -> tuple[int, set[str]]:
    comm = MeshComm.from_device_mesh(device_mesh(mesh))
    value = torch.randn(SHAPE, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    kinds: set[str] = set()
    cases = _cases(mesh)
    for i, (src, steps) in enumerate(cases):
        pieces = distribute(value, src, mesh, seed=i)
        want = apply_steps_local(pieces, src, steps, mesh)[comm.coord]
        got = run_steps(pieces[comm.coord], steps, comm)
        # reductions may sum in another order than the reference: float64 rounding only
        if got.shape != want.shape or not torch.allclose(got, want, rtol=1e-12, atol=1e-12):
            raise AssertionError(f"{src} via {format_steps(steps)} differs on {comm.coord}")
        kinds.update(s.kind for s in steps)
    return len(cases), kinds


@pytest.mark.parametrize("mesh", [(2,), (4,), (2, 2)], ids=str)
def test_every_step_matches_the_reference_semantics(mesh: tuple[int, ...]) -> None:
    results = launch(_check_all, math.prod(mesh), mesh)
    count, kinds = results[0]
    assert count == (2 + len(SHAPE)) ** (2 * len(mesh))  # every (source, target) pair of specs
    assert kinds == {
        "all_gather", "all_to_all", "all_reduce", "reduce_scatter", "local_slice", "local_zero", "local_pad"
    }  # fmt: skip


def _backward_steps() -> dict[str, list[float]]:
    comm = MeshComm.from_device_mesh(device_mesh((2,)), record=True)
    rank = comm.coord[0]
    out: dict[str, list[float]] = {}
    # Megatron f: identity forward, all-reduce backward
    x = torch.full((2,), float(rank + 1), dtype=torch.float64, requires_grad=True)
    y = redistribute(x, comm, "", "all_reduce(axis=0)")
    (y * (rank + 1)).sum().backward()
    out["f_forward"], out["f_grad"] = y.tolist(), x.grad.tolist()  # type: ignore[union-attr]
    # FSDP: all-gather forward, reduce-scatter backward
    w = torch.full((2,), float(rank + 1), dtype=torch.float64, requires_grad=True)
    full = redistribute(w, comm, "all_gather(axis=0, dim=0)", "reduce_scatter(axis=0, dim=0)")
    (full * torch.arange(4.0, dtype=torch.float64)).sum().backward()
    out["fsdp_forward"], out["fsdp_grad"] = full.tolist(), w.grad.tolist()  # type: ignore[union-attr]
    out["log"] = [f"{r.phase} {r.kind} {r.nbytes}" for r in comm.log or []]  # type: ignore[misc]
    return out


def test_backward_runs_the_planned_steps() -> None:
    r0, r1 = launch(_backward_steps, 2)
    assert r0["f_forward"] == [1.0, 1.0] and r1["f_forward"] == [2.0, 2.0]  # identity
    assert r0["f_grad"] == r1["f_grad"] == [3.0, 3.0]  # 1 + 2, summed over ranks
    assert r0["fsdp_forward"] == r1["fsdp_forward"] == [1.0, 1.0, 2.0, 2.0]
    # each rank's upstream gradient is arange(4); reduce-scatter sums both and keeps its half
    assert r0["fsdp_grad"] == [0.0, 2.0] and r1["fsdp_grad"] == [4.0, 6.0]
    assert (
        r0["log"]
        == r1["log"]
        == [
            "backward all_reduce 16",
            "forward all_gather 32",
            "backward reduce_scatter 32",
        ]
    )
