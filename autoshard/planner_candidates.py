"""More plans for the ranking when its bound is not met: the *sync-exposed* optimum, and per kind of
parallelism the optima without it.

Input: a :class:`~autoshard.problem.build.BuiltProblem`, the solver's :class:`~autoshard.search.Solution` of
it, and the reader that turns a solution into a :class:`~autoshard.plans.Plan`.  Output: more candidates of
:func:`autoshard.planner_rerank.rank_plan`, which prices each by the critical path like every other.

Why.  The builder charges a repeated layer's gradient sync once, as if every other copy hid under the
backward of the layer before it (:func:`~autoshard.problem.arrays.edge_arrays`; exact while a layer's sync
is shorter than its backward).  A plan whose layers sync more than their backward can hide pays the rest on
the critical path, which the linear objective does not see: the new-user trial's LLaMA-3-8B on 2 x 8
(batch 2 x 8192, two H100 nodes) got context parallelism on the 8-wide axis, whose weights are replicated
there too, so each layer's sync (4.3 ms) outlasts its backward and the step exposed 65.8 ms of sync; the
solver optimum stepped 197.70 ms where ``--forbid cp`` found 188.36 ms.

The sync-exposed problem is the same problem with every copy of a repeated layer's gradient sync charged
(:func:`sync_exposed_problem`).  It is an *upper* model of the reported step: every term the critical path
may overlap (a sync, a prefetched gather, a move consumers share) it charges in full, so ``step(p) <= U(p)``
for every plan ``p``, as the lower-bound problem gives ``L(p) <= step(p)``
(:mod:`autoshard.problem.unpaid`).  The two bracket the step, and they differ exactly where the ranking
needs more plans: where sync is what the linear objective under-charges, the plan that is best when that
sync is paid is the natural one to price.  Its optimum ``p_U`` steps at most ``min U``.  On the trial it is
TP 2 x CP 8 at 157.48 ms (the bound 134.97 ms), below every ``--forbid`` plan (the best, ``--forbid cp`` and
``--forbid dp``, 166.6 and 166.2 ms now that their rankings price it too).

Per kind of parallelism (:func:`add_restricted`).  The sync-exposed optimum is one plan; a plan that keeps
a layer's sync under its backward only *partly* lies between the two models, and a user who forbids a kind
(``--forbid dp``) gets the ranking of that restricted problem, whose lower-bound and linear optima are plans
of this problem too.  So for each kind read from strategies (dp, tp, sp, cp, ep) those two optima are
candidates, unless the lower-bound problem under the kind's masks, solved with the best step so far as its
ceiling, proves none of its plans faster (:func:`beatable`, the hand plans' rule; its optimum is the first
of the pair).  A LLaMA of 2048 hidden x 4 layers, batch 2 x 4096, on two H100 nodes (2 x 8): solver
optimum 10.04 ms, sync-exposed optimum 7.78 ms, "lower-bound optimum without dp" 7.52 ms, which is what
``--forbid dp`` returns, and no ``--forbid`` plan is faster (``tests/planner/test_planner_candidates.py``).
These plans live in the problem's own sequence layout: where it is zigzag, a restricted plan without rings
pays reordering copies that ``--forbid cp`` (laid out contiguous) does not (the trial's: 204--213 ms).

When.  Only when no candidate met the bound (``rank_plan``'s shortcut): a proven plan (LLaMA-3-70B on
16 x 8 x 8) solves nothing more.  The sync-exposed problem takes one solve, with the solver's dominance
removals checked and applied first (a similar problem: the same strategies, larger edge costs); each kind
at most one bounded solve and one more when not pruned, none for an optimum that makes no split of that
kind (it is the optimum of the subset too).  The trial's ranking: 0.21-0.24 -> 0.67-0.73 CPU s, 6 plans
priced where 2 were (``python -m benchmarks.rank_candidates``).  Nothing changes where the builder already charged every
copy (gradient sync not overlapped) or no repeated parameter exists; then no sync-exposed problem is made.

A tighter bound (:mod:`autoshard.planner_dual`, :mod:`autoshard.problem.exposure`).  For N identical
layers with per-layer sync ``s`` and backward ``c`` the critical path exposes at least ``s + (N - 1) max(0,
s - c)``, and ``max(0, x) >= lam x`` for ``lam`` in [0, 1]: the lower-bound problem plus ``lam`` x (the syncs
from a unit on less the backward after it) is still a lower bound, for any unit and buckets, proven there.
The ranking maximises it over ``lam`` before these candidates (a concave dual, three solves at most) and
prices the optimum of each ``lam`` it tries; the bound it reaches is what :func:`beatable` prunes with.  On
the trial it raises the bound from 134.97 to 137.24 ms; the plan stays TP 2 x CP 8 at 157.48 ms.

Example::

    upper = sync_exposed_problem(built)       # None: nothing hidden to charge
    evaluate(upper, choice) >= plan.predicted_step_time
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from autoshard.errors import InfeasibleError
from autoshard.plans import Plan
from autoshard.problem.build import BuiltProblem
from autoshard.problem.unpaid import one_sync, ordinary_uses, repeated_parameter
from autoshard.search import BoundExceeded, Edge, SearchProblem, Solution, solve
from autoshard.search.reduce import Certificates
from autoshard.steering import kind_masks
from autoshard.steering_dims import Output, carried_dims

__all__ = [
    "RESTRICTED",
    "SYNC_EXPOSED",
    "Candidate",
    "add_candidate",
    "add_restricted",
    "add_sync_exposed",
    "beatable",
    "kind_allowed",
    "sync_exposed_problem",
]

#: Relative slack between the bound and a step that still counts as equal: float sums in two orders (the
#: solver's objective and the critical path).  ``planner_rerank.RANK_TOLERANCE`` is this one.
RANK_TOLERANCE = 1e-9

#: The kinds whose masks give restricted candidates: those read from a strategy's splits
#: (:mod:`autoshard.steering`; ``fsdp`` constrains edges and ``pp`` the request, not strategies).
RESTRICTED = ("dp", "tp", "sp", "cp", "ep")

SYNC_EXPOSED = "sync-exposed optimum"
"""The candidate's name in ``SolverReport.ranked`` and the report's proof line."""

Candidate = tuple[str, Plan, tuple[int, ...] | None]
"""(name, plan, its choice in the problem; None for a plan of another problem) as ``rank_plan`` keeps them."""


def sync_exposed_problem(built: BuiltProblem) -> SearchProblem | None:
    """``built``'s problem with each repeated layer's gradient sync charged on every copy, not once (module
    docstring); None when that changes nothing or the builder's edges cannot be matched to their uses."""
    opts = built.options
    if not (opts.training and opts.overlap.overlap_grad_sync):
        return None  # the builder charged every copy already
    uses = ordinary_uses(built)
    if uses is None:
        return None
    edges, changed = list(built.problem.edges), False
    for use in uses:
        if not repeated_parameter(built, use):
            continue
        sync = one_sync(built, use)
        edge = edges[use.edge]
        edges[use.edge] = Edge(edge.u, edge.v, edge.cost + sync * (use.copies - 1))  # inf stays inf
        changed = True
    return dataclasses.replace(built.problem, edges=tuple(edges)) if changed else None


def add_sync_exposed(
    candidates: list[Candidate],
    built: BuiltProblem,
    solution: Solution,
    read: Callable[[BuiltProblem, Solution], Plan],
    method: Any,
    time_limit: float,
) -> None:
    """Append the sync-exposed optimum to ``candidates`` (module docstring)."""
    upper = sync_exposed_problem(built)
    if upper is None:
        return
    try:
        found = solve(
            upper,
            method=method,
            time_limit=time_limit,
            dominated=solution.dominated,  # re-checked on this problem: only the speed depends on them
            incumbent=solution.choice,
            multiplier=solution.multiplier,
        )
    except InfeasibleError:  # the same strategies and budget as the solver's problem, which has a plan
        return
    add_candidate(candidates, SYNC_EXPOSED, built, found, read)


def add_restricted(
    candidates: list[Candidate],
    built: BuiltProblem,
    lower: SearchProblem,
    prune: bool,
    hints: tuple[Solution, Solution],
    read: Callable[[BuiltProblem, Solution], Plan],
    method: Any,
    time_limit: float,
) -> None:
    """Per kind of parallelism (:data:`RESTRICTED`), the plans ``--forbid KIND`` would rank first: the
    lower-bound problem's and the linear problem's optima under that kind's masks (module docstring).

    ``prune``: ``lower`` bounds every plan's step, so a kind whose masked bound reaches the best step so
    far is not solved further (:func:`beatable`).  ``hints``: the solutions of ``lower`` and of the linear
    problem: an optimum that makes no split of the kind is that problem's optimum under its masks too (not
    solved again), and their dominance removals are re-checked under the masks (only the speed)."""
    dims = carried_dims(built.infos, built.strategies, built.template)  # once for every kind
    bound, solution = hints
    for kind in RESTRICTED:
        masks = kind_allowed(built, kind, dims)
        if masks is None:
            continue
        if _uses(bound.choice, masks):  # else the lower-bound optimum is a plan without ``kind`` already
            best = min(plan.predicted_step_time for _, plan, _ in candidates)
            ceiling = best if prune else math.inf
            masked = dataclasses.replace(lower, allowed=masks)
            floor = beatable(masked, ceiling, method, time_limit, bound.dominated)
            if floor is None:
                continue  # no plan without ``kind`` can be chosen
            add_candidate(candidates, f"lower-bound optimum without {kind}", built, floor, read)
        if not _uses(solution.choice, masks):
            continue  # the solver's optimum is its optimum without ``kind`` too (a subset holding it)
        try:
            linear = solve(
                dataclasses.replace(built.problem, allowed=masks),
                method=method,
                time_limit=time_limit,
                dominated=solution.dominated,
                dominance_search=not solution.dominated,
            )
        except InfeasibleError:
            continue
        add_candidate(candidates, f"solver optimum without {kind}", built, linear, read)


def _uses(choice: tuple[int, ...], masks: tuple[np.ndarray | None, ...]) -> bool:
    """Whether ``choice`` takes a strategy ``masks`` remove."""
    return any(m is not None and not m[c] for m, c in zip(masks, choice, strict=False))


def kind_allowed(
    built: BuiltProblem, kind: str, dims: Mapping[Output, Mapping[str, frozenset[int]]] | None = None
) -> tuple[np.ndarray | None, ...] | None:
    """``built``'s allowed masks less every strategy that splits as ``kind`` does
    (:func:`~autoshard.steering.kind_masks`; ``dims``: its ``carried_dims``); None when that removes nothing
    or leaves a node nothing."""
    current = built.problem.allowed or (None,) * built.problem.num_nodes
    masks, changed = list(current), False
    index = {name: k for k, name in enumerate(built.variables)}
    kinds = frozenset({kind})
    for name, keep in kind_masks(kinds, built.infos, built.strategies, built.template, dims).items():
        k = index.get(name)
        if k is None:
            continue
        both = keep if masks[k] is None else keep & masks[k]
        if not both.any():
            return None  # this kind is what the node (or a pin on it) needs: no plan without it
        changed = changed or masks[k] is None or bool((both != masks[k]).any())
        masks[k] = both
    return tuple(masks) if changed else None


def beatable(
    lower: SearchProblem, best: float, method: Any, time_limit: float, dominated: Certificates = ()
) -> Solution | None:
    """The optimum of ``lower`` (the lower-bound problem, maybe masked) when it may have a reported step
    below ``best``; None when its bound reaches ``best`` (the solver stops at the first bound that does,
    before any budgeted search) or no plan fits (the masks, the budget and the pins are the linear
    problem's, so none fits there either).  Each plan's step is at least its ``L``, so a problem proven so
    holds no plan that could be chosen (ties keep the earlier candidate).  ``dominated``: a similar
    problem's dominance removals, re-checked here in place of a search of its own (only the speed)."""
    above = best * (1 + RANK_TOLERANCE) + 1e-12  # L <= step holds to RANK_TOLERANCE (float sums, two orders)
    try:
        floor = solve(
            lower,
            method=method,
            time_limit=time_limit,
            ceiling=above,
            dominated=dominated,
            dominance_search=not dominated,
        )
    except (BoundExceeded, InfeasibleError):
        return None
    return None if floor.lower_bound >= above else floor


def add_candidate(
    candidates: list[Candidate],
    name: str,
    built: BuiltProblem,
    found: Solution,
    read: Callable[[BuiltProblem, Solution], Plan],
) -> None:
    """Append ``found``'s plan as ``name``; a plan already there is renamed instead (``"solver optimum =
    sync-exposed optimum"``), so each plan is read and priced once."""
    same = [i for i, (_, _, choice) in enumerate(candidates) if choice == found.choice]
    if same:
        first, plan, choice = candidates[same[0]]
        candidates[same[0]] = (f"{first} = {name}", plan, choice)
    else:
        candidates.append((name, read(built, found), found.choice))
