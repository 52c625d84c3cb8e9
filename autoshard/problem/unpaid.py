"""What the reported step may not pay of an edge's linear price: the part a lower bound leaves out.

Input: one edge's price matrix as the solver sees it (seconds, ``[S_u, S_v]``) and its :class:`Unpaid`
record (``BuiltProblem.hidden``, written by the builder).  Output: the seconds to subtract so that the linear
objective bounds every plan's reported (critical-path) step from below (:mod:`autoshard.planner_rerank`
solves that problem).

Two reasons, both as :mod:`autoshard.problem.step` and :mod:`autoshard.problem.extract` report a plan:

* a repeated layer's parameter gathers (FSDP forward gathers, backward re-gathers) are priced on each of
  the ``copies`` layers, and prefetch exposes at least one copy: all but one may be hidden;
* a move that ``consumers`` uses of one tensor may share is priced once per use (too many layouts for an
  exact fan-out node), and runs once per distinct layout: at least the dearest use, so at least ``1/m`` of
  their sum.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Unpaid", "unpaid"]


@dataclass(frozen=True, slots=True)
class Unpaid:
    """An edge of the search problem that the reported step may not pay in full.

    ``edge``: its index in ``SearchProblem.edges``; ``use``: (producer, consumer, output, input position)
    of the builder's weighted use; ``copies``: its weight (layer copies); ``share``: how often backward
    re-runs its forward moves (FSDP re-gather, recomputation); ``consumers``: uses that may share its move;
    ``gathers``: its forward moves are a repeated layer's parameter gathers that prefetch hides."""

    edge: int
    use: tuple[str, str, int, int]
    copies: int
    share: float
    consumers: int
    gathers: bool


def unpaid(matrix: np.ndarray, forward: np.ndarray | None, record: Unpaid) -> np.ndarray:
    """Seconds of ``matrix`` the reported step may not pay; ``forward``: the edge's forward moves for one
    layer copy (needed when ``record.gathers``)."""
    hide = np.zeros_like(matrix)
    if record.gathers and forward is not None:
        hide = forward * (record.copies - 1) * (1 + record.share)
    if record.consumers > 1:
        hide = np.where(np.isfinite(matrix), matrix - (matrix - hide) / record.consumers, 0.0)
    return hide
