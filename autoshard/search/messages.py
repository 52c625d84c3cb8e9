"""Variable elimination's messages kept from one solve to the next when their inputs did not change.

Input: an :class:`~autoshard.search.exact.ExactSolver` (its :meth:`~autoshard.search.exact.ExactSolver.reduced`
and a ``memo`` dict), a step of its elimination and that step's bucket.  Output: the step's message, the
table :meth:`reduced` returns.

The Lagrangian sweep (:mod:`~autoshard.search.budget`) solves one graph at many multipliers: only the unary
costs ``c + lambda * m`` change, and those of a node without memory (``m = 0``: ``c + lambda * 0`` is ``c``
to the bit) do not.  A step whose unary cost is the same, bit for bit, as at the last elimination, and whose
other parts are the very same tables (pair matrices; messages that were themselves kept), sends the same
message: it is taken as it was instead of summed and minimised again.  The result is the one
:meth:`reduced` would return, entry for entry, so plans, bounds and ties are unchanged.  LLaMA-3-70B on
16 x 8 x 8 (the balanced-bound solve's reduced problem): 31 of its 99 nodes hold no memory, and their
subtrees are 24 % of each elimination's table entries.

Only unconditioned eliminations keep messages (a conditioned one changes its unary costs with every
assignment); the solver holds them as long as it holds its last buckets (``ExactSolver.last``), which are
the same tables.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from autoshard.search.order import Step

__all__ = ["message"]

#: One term of a bucket: its scope, its table, and the step whose message it is (-1: a cost term).
_Part = tuple[tuple[int, ...], np.ndarray, int]


class _Reducing(Protocol):
    memo: dict[int, tuple[tuple[np.ndarray, ...], np.ndarray]]
    conditioned: tuple[int, ...]

    def reduced(
        self, var: int, parts: Sequence[tuple[tuple[int, ...], np.ndarray]], keep: Sequence[int]
    ) -> np.ndarray: ...


def message(ex: _Reducing, k: int, step: Step, parts: Sequence[_Part]) -> np.ndarray:
    """Step ``k``'s message (``min`` over ``step.var`` of its bucket's sum, over ``step.rest``): the last
    elimination's when every part is the same, else :meth:`reduced`'s, kept for the next elimination
    (conditioned solvers: always :meth:`reduced`'s, nothing kept)."""
    out = ex.reduced(step.var, [(f, t) for f, t, _ in parts], step.rest) if ex.conditioned else None
    if out is not None:
        return out
    seen = ex.memo.get(k)
    if seen is not None and len(seen[0]) == len(parts) and all(map(_same, seen[0], parts)):
        return seen[1]
    out = ex.reduced(step.var, [(f, t) for f, t, _ in parts], step.rest)
    # the unary term is the caller's array: kept as a copy, compared by value; the rest by identity
    kept = tuple(t.copy() if _unary(f, c) else t for f, t, c in parts)
    ex.memo[k] = (kept, out)
    return out


def _unary(scope: tuple[int, ...], origin: int) -> bool:
    return origin < 0 and len(scope) == 1  # a unary term sits in its own node's bucket


def _same(kept: np.ndarray, part: _Part) -> bool:
    scope, table, origin = part
    if _unary(scope, origin):  # the same bits
        return kept.dtype == table.dtype and kept.shape == table.shape and kept.tobytes() == table.tobytes()
    return kept is table
