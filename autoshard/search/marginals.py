"""Min-marginals of an exact elimination: for every node and strategy, the least objective of a plan using it.

Input: an :class:`~autoshard.search.exact.ExactSolver` (its elimination order and tree components) and unary
costs.  Output: per node, ``mm[i][s]`` = the least objective of a plan with node ``i`` at strategy ``s``.

Method: bucket-tree elimination, the upward pass of :meth:`ExactSolver.solve` (trees included, as steps
``x -> parent``) keeping every bucket, then a downward pass that sends each step the best of everything
outside its subtree.  A bucket that holds a child's message gets its own marginal from that child's
outside table plus the message, over the message's scope (the bucket's whole table is that sum minimised
over the variables outside the scope, which the child's table has done already): one full table less per
such bucket (LLaMA-3-70B on 16 x 8 x 8, the rank's lower-bound problem: 0.24 -> 0.19 s CPU; the marginals
then differ from summing the whole table only by float rounding, ~1e-16 relative, which fixing's slack
absorbs).  The upward pass is the last solve's when that ran at the same costs (``ExactSolver.last``: the
sweep's last probe is usually the multiplier fixing asks about; 0.19 -> 0.13 s CPU there).  About three
solves (two after such a solve); the Lagrangian sweep (:mod:`~autoshard.search.budget`) uses it to
drop the strategies no plan under the budget can afford.  Conditioned nodes: once per assignment, as the
solve does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from autoshard.search.exact import ExactSolver
from autoshard.search.order import Step

__all__ = ["Buckets", "min_marginals"]

#: One term of a bucket: its scope, its table, and the step whose message it is (-1: a cost term).
_Part = tuple[tuple[int, ...], np.ndarray, int]


@dataclass(frozen=True, slots=True)
class Buckets:
    """The buckets of one variable elimination (:attr:`ExactSolver.steps`, no conditioning): per step its
    parts ``(scope, table, k)``, ``k`` the step whose message it is (-1: a cost term), in the order summed,
    and each root step's optimum; kept with the unary costs they were made from, so the upward pass of
    :func:`~autoshard.search.marginals.min_marginals` at the same costs is not run again (the Lagrangian
    sweep's last probe is usually the multiplier fixing asks about)."""

    unary: tuple[np.ndarray, ...]
    parts: tuple[list[_Part], ...]
    roots: dict[int, float]

    def made_from(self, unary: Sequence[np.ndarray]) -> bool:
        return len(unary) == len(self.unary) and all(
            a is b or np.array_equal(a, b) for a, b in zip(unary, self.unary, strict=True)
        )


def min_marginals(ex: ExactSolver, unary: Sequence[np.ndarray]) -> list[np.ndarray]:
    """``mm[i][s]`` for every node ``i`` and strategy ``s`` of ``ex``'s graph under ``unary``."""
    steps = [*ex.tree_steps, *ex.steps]
    out = [np.full(size, np.inf) for size in ex.sizes]
    for values in ex.assignments():
        local, const = ex.condition(unary, values)
        total = const + _bucket_tree(ex, steps, local, const, out)
        for c, s in zip(ex.conditioned, values, strict=True):
            out[c][s] = min(out[c][s], total)
    return out


def _upward(
    ex: ExactSolver, steps: Sequence[Step], unary: Sequence[np.ndarray]
) -> tuple[list[list[_Part]], dict[int, float], list[int]]:
    """Eliminate along ``steps`` keeping every bucket: per step its parts (a part's origin is the step
    that sent it, -1 for a cost term), the optimum of each component by its root step, each step's root.

    The variable-elimination steps (``ex.steps``, after the tree steps) are taken from ``ex.last`` or
    ``ex.earlier`` when the solver's last elimination or the one before ran at these costs: the same parts in
    the same order, so the same tables.  The one before: a sweep whose last probe proved less than the one
    before it (LLaMA-3-70B's contiguous solve: B's multiplier, then a crossing that bounds lower; its
    upward pass 0.07 s CPU spared, one more elimination's tables held meanwhile)."""
    last = next((b for b in (ex.last, ex.earlier) if b is not None and b.made_from(unary)), None)
    todo = steps[: len(steps) - len(ex.steps)] if last is not None else steps
    parts, root_total = _eliminate_keeping(ex, todo, unary)
    if last is not None:
        off = len(todo)
        parts += [[(f, t, c + off if c >= 0 else -1) for f, t, c in bucket] for bucket in last.parts]
        root_total.update({k + off: value for k, value in last.roots.items()})
    root_of = list(range(len(steps)))
    for k in reversed(range(len(steps))):  # a parent comes later in the order: visited first here
        for _, _, child in parts[k]:
            if child >= 0:
                root_of[child] = root_of[k]
    return parts, root_total, root_of


def _eliminate_keeping(
    ex: ExactSolver, steps: Sequence[Step], unary: Sequence[np.ndarray]
) -> tuple[list[list[_Part]], dict[int, float]]:
    """The buckets of eliminating along ``steps`` (whole components) and each component's optimum."""
    pos = {step.var: k for k, step in enumerate(steps)}
    bucket: dict[int, list[_Part]] = {v: [((v,), unary[v], -1)] for v in pos}
    for (a, b), mat in ex.form.pairs.items():
        if a in pos and b in pos:
            bucket[a if pos[a] < pos[b] else b].append(((a, b), mat, -1))
    parts: list[list[_Part]] = []
    root_total: dict[int, float] = {}
    for k, step in enumerate(steps):
        mine = bucket.pop(step.var)
        parts.append(mine)
        msg = ex.reduced(step.var, [(f, t) for f, t, _ in mine], step.rest)
        if step.rest:
            bucket[min(step.rest, key=pos.__getitem__)].append((step.rest, msg, k))
        else:
            root_total[k] = float(msg)
    return parts, root_total


def _bucket_tree(
    ex: ExactSolver, steps: Sequence[Step], unary: Sequence[np.ndarray], const: float, out: list[np.ndarray]
) -> float:
    """Upward, then downward: each step gets ``down``, the best of everything outside its subtree as a
    table over its ``rest``; ``out`` is lowered to the min-marginals (plus ``const``).  Returns the
    optimum of the non-conditioned nodes."""
    parts, root_total, root_of = _upward(ex, steps, unary)
    outside = {r: math.fsum(t for q, t in root_total.items() if q != r) for r in root_total}
    down: dict[int, tuple[tuple[int, ...], np.ndarray]] = {}
    for k in reversed(range(len(steps))):
        step = steps[k]
        extra = [down[k]] if k in down else []
        best: np.ndarray | None = None
        for f, msg, child in parts[k]:
            if child >= 0:  # everything in this bucket but the child's own message
                rest = [(g, t) for g, t, c in parts[k] if c != child] + extra
                down[child] = (f, ex.reduced(step.var, rest, f))
                if best is None:  # the whole bucket is that plus the message, over the message's scope
                    best = ex.reduced(step.var, [down[child], (f, msg)], (step.var,))
        if best is None:  # no message in the bucket: the whole table
            best = ex.reduced(step.var, [(f, t) for f, t, _ in parts[k]] + extra, (step.var,))
        out[step.var] = np.minimum(out[step.var], best + outside[root_of[k]] + const)
    return math.fsum(root_total.values())
