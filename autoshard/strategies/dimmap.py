"""Dim maps: an op written once, einsum-style, for ONE mesh axis; strategies follow from it.

A dim map gives every dim of every operand and output a loop letter, e.g. ``mm`` is ``"mk,kn->mn"``.  What
one mesh axis may do then follows mechanically (:meth:`DimMap.choices`):

- **replicate** everything;
- **split a letter**: each operand that has it is ``S(<its dim>)``, the others ``R``; an output that has it is
  ``S(<its dim>)``; if no output has it (the op sums over it, like ``k`` in ``mm``) the outputs are ``P``;
- **pass Partial through** for ops linear in some inputs: each group in ``linear_in`` may be ``P`` together
  (other inputs ``R``) and the outputs are then ``P`` (``mm``: ``({0}, {1})`` -- linear in each operand
  alone; ``add``: ``({0, 1},)`` -- linear in both together).

Letters in ``unsplittable`` are never split (a softmax dim, a dim reduced by ``max``, the key length of
attention).  A letter that appears only in outputs is split only when listed in ``free_out``: the op then
computes its slice locally from replicated inputs (``arange``, ``expand``), which needs a ``local_args`` hook
to localise sizes.  ``1`` in a parsed map marks a dim with no letter (size 1 or broadcast): it stays whole.

Example::

    >>> [str(c) for c in DimMap.parse("mk,kn->mn", linear_in=({0}, {1})).choices()]
    ['R, R -> R', 'S(0), R -> S(0)', 'R, S(1) -> S(1)', 'S(1), S(0) -> P', 'P, R -> P', 'R, P -> P']
"""

from __future__ import annotations

import string
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from torch import fx

from autoshard.placement import Partial, Placement, Replicate, Shard
from autoshard.strategies.strategy import AxisChoice, OpStrategy, expand, tensor_meta

__all__ = ["DimMap", "Letters", "broadcast_letters", "fresh_letters", "strategies_from_map"]

Letters = tuple[str | None, ...]
"""One letter per dim of a tensor; ``None`` for a dim that carries no loop letter."""

_ALPHABET = string.ascii_lowercase + string.ascii_uppercase


def fresh_letters(n: int, avoid: Iterable[str] = ()) -> list[str]:
    """``n`` distinct letters not in ``avoid``, in alphabetical order."""
    taken = set(avoid)
    out = [c for c in _ALPHABET if c not in taken][:n]
    if len(out) < n:
        raise ValueError(f"a dim map needs {n} fresh letters; only {len(out)} are left")
    return out


@dataclass(frozen=True, slots=True)
class DimMap:
    """Loop letters per operand role and output, and which letters may be split how (see module doc)."""

    inputs: tuple[Letters | None, ...]
    outputs: tuple[Letters | None, ...]
    unsplittable: frozenset[str] = field(default_factory=frozenset)
    free_out: frozenset[str] = field(default_factory=frozenset)
    linear_in: tuple[frozenset[int], ...] = ()

    def __post_init__(self) -> None:
        for letters in (*self.inputs, *self.outputs):
            used = [c for c in letters or () if c is not None]
            if len(used) != len(set(used)):
                raise ValueError(
                    f"dim map {self}: a letter repeats within one operand; diagonals are unsupported"
                )
        for group in self.linear_in:
            if not group or any(i < 0 or i >= len(self.inputs) for i in group):
                raise ValueError(f"dim map {self}: linear_in group {sorted(group)} names no valid operand")

    @classmethod
    def parse(
        cls,
        text: str,
        *,
        unsplittable: str = "",
        free_out: str = "",
        linear_in: Sequence[Iterable[int]] = (),
    ) -> DimMap:
        """``"mk,kn->mn"``; ``1`` marks a letterless dim, ``-`` an operand that is not a tensor; ``"->a"`` has
        no operands."""
        lhs, _, rhs = text.partition("->")

        def operand(s: str) -> Letters | None:
            s = s.strip()
            return None if s == "-" else tuple(None if c == "1" else c for c in s)

        return cls(
            inputs=tuple(operand(s) for s in lhs.split(",")) if lhs.strip() else (),
            outputs=tuple(operand(s) for s in rhs.split(",")),
            unsplittable=frozenset(unsplittable),
            free_out=frozenset(free_out),
            linear_in=tuple(frozenset(g) for g in linear_in),
        )

    def __str__(self) -> str:
        def fmt(letters: Letters | None) -> str:
            return "-" if letters is None else "".join(c or "1" for c in letters)

        return ",".join(map(fmt, self.inputs)) + "->" + ",".join(map(fmt, self.outputs))

    def letters(self) -> list[str]:
        """Every letter, outputs first, in order of first appearance (the order of split choices)."""
        order: list[str] = []
        for letters in (*self.outputs, *self.inputs):
            for c in letters or ():
                if c is not None and c not in order:
                    order.append(c)
        return order

    def choices(self) -> list[AxisChoice]:
        """What one mesh axis may do: replicate, split one letter, or pass Partial through one group."""
        replicate = AxisChoice(
            tuple(None if x is None else Replicate() for x in self.inputs),
            tuple(None if y is None else Replicate() for y in self.outputs),
            splits_work=False,
        )
        result = [replicate]
        for letter in self.letters():
            choice = self._split(letter)
            if choice is not None:
                result.append(choice)
        for group in self.linear_in:
            result.append(
                AxisChoice(
                    tuple(
                        None if x is None else Partial() if i in group else Replicate()
                        for i, x in enumerate(self.inputs)
                    ),
                    tuple(None if y is None else Partial() for y in self.outputs),
                    splits_work=False,
                )
            )
        return result

    def _split(self, letter: str) -> AxisChoice | None:
        if letter in self.unsplittable:
            return None
        in_inputs = any(letter in (x or ()) for x in self.inputs)
        holders = [letter in y for y in self.outputs if y is not None]
        if not in_inputs and letter not in self.free_out:
            return None
        if any(holders) and not all(holders):
            return None  # kept by one output, reduced by another: no single meaning
        contracted = not any(holders)
        return AxisChoice(
            tuple(_place(x, letter) for x in self.inputs),
            tuple(
                None if y is None else Partial() if contracted else _place(y, letter) for y in self.outputs
            ),
            splits_work=True,
        )


def _place(letters: Letters | None, letter: str) -> Placement | None:
    if letters is None:
        return None
    return Shard(letters.index(letter)) if letter in letters else Replicate()


def broadcast_letters(
    shapes: Sequence[Sequence[int] | None], out_shape: Sequence[int]
) -> tuple[tuple[Letters | None, ...], Letters]:
    """Letters for a broadcasting pointwise op: output dim ``i`` gets letter ``i``; an operand dim aligned to it
    from the right shares the letter when their sizes agree (a size-1 broadcast dim gets none)."""
    out_letters = tuple(fresh_letters(len(out_shape)))
    result: list[Letters | None] = []
    for shape in shapes:
        if shape is None:
            result.append(None)
            continue
        offset = len(out_shape) - len(shape)
        result.append(
            tuple(
                out_letters[offset + d] if int(size) == int(out_shape[offset + d]) else None
                for d, size in enumerate(shape)
            )
        )
    return tuple(result), out_letters


def strategies_from_map(
    node: fx.Node,
    roles: Sequence[object],
    dim_map: DimMap,
    mesh_shape: Sequence[int],
    *,
    nondiff: Iterable[int] = (),
) -> list[OpStrategy]:
    """Expand ``dim_map`` (one operand per role) over the mesh; see :func:`autoshard.strategies.strategy.expand`."""
    if len(dim_map.inputs) != len(roles):
        raise ValueError(f"dim map {dim_map} has {len(dim_map.inputs)} operands for {len(roles)} roles")
    for role, letters in zip(roles, dim_map.inputs, strict=True):
        val = tensor_meta(role)
        if val is not None and letters is not None and len(letters) != val.dim():
            raise ValueError(
                f"dim map {dim_map} gives {len(letters)} letters to a {val.dim()}-d operand {role}"
            )
    return expand(node, roles, dim_map.choices(), mesh_shape, nondiff=nondiff)
