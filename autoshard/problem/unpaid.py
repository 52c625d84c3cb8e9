"""What the reported step may not pay of an edge's linear price: the part a lower bound leaves out.

Input: a :class:`~autoshard.problem.build.BuiltProblem`.  Output: one :class:`Unpaid` record per ordinary
edge of its search problem that the reported (critical-path) step may not pay in full, and
:func:`unpaid`, the seconds to subtract from that edge's price so that the linear objective bounds every
plan's reported step from below (:mod:`autoshard.planner_rerank` solves that problem).

Three reasons, all as :mod:`autoshard.problem.step` and :mod:`autoshard.problem.extract` report a plan:

* a repeated layer's parameter gathers (FSDP forward gathers, backward re-gathers) are priced on each of
  the ``copies`` layers, and prefetch exposes at least one copy: all but one may be hidden;
* the gradient sync of a parameter outside the repeated layers whose gradient is ready before the final
  unit's (:meth:`~autoshard.problem.ready.Backward.hidden`: an MLP's fc2, a transformer's head) may hide
  under the backward that follows; the final unit's sync and every one ready after it stay priced: the
  critical path exposes at least that sum (that suffix of the communication stream starts no earlier than
  the final unit's backward ends, and the backward after it hides nothing, :mod:`autoshard.problem.ready`);
* a move that ``consumers`` uses of one tensor may share is priced once per use (too many layouts for an
  exact fan-out node), and runs once per distinct layout: at least the dearest use, so at least ``1/m`` of
  their sum.

The records follow the builder's own order of ordinary edges (:func:`~autoshard.problem.build.build_problem`:
single uses, then the uses of groups priced apart, self-edges folded into node costs); each record names its
use, and :func:`unpaid_edges` checks the edge it points at joins the same two solver variables.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from autoshard.problem.arrays import edge_matrix
from autoshard.problem.fanout import split_uses
from autoshard.problem.ready import backward_units
from autoshard.problem.recompute import rerun_share

if TYPE_CHECKING:
    from autoshard.problem.build import BuiltProblem

__all__ = ["Unpaid", "Use", "ordinary_uses", "repeated_parameter", "unpaid", "unpaid_edges"]


@dataclass(frozen=True, slots=True)
class Use:
    """An ordinary edge of the search problem: ``edge``, its index in ``SearchProblem.edges``; ``use``,
    (producer, consumer, output, input position) of the builder's weighted use; ``copies``, its weight;
    ``consumers``, the uses priced apart that may share its move (1: none)."""

    edge: int
    use: tuple[str, str, int, int]
    copies: int
    consumers: int


@dataclass(frozen=True, slots=True)
class Unpaid:
    """An edge of the search problem that the reported step may not pay in full.

    ``edge``: its index in ``SearchProblem.edges``; ``use``: (producer, consumer, output, input position)
    of the builder's weighted use; ``copies``: its weight (layer copies); ``share``: how often backward
    re-runs its forward moves (FSDP re-gather, recomputation); ``consumers``: uses that may share its move;
    ``gathers``: its forward moves are a repeated layer's parameter gathers that prefetch hides; ``sync``:
    its backward moves are a gradient sync ready before the final unit's (module docstring)."""

    edge: int
    use: tuple[str, str, int, int]
    copies: int
    share: float
    consumers: int
    gathers: bool
    sync: bool = False


def ordinary_uses(built: BuiltProblem) -> tuple[Use, ...] | None:
    """Every ordinary edge of ``built``'s search problem with the weighted use it prices, in the builder's
    order (module docstring); None when its edges are not in that order."""
    sharing = split_uses(built.edges, built.infos, built.template, built.num_blocks, built.runs)
    weights = dict(sharing.single)
    apart: dict[tuple[str, str, int, int], int] = {}
    for group in built.apart:
        for consumer, pos in group.entries:
            weights[(group.producer, consumer, group.which, pos)] = group.weight
            apart[(group.producer, consumer, group.which, pos)] = len(group.entries)
    edges, index = built.problem.edges, {v: k for k, v in enumerate(built.variables)}
    out: list[Use] = []
    for (tu, tv, which, pos), weight in weights.items():
        if tu == tv:  # folded into the node's cost
            continue
        k = len(out)
        if k >= len(edges) or (edges[k].u, edges[k].v) != (index[tu], index[tv]):
            return None
        out.append(Use(k, (tu, tv, which, pos), weight, apart.get((tu, tv, which, pos), 1)))
    return tuple(out)


def unpaid_edges(built: BuiltProblem) -> tuple[Unpaid, ...] | None:
    """The records of ``built`` (None when its edges are not in the builder's order: no bound then)."""
    uses = ordinary_uses(built)
    if uses is None:
        return None
    opts = built.options
    units = backward_units(built) if opts.training and opts.overlap.overlap_grad_sync else None
    out: list[Unpaid] = []
    for use in uses:
        tu, tv, _, _ = use.use
        producer = built.infos[tu]
        gathers = repeated_parameter(built, use) and opts.training and opts.overlap.prefetch > 0
        sync = use.copies == 1 and producer.kind == "parameter" and units is not None and units.hidden(tu)
        if gathers or sync or use.consumers > 1:
            share = rerun_share(producer, built.infos[tv], opts)
            out.append(Unpaid(use.edge, use.use, use.copies, share, use.consumers, gathers, sync))
    return tuple(out)


def repeated_parameter(built: BuiltProblem, use: Use) -> bool:
    """Whether ``use`` is a repeated layer's parameter read in every copy (the builder charges its gradient
    sync once, :func:`~autoshard.problem.arrays.edge_arrays`)."""
    producer = built.infos[use.use[0]]
    return use.copies > 1 and producer.kind == "parameter" and producer.block is not None


def one_sync(built: BuiltProblem, use: Use) -> np.ndarray:
    """One copy of ``use``'s gradient sync as a matrix over (producer, consumer) strategies: the training
    edge less its forward moves (``training=False``); 0 where the edge has no forward move (inf already).
    The sync-exposed problem (:mod:`autoshard.planner_candidates`) and the exposure bound
    (:mod:`autoshard.problem.exposure`) both charge this."""
    tu, tv, which, pos = use.use
    producer, src, dst = built.infos[tu], built.strategies[tu], built.strategies[tv]
    one = edge_matrix(producer, which, src, dst, pos, built.options, built.cache)
    forward = edge_matrix(producer, which, src, dst, pos, replace(built.options, training=False), built.cache)
    return np.where(np.isfinite(forward), one - forward, 0.0)


def unpaid(matrix: np.ndarray, forward: np.ndarray | None, record: Unpaid) -> np.ndarray:
    """Seconds of ``matrix`` the reported step may not pay; ``forward``: the edge's forward moves for one
    layer copy (needed when ``record.gathers`` or ``record.sync``)."""
    hide = np.zeros_like(matrix)
    if record.gathers and forward is not None:
        hide = forward * (record.copies - 1) * (1 + record.share)
    if record.sync and forward is not None:  # all but its forward moves (and their re-gathers): the sync
        hide = np.where(np.isfinite(matrix), np.maximum(matrix - forward * (1 + record.share), 0.0), 0.0)
    if record.consumers > 1:
        hide = np.where(np.isfinite(matrix), matrix - (matrix - hide) / record.consumers, 0.0)
    return hide
