"""One intra-op plan's fastest schedule and cut: the stage DP over every shape torch can run.

Input: the :class:`~autoshard.pipeline.options.PipelineRequest`, the degree and microbatches of a candidate,
its :class:`~autoshard.problem.build.BuiltProblem`, one :class:`~autoshard.search.Solution` of it and the
per-device memory budget.  Output: the fastest :class:`~autoshard.pipeline.stages.StageSplit` that fits, or
None.  Split out of :mod:`autoshard.pipeline.search` so that :mod:`autoshard.pipeline.refit` prices the plans it
tries exactly as the search prices its own.
"""

from __future__ import annotations

import dataclasses

from autoshard.errors import PipelineError
from autoshard.pipeline.layers import boundary_bytes, part_costs
from autoshard.pipeline.options import PipelineRequest
from autoshard.pipeline.schedules import (
    Schedule,
    p2p_time,
    recompute_refused,
    tied_sync_time,
    torch_refuses,
    virtual_stage_options,
)
from autoshard.pipeline.stages import StageSplit, best_split
from autoshard.problem.build import BuiltProblem
from autoshard.problem.costs import Recompute
from autoshard.search import Solution

__all__ = ["enough_layers", "fastest_split", "priced_shapes", "stage_shapes"]


def fastest_split(
    request: PipelineRequest,
    degree: int,
    link: tuple[float, float],
    built: BuiltProblem,
    count: int,
    budget: float,
    refused: list[str],
    solution: Solution,
) -> StageSplit | None:
    """The fastest schedule and cut of ``solution`` that fits ``budget``, or None; ``link``: the inter-stage
    (bandwidth, latency); what torch refuses is appended to ``refused``."""
    costs = part_costs(built, solution)
    hop = p2p_time(boundary_bytes(built, solution), *link)
    tied = tied_sync_time(costs.tied_bytes, *link)  # embedding group
    costs = dataclasses.replace(costs, p2p_seconds=hop, tied_sync=tied)
    enough_layers(request.schedules, degree, costs.layers)
    best: StageSplit | None = None
    for schedule in request.schedules:
        for v in virtual_stage_options(schedule, degree, costs.layers):
            why = torch_refuses(schedule, degree, v, count) or recompute_refused(
                schedule, built.options.recompute.value
            )
            if why is not None:  # priced only what torch.distributed.pipelining can run
                refused.append(why)
                continue
            if request.cuts and len(request.cuts) != degree * v - 1:
                continue
            split = best_split(costs, schedule, degree, v, count, budget, request.cuts)
            if split is not None and (best is None or split.step_seconds < best.step_seconds):
                best = split
    return best


def stage_shapes(
    request: PipelineRequest, degree: int, count: int, layers: int
) -> list[tuple[Schedule, int]]:
    """The (schedule, chunks per device) pairs torch can run for this candidate (any recomputation)."""
    return [
        (schedule, v)
        for schedule in request.schedules
        for v in virtual_stage_options(schedule, degree, layers)
        if torch_refuses(schedule, degree, v, count) is None
        and (not request.cuts or len(request.cuts) == degree * v - 1)
    ]


def priced_shapes(shapes: list[tuple[Schedule, int]], recompute: Recompute) -> list[tuple[Schedule, int]]:
    """Of :func:`stage_shapes`, the pairs :func:`fastest_split` prices under ``recompute``: it refuses the
    zero-bubble schedules with recomputation (:func:`~autoshard.pipeline.schedules.recompute_refused`), so
    no plan of a recomputing candidate runs on them and a bound over its steps may leave them out.  (With
    them, LLaMA-3 405B's full recomputation was bounded by ZB-V's bubble-free factor, 13.91 s, under the
    15.93 s of selective recomputation, and solved for ~17 s CPU; without, 17.11 s: pruned.)"""
    return [(s, v) for s, v in shapes if recompute_refused(s, recompute.value) is None]


def enough_layers(schedules: tuple[Schedule, ...], degree: int, layers: int) -> None:
    """PipelineError when no asked schedule can lay ``layers`` layers on ``degree`` stages: an interleaved
    schedule runs at least 2 chunks per stage, each of a layer or more (it read "no schedule and cut fits the
    memory" for LLaMA-tiny's 2 layers on 2 stages with zb_v, where gpipe fit easily)."""
    if any(virtual_stage_options(s, degree, layers) for s in schedules):
        return
    names = ", ".join(s.value for s in schedules)
    raise PipelineError(
        f"schedule {names} cannot run {degree} stages x 2 chunks on {layers} layers (each chunk needs a layer, "
        f"so at least {2 * degree}): use fewer stages (at most {layers // 2}; 1 is no pipeline), a "
        "non-interleaved schedule (--schedule gpipe or 1f1b) or a model with more layers"
    )
