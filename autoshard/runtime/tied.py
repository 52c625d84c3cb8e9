"""Tied weights across pipeline stages: the embedding group's gradient all-reduce, as Megatron-LM runs it.

Input: the stages (:class:`~autoshard.runtime.stages.StageBuild`; a stage holding a copy of a weight another
stage also holds lists it in ``StageBuild.tied``, e.g. GPT-2's ``transformer.wte.weight`` on the first stage
and its copy ``lm_head.weight`` on the last) and the stage modules this rank runs.
Output: :class:`TiedSync` records (:func:`tied_groups`, a collective: every rank calls it, in the same order)
and, every step after the stages' own gradient synchronisation, the copies' gradients summed
(:func:`sum_tied`): locally when one rank holds both copies (ZB-V puts the first and last stage on one
pipeline rank), then over the *embedding group* -- the ranks at the same intra-stage coordinate of every
stage holding a copy -- with one all-reduce.  The copies start equal and receive the same summed gradient,
so any ``torch.optim`` optimizer keeps them equal: the gradient of the tied weight of the single-device model.

The planner prices this all-reduce (``Plan.collectives``: ``backward all_reduce`` on the pipeline axis, for
the tied weight) with :func:`autoshard.pipeline.schedules.tied_sync_time`.

Example (inside :func:`autoshard.runtime.pipelining.build_pipeline` and ``step``)::

    tied = tied_groups(builds, mine)      # every rank
    ...schedule.step(...); sync_gradients(...)
    sum_tied(modules, tied, log)          # log: (weight, bytes, ranks) per all-reduce run
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from autoshard.runtime.stages import StageBuild

__all__ = ["TiedSync", "sum_tied", "tied_groups"]


@dataclass(frozen=True)
class TiedSync:
    """One tied weight on this rank: its copies in this rank's modules and the group that sums them."""

    name: str  # the plan's name of the weight (its first name in the model)
    copies: tuple[tuple[int, str], ...]  # (index into this rank's modules, parameter name there)
    ranks: tuple[int, ...]  # the embedding group: this coordinate's rank of every stage holding a copy
    group: Any  # its ProcessGroup; None when this rank holds every copy


def tied_groups(builds: Sequence[StageBuild], mine: Sequence[StageBuild]) -> tuple[TiedSync, ...]:
    """This rank's :class:`TiedSync` records (module doc).  Every rank must call it: it creates the groups."""
    me = dist.get_rank()
    holders: dict[str, list[StageBuild]] = {}
    for b in builds:
        for _, name in b.tied:
            holders.setdefault(name, []).append(b)
    found = []
    for name, stages in holders.items():
        group: Any = None
        ranks: tuple[int, ...] = ()
        for j in range(len(stages[0].ranks)):  # one group per intra-stage coordinate
            column = tuple(sorted({s.ranks[j] for s in stages}))
            made = dist.new_group(list(column)) if len(column) > 1 else None  # collective: every rank
            if me in column:
                group, ranks = made, column
        copies = tuple((k, local) for k, b in enumerate(mine) for local, planned in b.tied if planned == name)
        if copies:
            found.append(TiedSync(name, copies, ranks, group))
    return tuple(found)


def sum_tied(
    modules: Sequence[nn.Module], tied: Sequence[TiedSync], log: list[tuple[str, int, tuple[int, ...]]]
) -> None:
    """Give every copy of each tied weight the sum of the copies' gradients (module doc); ``log`` gets one
    ``(weight, bytes, ranks)`` entry per all-reduce run."""
    for t in tied:
        params = [modules[k].get_parameter(local) for k, local in t.copies]
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        total = torch.stack(grads).sum(0) if len(grads) > 1 else grads[0].clone()
        if t.group is not None:
            dist.all_reduce(total, group=t.group)
            log.append((t.name, total.numel() * total.element_size(), t.ranks))
        for p in params:
            if p.grad is None:
                p.grad = total.clone()
            else:
                p.grad.copy_(total)
