"""Dominance: strategies that some other strategy of the same node beats whatever the neighbours choose.

Input: one node's unary costs ``u[S]``, the cost matrices of its incident edges (each ``F[S, S_j]``, indexed
``[s_node, s_neighbour]``, restricted to the neighbours' live strategies) and, under a memory budget, its
memory vector.  Output: a keep mask over the node's strategies.  :mod:`~autoshard.search.reduce` applies it
to every node until nothing changes; removing the strategies it rejects never changes the optimum.

Criterion (Goldstein's dead-end elimination, from protein design).  Strategy ``t`` dominates ``s`` when::

    D[s, t] = u[s] - u[t] + sum_edges min_c (F[s, c] - F[t, c])  >=  0      (and mem[t] <= mem[s] under a budget)

For any choice of the neighbours, switching the node from ``s`` to ``t`` then changes the objective by at
most ``-D[s, t] <= 0`` (and never raises memory), so some optimal plan avoids ``s``.  This is stronger than
comparing the rows elementwise (``u[s] >= u[t]`` and ``F[s] >= F[t]`` on every edge), which it implies, and
it also merges duplicate strategies (identical cost, rows and memory give ``D[s, t] = D[t, s] = 0``).
Columns ``c`` where ``F[s, c] = inf`` are ignored (no finite plan pairs ``s`` with ``c``); ``F[t, c] = inf``
where ``F[s, c]`` is finite gives ``D = -inf``: ``t`` cannot replace ``s`` there.

Ties.  ``D`` is transitive (``D[s, r] >= D[s, t] + D[t, r]``), so "``t`` dominates ``s``" is a preorder;
among mutually dominating strategies the smallest index stays.  Strategies are visited in index order and
``s`` goes only when a strategy still kept dominates it, so a chain of removals always ends at a kept one
and the result is deterministic.  Float rounding in ``D`` can only lose ties (keep more), or prune a plan
that is worse than the kept one by rounding error (~1e-16 relative).

Example::

    >>> import numpy as np
    >>> u = np.array([1.0, 1.0, 0.0])
    >>> F = np.array([[0.0, 3.0], [0.0, 3.0], [2.0, 0.0]])      # strategy 1 duplicates 0
    >>> dominated_mask(u, [F]).tolist()                          # 2 is not dominated: 0 beats it at c=0
    [True, False, True]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["dominated_mask"]

#: Entries of one ``(block, S, S_j)`` difference tensor, bounding the scratch memory (32 MB of float64).
_BLOCK_ENTRIES = 4_000_000


def _min_row_differences(rows: np.ndarray) -> np.ndarray:
    """``out[s, t] = min_c (F[s, c] - F[t, c])`` over the ``c`` with finite ``F[s, c]`` (``inf`` if none)."""
    size, width = rows.shape
    out = np.empty((size, size))
    finite = np.isfinite(rows)
    block = max(1, _BLOCK_ENTRIES // max(1, size * width))
    for lo in range(0, size, block):
        hi = min(size, lo + block)
        with np.errstate(invalid="ignore"):  # inf - inf where both are forbidden: masked below
            diff = rows[lo:hi, None, :] - rows[None, :, :]  # (block, S, S_j)
        diff = np.where(finite[lo:hi, None, :], diff, np.inf)
        out[lo:hi] = diff.min(axis=2, initial=np.inf)
    return out


def dominated_mask(
    unary: np.ndarray, rows: Sequence[np.ndarray], memory: np.ndarray | None = None
) -> np.ndarray:
    """Keep mask over one node's strategies: False where a kept strategy dominates (see the module docstring).

    ``rows[k]`` is the ``[S, S_j]`` cost matrix of the ``k``-th incident edge; ``memory`` (bytes) is given
    only under a memory budget, where a dominating strategy must not need more memory.
    """
    size = unary.size
    keep = np.ones(size, dtype=bool)
    if size <= 1:
        return keep
    with np.errstate(invalid="ignore"):
        gain = unary[:, None] - unary[None, :]  # (S, S): u[s] - u[t]
        for mat in rows:
            gain = gain + _min_row_differences(mat)
    beats = gain >= 0  # beats[s, t]: t can replace s; NaN (from -inf + inf) compares False, so s stays
    if memory is not None:
        beats &= memory[None, :] <= memory[:, None]
    np.fill_diagonal(beats, False)
    later = np.arange(size)[None, :] < np.arange(size)[:, None]  # later[s, t]: t has the smaller index
    wins = beats & (~beats.T | later)  # t dominates s strictly, or they tie and t comes first
    for s in range(size):
        if (wins[s] & keep).any():
            keep[s] = False
    return keep
