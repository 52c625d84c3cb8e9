"""``microbatches="auto"`` without pipeline stages: every microbatch count priced, the fastest plan kept.

Input: ``plan_at(count, ceiling)``, which plans the model with ``count`` microbatches (gradient accumulation;
``None``: one microbatch, the intra-op planner's own path) and raises
:class:`~autoshard.search.BoundExceeded` when a proven lower bound on that count's step reaches ``ceiling``;
the global batch; the caller's ceiling (the mesh search's best step, or infinity).
Output: the fastest plan over the counts, with a note that lists every count and what became of it (priced,
pruned by a bound, refused).

Which counts.  Every divisor of the global batch, ascending.  A count must also give every data-parallel
replica whole samples of each microbatch (:func:`~autoshard.pipeline.options.whole_samples`), but the number
of replicas is the plan's own choice, so it is known only once a count is planned: a count whose plan splits
the batch unevenly is refused exactly as when it is pinned, and listed.

One microbatch is planned by the same path as the default (``microbatches=None``): budgeted CP-SAT, per-block
recomputation mixes and ranking by the critical-path step (:mod:`autoshard.planner`).  So ``"auto"`` is never
slower than the default; nor than a pinned count ``m > 1``, which is planned by the same call as here.

Pruning (why it is sound).  A count ``m > 1`` is planned with the best step so far as its ceiling.  Its plan
(:func:`~autoshard.pipeline.search.search_pipeline` with one stage) is refused unsolved only when
:func:`~autoshard.pipeline.search.compute_floor` reaches that ceiling: every plan of ``m`` microbatches
computes each op ``m`` times at one microbatch's shapes, at least at its cheapest strategy, and the step is
at least that compute (communication and recomputation only add to it).  So a pruned count has no plan faster
than one already found, and the kept plan is the fastest over every count that was not refused.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from autoshard.errors import AutoshardError, InfeasibleError, PipelineError
from autoshard.pipeline.options import divisors
from autoshard.plans import Plan
from autoshard.search import BoundExceeded

__all__ = ["COUNTS_NOTE", "plan_counts"]

COUNTS_NOTE = "microbatch counts searched (microbatches='auto'): "
"""The note's prefix; :mod:`autoshard.report.proof` reads it to tell a searched count from a fixed one."""

PlanAt = Callable[[int | None, float], Plan]


def plan_counts(plan_at: PlanAt, batch: int, ceiling: float = math.inf) -> Plan:
    """The fastest plan over every count that divides ``batch`` (module docstring); ties keep fewer
    microbatches.  Raises BoundExceeded when every count is pruned by ``ceiling`` or refused, else the refusal
    of one microbatch when no count fits."""
    best: Plan | None = None
    lines: list[str] = []
    refusals: list[AutoshardError] = []
    bounds: list[float] = []
    for count in divisors(max(1, batch)):
        limit = ceiling if best is None else min(ceiling, best.predicted_step_time)
        try:
            found = plan_at(None if count == 1 else count, limit)
        except BoundExceeded as e:
            bounds.append(e.bound)
            lines.append(f"{count}: at least {e.bound:.4g} s (a proven lower bound), not solved")
            continue
        except (InfeasibleError, PipelineError) as e:
            refusals.append(e)
            lines.append(f"{count}: refused ({_first_clause(e)})")
            continue
        lines.append(f"{count}: {found.predicted_step_time:.4g} s")
        if best is None or found.predicted_step_time < best.predicted_step_time * (1 - 1e-12):
            best = found
    if best is None:
        if bounds:
            raise BoundExceeded(min(bounds), ceiling)
        raise refusals[0]
    note = COUNTS_NOTE + "; ".join(lines) + f"; kept {best.microbatches}"
    return dataclasses.replace(best, notes=(*best.notes, note))


def _first_clause(error: Exception) -> str:
    """The error's first clause, short enough for one note item."""
    text = " ".join(str(error).split())
    return text.split("; ")[0][:160]
