"""Which spec pairs a redistribution table prices: what no collective price changes, kept apart from the prices.

A table of an edge (or of a fan-out group's elements) is priced over the distinct specs on each side and
spread over the strategies by index (:func:`autoshard.problem.pricing.pairwise_ids`).  The distinct specs and
the indices depend on the strategies and the spec ids alone, not on the cluster's collective prices: a
:class:`SpecPairs` keeps them, so a zigzag cluster's build (the same spec ids as its plain cluster's,
problem/shared.py) reads the plain build's and only asks its own :class:`~autoshard.problem.pricing.PriceTable`
for the prices.  :meth:`SpecPairs.table` is :func:`pairwise_ids` split in two: the same ``np.unique``, the same
specs asked, the same indexing, so the same table bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from autoshard.placement import ShardingSpec

if TYPE_CHECKING:
    from autoshard.problem.costs import StepCache
    from autoshard.problem.pricing import PriceTable

__all__ = ["SpecPairs", "spec_pairs"]


@dataclass(frozen=True, slots=True)
class SpecPairs:
    """The distinct specs of each side of one table, and per strategy the row (column) of its spec."""

    src: tuple[ShardingSpec | None, ...]
    dst: tuple[ShardingSpec | None, ...]
    rows: np.ndarray  # per source strategy, its index in ``src``
    cols: np.ndarray  # per target strategy, its index in ``dst``
    shape: tuple[int, ...]
    itemsize: int

    def table(self, prices: PriceTable) -> np.ndarray:
        """``T[i, j]``: seconds from source strategy ``i``'s spec to target strategy ``j``'s."""
        distinct = prices.pairwise(self.src, self.dst, self.shape, self.itemsize)
        return distinct.take(self.rows, axis=0).take(self.cols, axis=1)  # = [rows][:, cols], a quarter faster


def spec_pairs(
    src: Sequence[int] | np.ndarray, dst: Sequence[int] | np.ndarray, shape, itemsize: int, steps: StepCache
) -> SpecPairs:
    """The :class:`SpecPairs` of interned spec ids ``src`` -> ``dst`` (-1 is None: free)."""
    us, si = np.unique(np.asarray(src, dtype=np.int64), return_inverse=True)
    ud, di = np.unique(np.asarray(dst, dtype=np.int64), return_inverse=True)
    return SpecPairs(
        tuple(steps.spec(int(a)) for a in us),
        tuple(steps.spec(int(b)) for b in ud),
        si,
        di,
        tuple(shape),
        int(itemsize),
    )
