"""The move set of redistribution: what one step on one mesh axis does, and which layouts it connects.

:mod:`autoshard.redistribute` searches these moves for the cheapest sequence, :mod:`autoshard.problem.pricing`
prices whole tables over them, and :mod:`autoshard.redistribute_local` executes them on the simulated mesh:
all three read the moves from :func:`_moves` / :func:`_transition` here, so there is one description.

**Steps.**  One step changes the placement of one mesh axis ``a`` of size ``n``:

===========  ==================  ==========================================================================
from → to    kind                what every device of the axis group does
===========  ==================  ==========================================================================
S(d) → R     ``all_gather``      gather the pieces, concatenate them along ``d`` (``src_dim=d``)
R → S(d)     ``local_slice``     keep chunk ``coord[a]`` of ``n`` along ``d`` (``dst_dim=d``); no traffic
S(i) → S(j)  ``all_to_all``      split along ``j``, send chunk k to member k, concatenate along ``i``
P → R        ``all_reduce``      sum over the group
P → S(d)     ``reduce_scatter``  sum over the group, keep chunk ``coord[a]`` along ``d``
R → P        ``local_zero``      index 0 of the axis keeps the value, the others hold zeros; no traffic
S(d) → P     ``local_pad``       zero-pad ``n``× along ``d``, own block at ``coord[a]``; no traffic
===========  ==================  ==========================================================================

``Step.nbytes`` is ``S`` of the nccl-tests convention for that group's collective: the larger of the bytes one
device holds for this tensor before and after the step, i.e. the buffer unsharded over this axis.  That is the
gathered output for ``all_gather``, the input for ``reduce_scatter``, and the (unchanged) buffer for
``all_reduce`` and ``all_to_all``.  For local steps it is the same rule (what ``local_pad`` allocates).

``R → P`` keeps the value on index 0 rather than dividing by ``n``: it is exact for every dtype and leaves no
rounding.  ``S → P`` (zero-padding) moves no bytes but costs ``n``× memory; it is only chosen when the target
asks for ``P`` on that axis, never as an intermediate (a reduction of the padded buffer moves ``n``× the bytes
of the gather or all-to-all that does the same job).  Only sum-partials are supported.

**Nesting.**  When several axes shard dim ``d`` (outer axis first), a device's block index along ``d`` is a
mixed-radix number whose digits are those axes' coordinates, outermost most significant.  The group of
axis ``a`` holds *adjacent* blocks only when ``a`` is the innermost axis sharding ``d``.  Hence every step
that takes ``a`` off a dim (gather, the source side of an all-to-all, pad) or puts ``a`` on a dim (slice,
reduce-scatter, the target side of an all-to-all) requires that no axis inner to ``a`` shards that dim.
A change that breaks this, e.g. ``(S(0), S(0)) → (R, S(0))``, must first move the inner shard out of the
way and back.

A **layout** is one int per mesh axis: a tensor dim ``d >= 0`` for ``S(d)``, ``_R`` or ``_P`` (axes of size 1
carry ``_R``).  :func:`_moves` lists the steps out of a layout towards the placements ``targets`` allows per
axis; :func:`_targets` is the search's rule (``P`` only on axes where the goal has it).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal, get_args

from autoshard.placement import Partial, Placement, Replicate, Shard, ShardingSpec

__all__ = ["COLLECTIVE_KINDS", "Step", "StepKind"]

StepKind = Literal[
    "all_gather", "all_to_all", "all_reduce", "reduce_scatter", "local_slice", "local_zero", "local_pad"
]
COLLECTIVE_KINDS: frozenset[StepKind] = frozenset(
    {"all_gather", "all_to_all", "all_reduce", "reduce_scatter"}
)

# (needs src_dim, needs dst_dim) per kind; the dims a step names are exactly these.
_DIMS: dict[StepKind, tuple[bool, bool]] = {
    "all_gather": (True, False),
    "all_to_all": (True, True),
    "all_reduce": (False, False),
    "reduce_scatter": (False, True),
    "local_slice": (False, True),
    "local_zero": (False, False),
    "local_pad": (True, False),
}


@dataclass(frozen=True, slots=True)
class Step:
    """One collective (or local op) on the process group of ``mesh_axis``; see the module docstring."""

    kind: StepKind
    mesh_axis: int
    src_dim: int | None  # dim gathered / padded / concatenated by all_to_all
    dst_dim: int | None  # dim sliced / scattered / split by all_to_all
    nbytes: int  # nccl-tests S: max(bytes per device before, after) = the buffer unsharded over this axis

    def __post_init__(self) -> None:
        if self.kind not in _DIMS:
            raise ValueError(f"unknown step kind {self.kind!r}: expected one of {get_args(StepKind)}")
        if self.mesh_axis < 0 or self.nbytes < 0:
            raise ValueError(f"step {self.kind} needs mesh_axis >= 0 and nbytes >= 0, got {self}")
        needs_src, needs_dst = _DIMS[self.kind]
        if (self.src_dim is not None) != needs_src or (self.dst_dim is not None) != needs_dst:
            raise ValueError(
                f"step {self.kind} takes src_dim={'a dim' if needs_src else 'None'} and "
                f"dst_dim={'a dim' if needs_dst else 'None'}; "
                f"got src_dim={self.src_dim}, dst_dim={self.dst_dim}"
            )

    @property
    def is_collective(self) -> bool:
        return self.kind in COLLECTIVE_KINDS

    def __str__(self) -> str:
        if self.src_dim is not None and self.dst_dim is not None:
            dims = f", dim={self.src_dim}->{self.dst_dim}"
        elif self.src_dim is not None or self.dst_dim is not None:
            dims = f", dim={self.src_dim if self.src_dim is not None else self.dst_dim}"
        else:
            dims = ""
        return f"{self.kind}(axis={self.mesh_axis}{dims}, {_format_bytes(self.nbytes)})"


def _format_bytes(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    raise AssertionError("unreachable")


# -- layouts -------------------------------------------------------------------------------------------------
# A layout is one int per mesh axis: a tensor dim d >= 0 for S(d), _R or _P.
_R, _P = -1, -2
_Layout = tuple[int, ...]


def _encode(spec: ShardingSpec, mesh_shape: tuple[int, ...]) -> _Layout:
    def code(p: Placement, n: int) -> int:
        if n == 1 or isinstance(p, Replicate):
            return _R
        return p.dim if isinstance(p, Shard) else _P

    return tuple(code(p, n) for p, n in zip(spec.placements, mesh_shape, strict=True))


def _with(layout: _Layout, axis: int, value: int) -> _Layout:
    return (*layout[:axis], value, *layout[axis + 1 :])


def _local_shape(layout: _Layout, shape: tuple[int, ...], mesh_shape: tuple[int, ...]) -> tuple[int, ...]:
    local = list(shape)
    for p, n in zip(layout, mesh_shape, strict=True):
        if p >= 0:
            local[p] //= n
    return tuple(local)


# The step kind for a change of one axis' placement, by (from, to) with every S(d) written as 0.
_KIND: dict[tuple[int, int], StepKind] = {
    (0, _R): "all_gather",
    (0, 0): "all_to_all",
    (0, _P): "local_pad",
    (_R, 0): "local_slice",
    (_R, _P): "local_zero",
    (_P, _R): "all_reduce",
    (_P, 0): "reduce_scatter",
}
_Move = tuple[StepKind, int | None, int | None, int]  # a Step's fields but its axis; built lazily for speed


def _transition(
    layout: _Layout, axis: int, target: int, local: Sequence[int], itemsize: int, mesh_shape: tuple[int, ...]
) -> _Move | None:
    """The step that sets ``axis`` to ``target`` in ``layout`` (device piece ``local``); None if invalid."""
    cur, n = layout[axis], mesh_shape[axis]
    inner = layout[axis + 1 :]
    # Only the innermost axis on a dim may leave it or join it (see "Nesting" in the module docstring).
    if (cur >= 0 and cur in inner) or (target >= 0 and (target in inner or local[target] % n)):
        return None
    kind = _KIND[min(cur, 0), min(target, 0)]
    nbytes = math.prod(local) * itemsize * (n if kind in ("all_gather", "local_pad") else 1)
    return kind, (cur if cur >= 0 else None), (target if target >= 0 else None), nbytes


def _moves(
    layout: _Layout,
    shape: tuple[int, ...],
    itemsize: int,
    mesh_shape: tuple[int, ...],
    targets: tuple[tuple[int, ...], ...],
) -> Iterator[tuple[int, _Move, _Layout]]:
    local = _local_shape(layout, shape, mesh_shape)
    for axis, axis_targets in enumerate(targets):
        for target in axis_targets:
            if target == layout[axis]:
                continue
            move = _transition(layout, axis, target, local, itemsize, mesh_shape)
            if move is not None:
                yield axis, move, _with(layout, axis, target)


def _targets(goal: _Layout, ndim: int, mesh_shape: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """The placements the search may give each axis: any, but ``P`` only where the goal has it.

    Entering ``P`` is free, but an axis that must end otherwise then needs a reduction, which moves at least
    the bytes of the gather or all-to-all it would replace.  Axes of size 1 carry no layout.
    """
    out = []
    for g, n in zip(goal, mesh_shape, strict=True):
        out.append(() if n == 1 else (_R, *range(ndim), *((_P,) if g == _P else ())))
    return tuple(out)


@lru_cache(maxsize=1 << 12)
def _non_sum_partial(spec: ShardingSpec) -> Placement | None:
    return next((p for p in spec.placements if isinstance(p, Partial) and p.reduce_op != "sum"), None)


@lru_cache(maxsize=1 << 12)
def _layout(spec: ShardingSpec, shape: tuple[int, ...], mesh_shape: tuple[int, ...], role: str) -> _Layout:
    """``spec`` encoded for the search, after checking that it fits the tensor and the mesh."""
    spec.check_fits(shape, mesh_shape, what=f"{role} tensor")
    return _encode(spec, mesh_shape)
