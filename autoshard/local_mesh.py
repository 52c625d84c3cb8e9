"""A device mesh simulated in one process: the shards every device would hold, as plain tensors.

Tests of op rules, redistribution plans and codegen use it to check numerics without processes: split a global
tensor into the per-device pieces a spec describes (``distribute``), and put pieces back together (``assemble``).
``Partial`` pieces are random addends that sum to the global value, so a rule that forgets a reduction fails.

Devices are addressed by mesh coordinates, outermost axis first; ``coords(mesh_shape)`` lists them in rank order.

Example::

    >>> import torch
    >>> spec = ShardingSpec.parse("(S(0), R)")
    >>> pieces = distribute(torch.arange(8.0).reshape(4, 2), spec, (2, 2))
    >>> pieces[(1, 0)].tolist()
    [[4.0, 5.0], [6.0, 7.0]]
    >>> assemble(pieces, spec, (2, 2)).shape
    torch.Size([4, 2])
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch

from autoshard.placement import Partial, Replicate, Shard, ShardingSpec

__all__ = ["Coord", "assemble", "coords", "distribute"]

Coord = tuple[int, ...]


def coords(mesh_shape: Sequence[int]) -> list[Coord]:
    """Every device's mesh coordinate, in rank order (last axis fastest)."""
    return list(itertools.product(*(range(n) for n in mesh_shape)))


def _slice_for(coord: Coord, spec: ShardingSpec, shape: Sequence[int], mesh_shape: Sequence[int]) -> tuple:
    # Axes that shard the same dim split it outer axis first, as DTensor does.
    index: list[slice] = [slice(None)] * len(shape)
    for dim, size in enumerate(shape):
        start, length = 0, size
        for axis, p in enumerate(spec.placements):
            if isinstance(p, Shard) and p.dim == dim:
                length //= mesh_shape[axis]
                start += coord[axis] * length
        index[dim] = slice(start, start + length)
    return tuple(index)


def distribute(
    value: torch.Tensor, spec: ShardingSpec, mesh_shape: Sequence[int], *, seed: int = 0
) -> dict[Coord, torch.Tensor]:
    """The piece of ``value`` each device holds under ``spec``.

    For each ``Partial`` axis the piece is split into random addends along that axis (they sum to the piece);
    integer and boolean tensors cannot be partial and raise ``ValueError``.
    """
    spec.check_fits(tuple(value.shape), mesh_shape)
    gen = torch.Generator().manual_seed(seed)
    # Devices that differ only along replicated axes hold the same piece: draw the addends once, on the
    # devices whose replicated coordinates are 0, and copy them along the replicated axes afterwards.
    replicated = [i for i, p in enumerate(spec.placements) if isinstance(p, Replicate)]

    def canonical(c: Coord) -> Coord:
        return tuple(0 if i in replicated else x for i, x in enumerate(c))

    owners = [c for c in coords(mesh_shape) if canonical(c) == c]
    pieces = {c: value[_slice_for(c, spec, value.shape, mesh_shape)].clone() for c in owners}
    for axis in spec.partial_axes():
        if not (value.is_floating_point() or value.is_complex()):
            raise ValueError(
                f"a {value.dtype} tensor cannot be Partial: only floating or complex tensors are summed"
            )
        for c in owners:
            if c[axis] != 0:
                continue
            group = [(*c[:axis], i, *c[axis + 1 :]) for i in range(mesh_shape[axis])]
            total = pieces[c]
            addends = [torch.randn(total.shape, generator=gen, dtype=total.dtype) for _ in group[1:]]
            pieces[group[0]] = total - sum(addends, torch.zeros_like(total))
            for member, addend in zip(group[1:], addends, strict=True):
                pieces[member] = addend
    return {c: pieces[canonical(c)].clone() for c in coords(mesh_shape)}


def assemble(
    pieces: dict[Coord, torch.Tensor], spec: ShardingSpec, mesh_shape: Sequence[int]
) -> torch.Tensor:
    """Rebuild the global tensor from every device's piece (inverse of :func:`distribute`).

    Partial axes are summed; replicated axes take the piece at index 0 of that axis (the caller checks that
    replicas agree with :func:`replicas_agree` when that matters).
    """
    mesh_shape = tuple(mesh_shape)
    current = dict(pieces)
    # Reduce partial axes first, then concatenate shards innermost-axis first.
    for axis in spec.partial_axes():
        reduced: dict[Coord, torch.Tensor] = {}
        for c in current:
            if c[axis] == 0:
                group = [(*c[:axis], i, *c[axis + 1 :]) for i in range(mesh_shape[axis])]
                reduced[c] = sum((current[g] for g in group[1:]), current[group[0]].clone())
        current = reduced
    for axis in reversed(range(len(mesh_shape))):
        p = spec.placements[axis]
        merged: dict[Coord, torch.Tensor] = {}
        for c in current:
            if c[axis] != 0:
                continue
            if isinstance(p, Shard):
                group = [(*c[:axis], i, *c[axis + 1 :]) for i in range(mesh_shape[axis])]
                merged[c] = torch.cat([current[g] for g in group], dim=p.dim)
            else:
                assert isinstance(p, Replicate | Partial)
                merged[c] = current[c]
        current = merged
    (only,) = current.values()
    return only


def replicas_agree(
    pieces: dict[Coord, torch.Tensor], spec: ShardingSpec, mesh_shape: Sequence[int], atol: float = 1e-6
) -> bool:
    """Whether devices that should hold the same piece (replicated axes) do."""
    for axis, p in enumerate(spec.placements):
        if not isinstance(p, Replicate):
            continue
        for c, piece in pieces.items():
            ref = pieces[(*c[:axis], 0, *c[axis + 1 :])]
            if not torch.allclose(piece, ref, atol=atol):
                return False
    return True
