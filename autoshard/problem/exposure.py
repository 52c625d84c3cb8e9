"""Linear terms that charge the gradient sync a backward cannot hide: a tighter lower bound on the step.

Input: a :class:`~autoshard.problem.build.BuiltProblem` (training, gradient sync overlapped).  Output:
:class:`ExposureTerms`, for one backward unit ``j`` whose gradients are ready before the final unit's
(:mod:`autoshard.problem.ready`), the coefficients of the linear function

    D_j(p) = S_[j, F)(p) - B_(j, F](p)

of a plan ``p``: ``S_[j, F)`` the gradient sync of the units from ``j`` up to, not including, the final unit
``F`` (backward order), ``B_(j, F]`` the one-microbatch backward of the units after ``j`` up to and including
``F``; and :func:`tightened`, the lower-bound problem plus ``lam x D_j``.

Why it is a lower bound (``lam`` in [0, 1]).  The critical path (:func:`autoshard.problem.step.critical_path`)
feeds :class:`~cost_models.overlap.SyncStream` the units in backward order, each with its backward ``b_t``
(units after ``F`` count 0) and its sync ``s_t``; the step pays the stream's end past the backward's,
``E = max(0, end - sum_t b_t)``, on top of terms this bound leaves as they are.  The stream is serial, and a
bucket is issued no earlier than its last member is ready, so every sync of a unit at or after ``j`` runs
after unit ``j``'s backward ends: ``end >= sum_{t <= j} b_t + S_[j, ..)``, so ``E >= S_[j, ..) - B_(j, ..)``
for every ``j``, buckets or not.  The lower-bound problem (:mod:`autoshard.problem.unpaid`) charges at most
``S_[F, ..)`` (the ``j = F`` case: the final unit's sync and every one ready after it; the syncs before it
taken as hidden, a repeated layer's charged on layer 0's copy only).  Adding ``lam x D_j`` charges at most
``(1 - lam) S_[F, ..) + lam (S_[j, ..) - B_(j, ..))``, a convex combination of two of those lower bounds
on ``E``.  The terms here keep that true where they add less than ``D_j``: a sync term only for a
parameter edge priced apart from its other uses (``consumers == 1``) whose unit is known, the backward term
for every op node exactly as the step prices it (:func:`~autoshard.problem.ready.unit_backward`, one
microbatch: the stream hides under the last microbatch's backward).  So ``L(p) + lam D_j(p) <= step(p)``
for every plan ``p`` of a flat plan, whatever its microbatches, and the best ``lam`` is a concave dual
(:mod:`autoshard.planner_dual`).  Pipelined stages price their syncs per stage
(:mod:`autoshard.pipeline.stages`) and are never ranked here: nothing proves it there.

Where it pays: the lower-bound problem lets every sync before the final unit hide, however long; a plan
whose syncs outlast the backward behind them (data parallel of a small model, context parallelism whose
weights are replicated on the ring's axis) looks as cheap as one that syncs nothing.  A repeated stack of
``N`` layers with sync ``s`` and backward ``c`` per layer gets ``lam (N - 1)(s - c)`` at ``j`` = its last
layer (``exposed_sync_repeated``'s ``(N - 1) max(0, s - c)``, relaxed).

Example::

    terms = exposure_terms(built)                  # None: nothing may hide
    tightened(lower, terms, 0.5)                   # still <= every plan's reported step
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from autoshard.problem.ready import Backward, Unit, backward_units, unit_backward, unit_of
from autoshard.problem.unpaid import one_sync, ordinary_uses, repeated_parameter
from autoshard.search import Edge, SearchProblem

if TYPE_CHECKING:
    from autoshard.problem.build import BuiltProblem

__all__ = ["Direction", "ExposureTerms", "exposure", "exposure_terms", "tightened"]


@dataclass(frozen=True, slots=True)
class Direction:
    """``D_j`` of one unit ``j`` (module docstring): ``edges``, (edge index, copies of its sync counted);
    ``nodes``, (variable index, copies of its backward counted)."""

    unit: Unit
    edges: tuple[tuple[int, int], ...]
    nodes: tuple[tuple[int, int], ...]

    def __str__(self) -> str:
        return f"layer {self.unit}" if isinstance(self.unit, int) else str(self.unit)


@dataclass(frozen=True, slots=True)
class ExposureTerms:
    """``syncs[e]``: edge ``e``'s gradient sync of one copy (an :class:`~autoshard.search.Edge` between the
    same nodes, cost ``[S_u, S_v]``); ``backward[v]``: variable ``v``'s one-microbatch backward ``[S_v]``;
    ``direction``: the ``D_j`` tried (:func:`exposure_terms`)."""

    syncs: dict[int, Edge]
    backward: dict[int, np.ndarray]
    direction: Direction


def exposure_terms(built: BuiltProblem) -> ExposureTerms | None:
    """The terms of ``built`` (module docstring); None where nothing may hide (no overlapped sync, no unit
    before the final one holds a sync edge) or the edges do not match their uses.

    The direction: the unit whose sync is ready first, whose ``D_j`` holds every sync that may hide (for a
    collapsed stack after which nothing syncs, its last layer: ``(N - 1)(s - c)``).  A second direction
    (a stack's last layer after a head that syncs) moved the LLaMA-3-8B trial's plans little for two more
    solves of the 8B problem each (``python -m benchmarks.rank_candidates``)."""
    opts = built.options
    if not (opts.training and opts.overlap.overlap_grad_sync):
        return None
    uses = ordinary_uses(built)
    if uses is None:
        return None
    units = backward_units(built)
    final = units.final()
    if final is None:
        return None
    top = units.position(final)
    syncs, where = _sync_edges(built, units, uses, top)
    if not syncs:
        return None
    start = max(p for ps in where.values() for p in ps)
    edges = tuple((e, n) for e, ps in where.items() if (n := sum(top < p <= start for p in ps)))
    places = _node_places(built, units)
    nodes = tuple((v, n) for v, ps in places.items() if (n := sum(top <= p < start for p in ps)))
    backward = {}
    for v, _ in nodes:
        name = built.variables[v]
        backward[v] = np.array([unit_backward(built, name, s) for s in built.strategies[name]])
    return ExposureTerms(syncs, backward, Direction(units.order[start], edges, nodes))


def _sync_edges(
    built: BuiltProblem, units: Backward, uses: Sequence, top: int
) -> tuple[dict[int, Edge], dict[int, list[int]]]:
    """Per parameter edge priced apart whose sync may hide: its one-copy sync, and the forward positions
    of the units each copy is ready at (a collapsed stack's copies: every layer's)."""
    syncs: dict[int, Edge] = {}
    edges = built.problem.edges
    where: dict[int, list[int]] = {}
    for use in uses:
        tu = use.use[0]
        producer = built.infos[tu]
        if producer.kind != "parameter" or use.consumers != 1:
            continue
        if repeated_parameter(built, use):
            if use.copies != built.num_blocks:
                continue
            places = [units.position(layer) for layer in range(built.num_blocks) if layer in units.index]
        elif use.copies == 1 and tu in units.ready:
            places = [units.position(units.ready[tu])]
        else:
            continue
        if not any(p > top for p in places):
            continue
        sync = one_sync(built, use)
        if sync.any():
            edge = edges[use.edge]
            syncs[use.edge], where[use.edge] = Edge(edge.u, edge.v, np.maximum(sync, 0.0)), places
    return syncs, where


def _node_places(built: BuiltProblem, units: Backward) -> dict[int, list[int]]:
    """Per op variable, the forward positions of the units its backward runs in, as the step counts them
    (:func:`autoshard.problem.step.critical_path`): a block node in every layer of a collapsed stack, an op
    outside the layers once per node it stands for."""
    index = {name: k for k, name in enumerate(built.variables)}
    places: dict[int, list[int]] = defaultdict(list)
    for name in built.variables:
        info = built.infos[name]
        if info.block is None or info.kind != "op":
            continue
        layers = range(built.num_blocks) if built.num_blocks > 1 else (info.block[0],)
        places[index[name]] += [units.position(layer) for layer in layers if layer in units.index]
    for name, info in built.infos.items():
        if info.block is None and info.kind == "op":
            unit = unit_of(info)
            if unit in units.index:
                places[index[built.template[name]]].append(units.position(unit))
    return places


def tightened(lower: SearchProblem, terms: ExposureTerms, lam: float) -> SearchProblem:
    """``lower`` (the lower-bound problem, maybe masked) plus ``lam x D_j`` (module docstring).  A node's
    cost stays at least 0 (its own backward is part of it; the clip only absorbs rounding)."""
    if lam == 0.0:
        return lower
    edges = list(lower.edges)
    for e, copies in terms.direction.edges:
        edge = edges[e]
        edges[e] = Edge(edge.u, edge.v, edge.cost + (lam * copies) * terms.syncs[e].cost)  # inf stays inf
    costs = list(lower.node_costs)
    for v, copies in terms.direction.nodes:
        less = costs[v] - (lam * copies) * terms.backward[v]
        costs[v] = np.where(np.isfinite(costs[v]), np.maximum(less, 0.0), costs[v])
    return dataclasses.replace(lower, node_costs=tuple(costs), edges=tuple(edges))


def exposure(terms: ExposureTerms, choice: Sequence[int]) -> float:
    """``D_j`` of a plan (its solver choice): the slope of its lower bound in ``lam``."""
    paid = math.fsum(
        copies * float(terms.syncs[e].cost[choice[terms.syncs[e].u], choice[terms.syncs[e].v]])
        for e, copies in terms.direction.edges
    )
    work = math.fsum(copies * float(terms.backward[v][choice[v]]) for v, copies in terms.direction.nodes)
    return paid - work
