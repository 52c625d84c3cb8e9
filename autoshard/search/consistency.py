"""Arc consistency: the strategies that can still be part of a finite-cost plan, and why a domain emptied.

Input: a :class:`~autoshard.search.problem.SearchProblem` (optionally its pairwise form).  Output: per node
the bool mask of live strategies, or an :class:`~autoshard.errors.InfeasibleError` that names the nodes
behind an emptied domain (an :class:`~autoshard.search.problem.AnnotationConflictError` when annotated
nodes are among them).  Step 1 of :mod:`~autoshard.search.reduce`; propagation uses it too.

A strategy goes when its node cost is ``inf``, its mask drops it, or some neighbour has no live strategy
it pairs with at finite cost; each removal re-examines the neighbours until nothing changes (AC-3).

Example::

    >>> import numpy as np
    >>> from autoshard.search.problem import Edge, SearchProblem
    >>> p = SearchProblem((np.array([0.0, 1.0]), np.array([0.0, np.inf])),
    ...                   (Edge(0, 1, np.array([[np.inf, 0.0], [0.0, 0.0]])),), ("a", "b"))
    >>> [m.tolist() for m in prune_domains(p)]
    [[False, True], [True, False]]
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np

from autoshard.errors import InfeasibleError
from autoshard.search.problem import AnnotationConflictError, PairwiseForm, SearchProblem, pairwise_form

__all__ = ["prune_domains"]


def _annotated(problem: SearchProblem, i: int) -> bool:
    mask = None if problem.allowed is None else problem.allowed[i]
    return mask is not None and not mask.all()


def _name_list(problem: SearchProblem, nodes: Sequence[int], limit: int = 12) -> str:
    shown = ", ".join(problem.names[i] for i in nodes[:limit])
    return shown + (f" and {len(nodes) - limit} more" if len(nodes) > limit else "")


def _wipeout_error(problem: SearchProblem, node: int, cause: Sequence[set[int]]) -> InfeasibleError:
    """Error for an emptied domain at ``node``: the causal closure of the prunings that emptied it."""
    closure, stack = {node}, [node]
    while stack:
        for y in cause[stack.pop()]:
            if y not in closure:
                closure.add(y)
                stack.append(y)
    involved = sorted(closure)
    pinned = [i for i in involved if _annotated(problem, i)]
    where = f"graph node {problem.names[node]} has no strategy left"
    if pinned:
        return AnnotationConflictError(
            f"the annotations on {_name_list(problem, pinned)} conflict: {where} that is compatible with all "
            f"of them at finite cost (nodes involved: {_name_list(problem, involved)}). Fix: change or drop "
            "one of these annotations, or check the mesh axes they name."
        )
    return InfeasibleError(
        f"no finite-cost plan exists: {where} (nodes involved: {_name_list(problem, involved)}); every "
        "combination of their strategies has infinite cost (non-dividing shards or impossible conversions). "
        "Fix: a mesh whose axis sizes divide these tensors' dims, or strategies that allow replication."
    )


def _constrained_arcs(form: PairwiseForm) -> list[list[tuple[int, np.ndarray]]]:
    """``arcs[x]`` lists ``(y, finite[s_y, s_x])`` for every neighbour ``y`` whose edge forbids a pair."""
    arcs: list[list[tuple[int, np.ndarray]]] = [[] for _ in form.unary]
    for (a, b), mat in form.pairs.items():
        finite = np.isfinite(mat)
        if not finite.all():
            arcs[a].append((b, finite.T))
            arcs[b].append((a, finite))
    return arcs


def prune_domains(problem: SearchProblem, form: PairwiseForm | None = None) -> list[np.ndarray]:
    """Arc-consistent domains: per node the bool mask of strategies that can still be part of a finite plan.

    Raises :class:`InfeasibleError` (an :class:`AnnotationConflictError` when annotated nodes are involved)
    naming the nodes behind an emptied domain.
    """
    form = pairwise_form(problem) if form is None else form
    live = [np.isfinite(u) for u in form.unary]
    cause: list[set[int]] = [set() for _ in live]
    for i, dom in enumerate(live):
        if not dom.any():
            raise _wipeout_error(problem, i, cause)
    arcs = _constrained_arcs(form)
    queue = deque(i for i in range(len(live)) if arcs[i])
    queued = [bool(a) for a in arcs]
    while queue:
        x = queue.popleft()
        queued[x] = False
        for y, finite in arcs[x]:
            keep = live[y] & finite[:, live[x]].any(axis=1)
            if keep.sum() == live[y].sum():
                continue
            live[y] = keep
            cause[y].add(x)
            if not keep.any():
                raise _wipeout_error(problem, y, cause)
            if not queued[y]:
                queued[y] = True
                queue.append(y)
    return live
