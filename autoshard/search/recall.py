"""Large min-plus tables recalled across solves: the same bucket, met again by another solver, is not summed
and minimised a second time.

Input: one call of the kernel (:func:`~autoshard.search.minplus.reduced`): its structure (how each part's
scope lies along the table's axes, which axes are kept, the domain sizes) and its parts' tables.  Output:
the table an earlier call with the same structure and parts, *bit for bit*, returned (:meth:`Recall.find`),
or None.

Why: one plan solves many similar problems (LLaMA-3-70B on 16 x 8 x 8: the balanced bound B, the contiguous
layout C on B's build cache and probed first at B's multiplier, the masked bounds, the recompute intervals,
the rank's bound).  Where a subtree's costs are the same, its messages are too, though each solver numbers its
nodes afresh and holds its own arrays (search/messages.py keeps them within one solver only): 217 of that
plan's 1,953 kernel calls, 11 % of its 1.6e9 table entries, repeat an earlier call's inputs exactly.

Exact: a candidate is looked up by a cheap key (the structure and 16 sampled entries of each part) and
returned only when every part's bytes equal the stored ones, so the answer is the table the kernel would
build.  Parts are held by reference, as the solver holds its pair matrices and messages (never written in
place: search/messages.py relies on the same); one-dimensional parts (unary costs, the caller's arrays) are
copied.  Only tables of at least :data:`LEAST` entries are kept, oldest first out beyond :data:`BUDGET`
bytes, so the memory held is bounded.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from typing import ParamSpec, TypeVar

import numpy as np

__all__ = ["BUDGET", "LEAST", "Recall", "recall", "scoped"]

#: Entries of the smallest table kept: a table of 2^20 entries costs ~1 ms to build, a lookup a few us.
LEAST = 1 << 20

#: Bytes of tables and parts held at most (counted per entry, so shared parts count more than once):
#: LLaMA-3-70B's repeats lie within the last ~128 MB of large calls' tables and parts (64 MB: 4 % of the
#: entries recalled, 128 MB: 10 %, more: 11 %); peak memory ~0.65 GiB before, within the 1 GiB the plan
#: may use.
BUDGET = 128 << 20

#: Entries of each part sampled for the key.
_SAMPLES = 16

_Entry = tuple[tuple[np.ndarray, ...], np.ndarray, int]  # parts, table, bytes counted


class Recall:
    """The tables of the last large kernel calls, by a cheap key, each checked by its parts' bytes."""

    def __init__(self, budget: int = BUDGET) -> None:
        self.budget = budget
        self.held = 0
        self.depth = 0  # nesting of scoped calls
        self.entries: dict[Hashable, list[_Entry]] = {}
        self.order: deque[tuple[Hashable, _Entry]] = deque()  # oldest first

    def key(self, shape: Hashable, arrays: Sequence[np.ndarray]) -> Hashable:
        return (shape, *(_sample(a) for a in arrays))

    def find(self, key: Hashable, arrays: Sequence[np.ndarray]) -> np.ndarray | None:
        for parts, table, _ in self.entries.get(key, ()):
            if all(a is b or _same(a, b) for a, b in zip(parts, arrays, strict=True)):
                return table
        return None

    def keep(self, key: Hashable, arrays: Sequence[np.ndarray], table: np.ndarray) -> None:
        parts = tuple(a.copy() if a.ndim == 1 else a for a in arrays)
        size = table.nbytes + sum(a.nbytes for a in parts)
        if size > self.budget:
            return
        entry = (parts, table, size)
        self.entries.setdefault(key, []).append(entry)
        self.order.append((key, entry))
        self.held += size
        while self.held > self.budget:
            old, gone = self.order.popleft()
            bucket = self.entries[old]
            bucket.remove(gone)
            self.held -= gone[2]
            if not bucket:
                del self.entries[old]

    def clear(self) -> None:
        self.entries.clear()
        self.order.clear()
        self.held = 0


def _sample(a: np.ndarray) -> tuple[object, ...]:
    step = max(1, a.size // _SAMPLES)
    return (a.shape, a.dtype.str, a.flat[::step][:_SAMPLES].tobytes())


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


#: The process's recall (every solver shares it; emptied when the outermost :func:`scoped` call returns).
recall = Recall()

P = ParamSpec("P")
R = TypeVar("R")


def scoped(fn: Callable[P, R]) -> Callable[P, R]:
    """``fn``'s solves share :data:`recall`, emptied when the outermost scoped call returns: no table outlives
    the plan that made it (a library holding up to :data:`BUDGET` bytes between calls would be a leak)."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        recall.depth += 1
        try:
            return fn(*args, **kwargs)
        finally:
            recall.depth -= 1
            if recall.depth == 0:
                recall.clear()

    return wrapper
