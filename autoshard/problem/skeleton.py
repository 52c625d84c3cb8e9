"""The price-free structure of a layout graph, shared by the tensor shapes that divide alike (issue 17).

A layout graph (:mod:`autoshard.problem.pricing`) depends on a tensor's sizes in two ways only:

- *which* layouts fit and which moves are valid: ``size % c == 0`` tests, where ``c`` is a product of the sizes
  of distinct mesh axes (a layout's shard count on a dim, times the moving axis' size for a move into that
  dim: that axis is not already on it, ``redistribute_steps._transition``);
- *how many bytes* a move carries: ``prod(local) * itemsize * m`` with ``m`` the axis size for a gather or a
  pad, else 1.  The layout fits, so every local size is exact and ``prod(local) = numel // d``, ``d`` the
  product of the sizes of the layout's sharded axes: the bytes are ``numel * itemsize * m // d``, an exact
  integer.

So two shapes of one rank whose every dim gives the same answers to every ``size % c == 0`` test (the
:func:`signature`) have the same layouts, the same moves in the same order, and bytes that follow from
``(m, d)`` per move (LLaMA-3-70B on 16 x 8 x 8: 13 skeletons for 27 graphs).  The prices, and so
every table, are then the floats a graph built from scratch gives (``tests/problem/test_skeleton.py`` checks
the moves one by one, ``test_pricing.py`` the tables against the search).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np

from autoshard.redistribute_steps import _P, _R, _moves, _targets

__all__ = ["Skeleton", "skeleton"]


@dataclass(frozen=True, slots=True)
class Skeleton:
    """The layouts that fit and the valid moves between them, with what each move's bytes are made of."""

    index: dict[tuple[int, ...], int]  # layout -> row/column
    u: np.ndarray  # move sources (layout index)
    v: np.ndarray  # move targets
    enters_p: np.ndarray  # the axis whose move enters P, -1 for none
    axis: np.ndarray  # the mesh axis of each move
    kinds: tuple[str, ...]  # the step kind of each move
    mult: tuple[int, ...]  # bytes = numel * itemsize * mult // div
    div: tuple[int, ...]
    orders: dict = field(default_factory=dict, compare=False, repr=False)  # problem/shortest.py ``_order``

    def nbytes(self, shape: tuple[int, ...], itemsize: int) -> list[int]:
        total = math.prod(shape) * itemsize
        return [total * m // d for m, d in zip(self.mult, self.div, strict=True)]


def _products(mesh: tuple[int, ...]) -> tuple[int, ...]:
    """Every product of the sizes of distinct mesh axes (of size > 1)."""
    sizes = [n for n in mesh if n > 1]
    return tuple(
        sorted({math.prod(c) for r in range(len(sizes) + 1) for c in itertools.combinations(sizes, r)})
    )


def signature(shape: tuple[int, ...], mesh: tuple[int, ...]) -> tuple[tuple[bool, ...], ...]:
    """Per dim, which products of distinct mesh axes divide it: all the structure reads of the sizes."""
    products = _products(mesh)
    return tuple(tuple(size % c == 0 for c in products) for size in shape)


_SKELETONS: dict[tuple, Skeleton] = {}


def skeleton(shape: tuple[int, ...], mesh: tuple[int, ...]) -> Skeleton:
    """The skeleton of ``shape``'s layout graph on ``mesh`` (built once per :func:`signature`)."""
    key = (mesh, signature(shape, mesh))
    found = _SKELETONS.get(key)
    if found is None:
        if len(_SKELETONS) > 1024:
            _SKELETONS.clear()
        found = _SKELETONS[key] = _build(shape, mesh)
    return found


def _build(shape: tuple[int, ...], mesh: tuple[int, ...]) -> Skeleton:
    # every placement on every axis, P included (the search's targets for a goal that is P everywhere);
    # each target's P-axis mask then filters the moves entering P, as the search's own targets do
    targets = _targets((_P,) * len(mesh), len(shape), mesh)
    domains = [t or (_R,) for t in targets]
    layouts = [lay for lay in itertools.product(*domains) if _fits(lay, shape, mesh)]
    index = {lay: k for k, lay in enumerate(layouts)}
    us: list[int] = []
    vs: list[int] = []
    enters: list[int] = []
    axes: list[int] = []
    kinds: list[str] = []
    mult: list[int] = []
    div: list[int] = []
    for lay in layouts:
        d = math.prod(n for p, n in zip(lay, mesh, strict=True) if p >= 0)
        for axis, move, nxt in _moves(lay, shape, 1, mesh, targets):  # the search's move list
            us.append(index[lay])
            vs.append(index[nxt])
            enters.append(axis if nxt[axis] == _P else -1)
            axes.append(axis)
            kinds.append(move[0])
            mult.append(mesh[axis] if move[0] in ("all_gather", "local_pad") else 1)
            div.append(d)
    return Skeleton(
        index,
        np.array(us, dtype=np.int64),
        np.array(vs, dtype=np.int64),
        np.array(enters, dtype=np.int64),
        np.array(axes, dtype=np.int64),
        tuple(kinds),
        tuple(mult),
        tuple(div),
    )


def _fits(layout: tuple[int, ...], shape: tuple[int, ...], mesh: tuple[int, ...]) -> bool:
    counts = [1] * len(shape)
    for p, n in zip(layout, mesh, strict=True):
        if p >= 0:
            counts[p] *= n
    return all(size % c == 0 for size, c in zip(shape, counts, strict=True))
