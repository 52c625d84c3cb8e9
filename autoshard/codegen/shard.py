"""One device's piece of a global tensor, and the global tensor back from the pieces of all devices.

Input: a tensor, its :class:`~autoshard.placement.ShardingSpec`, the mesh and a device's coordinate.
Output: the piece that device holds (``local_piece``: a copy, contiguous), or, run on every rank together,
the whole tensor (``gather_full``: the all-gathers :func:`~autoshard.redistribute.plan_redistribute` plans from
the spec to fully replicated).  Axes that shard the same dim split it outer axis first, as everywhere in
autoshard (:mod:`autoshard.local_mesh`).  ``Partial`` pieces cannot be cut out of a whole tensor: parameters,
inputs and gathered outputs are never Partial.

Example::

    spec = ShardingSpec.parse("(S(0), S(1))")
    local_piece(torch.arange(16.).reshape(4, 4), spec, (2, 2), (1, 0))    # rows 2..3, columns 0..1
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from autoshard.codegen.collectives import MeshComm, run_steps
from autoshard.errors import ShardingError, UnsupportedOpError
from autoshard.placement import Replicate, ShardingSpec
from autoshard.redistribute import plan_redistribute
from autoshard.strategies.local import shard_intervals

__all__ = ["contiguous_only", "gather_full", "local_piece", "spec_of"]


def spec_of(placements: Sequence[str]) -> ShardingSpec:
    """The spec of a plan's placement strings, ``("S(0)", "R")``."""
    return ShardingSpec.parse(tuple(placements))


def local_piece(
    tensor: torch.Tensor,
    spec: ShardingSpec,
    mesh_shape: Sequence[int],
    coord: Sequence[int],
    zigzag_axis: int | None = None,
) -> torch.Tensor:
    """The piece of ``tensor`` that device ``coord`` holds under ``spec`` (a contiguous copy); splits on
    ``zigzag_axis`` keep two chunks of ``2n`` (:func:`~autoshard.strategies.local.shard_intervals`)."""
    if spec.partial_axes():
        raise ShardingError(f"cannot cut a Partial piece ({spec}) out of a whole tensor: use R or S(d)")
    spec.check_fits(tuple(tensor.shape), mesh_shape)
    piece = tensor
    for dim in range(tensor.dim()):
        runs = shard_intervals(spec, dim, int(tensor.shape[dim]), mesh_shape, coord, zigzag_axis)
        if len(runs) == 1 and runs[0] != (0, tensor.shape[dim]):
            piece = piece.narrow(dim, *runs[0])
        elif len(runs) > 1:  # the zigzag layout: two runs, in local order
            piece = torch.cat([piece.narrow(dim, start, length) for start, length in runs], dim=dim)
    return piece.detach().clone(memory_format=torch.contiguous_format)


def contiguous_only(name: str, spec: ShardingSpec, zigzag_axis: int | None) -> None:
    """Refuse a piece cut by code that knows only contiguous blocks (a weight source reading a checkpoint)
    when ``spec`` splits on the zigzag axis of context parallelism."""
    if zigzag_axis is not None and not isinstance(spec.placements[zigzag_axis], Replicate):
        raise UnsupportedOpError(
            f"{name} is split ({spec}) on mesh axis {zigzag_axis}, which uses the zigzag layout, and this source "
            "cuts contiguous pieces: build the model on the CPU, or plan with cp_layout='contiguous'"
        )


def gather_full(
    local: torch.Tensor, spec: ShardingSpec, global_shape: Sequence[int], comm: MeshComm
) -> torch.Tensor:
    """The whole tensor on every rank from each rank's piece under ``spec`` (a collective: all ranks call it).

    Always a new tensor, never a view of ``local`` (a checkpoint must not change when training goes on).
    """
    replicated = ShardingSpec.replicate(spec.mesh_ndim)
    steps = plan_redistribute(spec, replicated, global_shape, local.element_size(), comm.mesh_shape)
    with torch.no_grad():
        if not any(s.is_collective for s in steps):
            return local.detach().clone()
        return run_steps(local.detach(), steps, comm, "gather")
