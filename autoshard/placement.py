"""Sharding vocabulary: placements per mesh axis and the spec of one tensor.

We reuse torch's public placement types (``Shard(dim)``, ``Replicate()``, ``Partial()``) and add what they lack:
a one-line notation (``S(0)``, ``R``, ``P``), parsing of that notation, an immutable per-tensor spec, and the
conversion of MindSpore-style strategy tuples to placements.

Notation: a spec on a 1-D mesh prints as its one placement (``S(0)``); on an N-D mesh as a tuple,
outermost axis first (``(S(0), R)``).  The same string appears in logs, plan JSON, DOT labels and tests.

Example::

    >>> spec = ShardingSpec.parse("(S(0), R)")
    >>> str(spec), spec.shard_count(0, (2, 4)), spec.local_shape((8, 6), (2, 4))
    ('(S(0), R)', 2, (4, 6))
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor.placement_types import Placement

from autoshard.errors import ShardingError

__all__ = [
    "Partial",
    "Placement",
    "Replicate",
    "Shard",
    "ShardingSpec",
    "format_placement",
    "from_strategy_tuple",
    "parse_placement",
]

_SHARD_RE = re.compile(r"^S\((-?\d+)\)$")


@functools.lru_cache(maxsize=1024)  # isinstance on torch placements is slow (a metaclass hook); few exist
def format_placement(p: Placement) -> str:
    """``Shard(1)`` → ``"S(1)"``, ``Replicate()`` → ``"R"``, ``Partial()`` → ``"P"`` (``"P(max)"`` if not sum)."""
    if isinstance(p, Shard):
        return f"S({p.dim})"
    if isinstance(p, Replicate):
        return "R"
    if isinstance(p, Partial):
        return "P" if p.reduce_op == "sum" else f"P({p.reduce_op})"
    raise ShardingError(f"unknown placement {p!r}: expected Shard(dim), Replicate() or Partial()")


def parse_placement(text: str) -> Placement:
    """Inverse of :func:`format_placement`; accepts ``S(0)``, ``R``, ``P`` and ``P(sum)``."""
    t = text.strip()
    m = _SHARD_RE.match(t)
    if m:
        return Shard(int(m.group(1)))
    if t == "R":
        return Replicate()
    if t in ("P", "P(sum)"):
        return Partial()
    pm = re.match(r"^P\((\w+)\)$", t)
    if pm:
        return Partial(pm.group(1))
    raise ShardingError(f"cannot parse placement {text!r}: expected 'S(<dim>)', 'R' or 'P'")


@dataclass(frozen=True, slots=True)
class ShardingSpec:
    """How one tensor lies on the mesh: one placement per mesh axis, outermost axis first.

    Several axes may shard the same dim; the earlier (outer) axis splits first, as in DTensor.
    """

    placements: tuple[Placement, ...]
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    def __hash__(self) -> int:
        # torch's placements hash in Python; specs key every cache of the planner, so hash once
        return self._hash

    def __eq__(self, other: object) -> bool:
        # Equal specs have equal hashes, so unequal hashes answer without comparing torch's placements: a
        # comparison of two placements of different types (``R == S(0)``) costs 12-16 us in torch's
        # bindings, and the redistribution planner compares specs ~10^4 times per plan
        if self is other:
            return True
        if not isinstance(other, ShardingSpec):
            return NotImplemented
        return self._hash == other._hash and self.placements == other.placements

    def __reduce__(self) -> tuple[type[ShardingSpec], tuple[tuple[Placement, ...]]]:
        # rebuild on unpickling: string hashes differ between processes, so the cached hash must too
        return (ShardingSpec, (self.placements,))

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash(self.placements))
        if not self.placements:
            raise ShardingError("a sharding spec needs one placement per mesh axis; got none")
        for p in self.placements:
            format_placement(p)  # raises on anything that is not a placement
            if isinstance(p, Shard) and p.dim < 0:
                raise ShardingError(
                    f"spec {self.placements!r} uses a negative dim; normalise dims against the tensor rank first"
                )

    # -- construction -----------------------------------------------------------------------------------------
    @classmethod
    def replicate(cls, ndim_mesh: int) -> ShardingSpec:
        return cls((Replicate(),) * ndim_mesh)

    @classmethod
    def parse(cls, text: str | Sequence[str]) -> ShardingSpec:
        """Parse ``"S(0)"``, ``"(S(0), R)"`` or a sequence of placement strings."""
        if isinstance(text, str):
            body = text.strip()
            if body.startswith("(") and body.endswith(")") and not _SHARD_RE.match(body):
                body = body[1:-1]
            parts = [s for s in re.split(r",\s*(?![^()]*\))", body) if s.strip()]
        else:
            parts = list(text)
        return cls(tuple(parse_placement(s) for s in parts))

    # -- queries ----------------------------------------------------------------------------------------------
    @property
    def mesh_ndim(self) -> int:
        return len(self.placements)

    def shard_count(self, dim: int, mesh_shape: Sequence[int]) -> int:
        """How many pieces ``dim`` is cut into over the whole mesh."""
        n = 1
        for p, size in zip(self.placements, mesh_shape, strict=True):
            if isinstance(p, Shard) and p.dim == dim:
                n *= size
        return n

    def partial_axes(self) -> tuple[int, ...]:
        return tuple(i for i, p in enumerate(self.placements) if isinstance(p, Partial))

    def is_replicated(self) -> bool:
        return all(isinstance(p, Replicate) for p in self.placements)

    def local_shape(self, shape: Sequence[int], mesh_shape: Sequence[int]) -> tuple[int, ...]:
        """Shape of the shard one device holds; raises :class:`ShardingError` when a dim does not divide."""
        self.check_fits(shape, mesh_shape)
        return tuple(size // self.shard_count(d, mesh_shape) for d, size in enumerate(shape))

    def check_fits(self, shape: Sequence[int], mesh_shape: Sequence[int], what: str = "tensor") -> None:
        if len(mesh_shape) != self.mesh_ndim:
            raise ShardingError(
                f"spec {self} has {self.mesh_ndim} placements but the mesh {tuple(mesh_shape)} has "
                f"{len(mesh_shape)} axes: give one placement per mesh axis"
            )
        for p in self.placements:
            if isinstance(p, Shard) and p.dim >= len(shape):
                raise ShardingError(
                    f"spec {self} shards dim {p.dim} of a {len(shape)}-d {what} of shape {tuple(shape)}: "
                    f"choose a dim below {len(shape)}"
                )
        for d, size in enumerate(shape):
            n = self.shard_count(d, mesh_shape)
            if size % n:
                raise ShardingError(
                    f"dim {d} of {what} {tuple(shape)} has size {size}, which does not divide into {n} shards "
                    f"under {self} on mesh {tuple(mesh_shape)}: pick a size divisible by {n} or another spec"
                )

    def __str__(self) -> str:
        body = ", ".join(format_placement(p) for p in self.placements)
        return body if self.mesh_ndim == 1 else f"({body})"

    def as_strings(self) -> tuple[str, ...]:
        """The per-axis notation, as used in ``Plan.param_placements``: ``("R", "S(1)")``."""
        return tuple(format_placement(p) for p in self.placements)


def from_strategy_tuple(splits: Iterable[int], mesh_shape: Sequence[int]) -> ShardingSpec:
    """Convert a MindSpore-style split tuple of one tensor into a spec on ``mesh_shape``.

    ``splits[d]`` is how many pieces dim ``d`` is cut into.  Mesh axes are assigned to dims outermost-first;
    each axis serves at most one dim; axes left over replicate.  For a MatMul strategy ``((2, 1), (1, 4))`` on
    mesh ``(2, 4)`` the input becomes ``(S(0), R)`` and the weight ``(R, S(1))``.
    """
    splits = tuple(int(s) for s in splits)
    if any(s < 1 for s in splits):
        raise ShardingError(f"strategy tuple {splits} has a split below 1: every entry is a piece count >= 1")
    placements: list[Placement] = [Replicate()] * len(mesh_shape)
    free = list(range(len(mesh_shape)))
    for dim, want in enumerate(splits):
        if want == 1:
            continue
        chosen = _axes_with_product(free, mesh_shape, want)
        if chosen is None:
            raise ShardingError(
                f"strategy tuple {splits}: dim {dim} split {want} ways matches no product of the free mesh axes "
                f"{[mesh_shape[a] for a in free]} of mesh {tuple(mesh_shape)}; use a mesh with an axis of size "
                f"{want} or splits that multiply to the axis sizes"
            )
        for a in chosen:
            placements[a] = Shard(dim)
            free.remove(a)
    return ShardingSpec(tuple(placements))


def _axes_with_product(free: list[int], mesh_shape: Sequence[int], want: int) -> tuple[int, ...] | None:
    """The first (outermost) run of free axes, in order, whose sizes multiply to ``want``."""
    n = len(free)
    for mask in range(1, 1 << n):
        axes = tuple(free[i] for i in range(n) if mask >> i & 1)
        prod = 1
        for a in axes:
            prod *= mesh_shape[a]
        if prod == want:
            return axes
    return None
