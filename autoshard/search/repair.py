"""A plan over the memory budget made to fit by the cheapest moves: the primal side of the Lagrangian dual.

Input: a :class:`~autoshard.search.problem.SearchProblem` with a budget and a plan over it (typically the
relaxation's minimiser just below the best multiplier, the cheapest plan of its memory).  Output: a plan that
fits, or ``None``.  A heuristic for the *upper* bound only: what the solver states as proven is still the
dual's lower bound, so a better fitting plan only narrows the stated gap.

Moves.  One node to another strategy: its cost change is its own cost change plus its edges' to the
neighbours' current strategies (one vector per node, over all its strategies).  Each step takes the move
with the least cost increase per byte saved (a move that saves memory and time is taken first), updates the
node and its neighbours, and repeats until the plan fits.

Example::

    >>> import numpy as np
    >>> from autoshard.search.problem import SearchProblem
    >>> p = SearchProblem((np.array([0.0, 1.0]), np.array([0.0, 3.0])), (), ("a", "b"),
    ...                   memory=(np.array([5.0, 1.0]), np.array([5.0, 1.0])), memory_limit=6.0)
    >>> repair(p, (0, 0))                                  # a saves 4 bytes for 1 s, b for 3 s
    (1, 0)
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from autoshard.search.problem import SearchProblem, memory_of

__all__ = ["repair"]


def repair(problem: SearchProblem, plan: Sequence[int], max_moves: int = 10_000) -> tuple[int, ...] | None:
    """``plan`` moved greedily until it fits the budget (module docstring); ``None`` if it never does."""
    assert problem.memory is not None and problem.memory_limit is not None
    n = problem.num_nodes
    choice = list(plan)
    touching: list[list[tuple[int, np.ndarray, bool]]] = [[] for _ in range(n)]  # (other, matrix, i is u)
    for e in problem.edges:
        touching[e.u].append((e.v, e.cost, True))
        touching[e.v].append((e.u, e.cost, False))
    masks = problem.allowed

    def costs(i: int) -> np.ndarray:
        vec = problem.node_costs[i].astype(np.float64, copy=True)
        for j, mat, first in touching[i]:
            vec += mat[:, choice[j]] if first else mat[choice[j], :]
        mask = None if masks is None else masks[i]
        if mask is not None:
            vec[~mask] = np.inf
        return vec

    table = [costs(i) for i in range(n)]
    used = memory_of(problem, choice)
    for _ in range(max_moves):
        if used <= problem.memory_limit:
            return tuple(choice)
        best, move = np.inf, None
        for i in range(n):
            saved = problem.memory[i][choice[i]] - problem.memory[i]
            extra = table[i] - table[i][choice[i]]
            ok = np.flatnonzero((saved > 0) & np.isfinite(extra))
            if ok.size == 0:
                continue
            rate = extra[ok] / saved[ok]
            k = int(np.argmin(rate))
            if rate[k] < best:
                best, move = float(rate[k]), (i, int(ok[k]))
        if move is None:
            return None
        i, t = move
        used -= float(problem.memory[i][choice[i]] - problem.memory[i][t])
        choice[i] = t
        for j in {i, *(j for j, _, _ in touching[i])}:
            table[j] = costs(j)
    return None
