"""The pipeline pins a user gives, checked, and the candidates the search walks.

``autoshard.plan(..., pipeline="auto" | int | None, microbatches=None | "auto" | int, schedule="auto" | name)``:

- ``pipeline``: ``None`` plans without stages; an int pins the degree; ``"auto"`` tries every degree that
  divides the nodes (stages go across nodes, each stage keeps whole nodes) and the layers (identical layers
  split evenly), with at least two layers a stage.  A
  pinned degree that does not divide the nodes but divides a single node's devices puts stages inside it.
- ``microbatches``: ``None`` (the default) is 1 without stages and, with ``p`` stages, the smallest count of at
  least ``2 p`` that divides the global batch (:func:`default_microbatches`; the whole batch, one sample
  each, when none does), said in the plan's notes; an int pins the count (it must divide the global batch);
  ``"auto"`` tries the whole batch
  (``1``) and one microbatch size for every degree that leaves at least as many microbatches as stages
  (:func:`~autoshard.pipeline.search.microbatch_sizes`: each size costs a capture and a build per degree).
- ``schedule``: a :class:`~autoshard.pipeline.schedules.Schedule` value or ``"auto"`` (all of them); a
  schedule without stages is refused.
- microbatches and data parallelism (:func:`whole_samples`): every data-parallel replica gets whole samples
  of every microbatch (Megatron-LM's global batch = micro-batch x data-parallel size x microbatches), so the
  count must divide ``batch / replicas``; a pinned count that does not is refused, a searched or default one
  is re-planned with the most microbatches that fit.
- stage cuts: an annotation whose value is ``"stage"`` on a repeated layer (``{"model.layers.24": "stage"}``)
  starts a stage (a model chunk) at that layer; the pins fix every cut, so give ``S·v − 1`` of them.

Every bad value raises :class:`~autoshard.errors.PipelineError` naming the value and what fits.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from autoshard.errors import PipelineError
from autoshard.pipeline.schedules import Schedule
from autoshard.plans import Plan

__all__ = [
    "MICROBATCHES_PER_STAGE",
    "STAGE_PIN",
    "PipelineRequest",
    "check_request",
    "default_microbatches",
    "divisors",
    "split_cut_pins",
    "whole_samples",
]

STAGE_PIN = "stage"
"""Annotation value that starts a pipeline stage at a repeated layer."""


MICROBATCHES_PER_STAGE = 2
"""Default microbatches per pipeline stage.  The bubble (p−1)/(m+p−1) of p stages and m microbatches is
under a third at m = 2p (it is ~50% at m = p = 2 and 1/2 for m = 1, p = 2); torchtitan warns when there are
fewer microbatches than stages (its ``build_pipeline_schedule``), and Megatron-LM's
interleaved schedule requires the count to be a multiple of the stages (Narayanan et al. 2021, §2.2)."""


@dataclass(frozen=True, slots=True)
class PipelineRequest:
    """What the user pinned, validated: ``None`` fields are searched."""

    degree: int | None  # None: search; 1 with no stages
    microbatches: int | None  # None: searched ("auto") or, with ``by_default``, default_microbatches(p)
    schedules: tuple[Schedule, ...]
    cuts: tuple[int, ...]  # layer indices where a chunk starts (pinned), sorted
    by_default: bool = False  # microbatches not given: default_microbatches of each degree

    def counts(self, degree: int, batch: int) -> int | None:
        """The microbatch count to price with ``degree`` stages; ``None``: search them."""
        return default_microbatches(degree, batch) if self.by_default else self.microbatches


def default_microbatches(stages: int, batch: int) -> int:
    """1 without stages; else the smallest divisor of ``batch`` of at least ``MICROBATCHES_PER_STAGE ×
    stages``, or ``batch`` itself (microbatches of one sample) when it has none that large."""
    if stages <= 1:
        return 1
    want = MICROBATCHES_PER_STAGE * stages
    return next((d for d in divisors(batch) if d >= want), batch)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _both_limits(size: int, layers: int) -> str:
    """Why a divisor of ``size`` is missing from the suggested degrees: a stage needs a repeated layer of its
    own (new-user trial: llama-tiny's 2 layers on 8 devices offered [1, 2], yet 4 and 8 divide 8 too)."""
    if all(d <= max(1, layers) for d in divisors(size)):
        return ""
    return f" (a degree must divide {size} and be at most the model's {layers} repeated layers)"


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_request(
    pipeline: int | str | None,
    microbatches: int | str | None,
    schedule: str,
    *,
    batch: int,
    layers: int,
    devices: int,
    nodes: int,
    cuts: tuple[int, ...] = (),
    outer: int | None = None,
) -> PipelineRequest:
    """Validate the pins against the model and cluster (the one-line errors of the module docstring).

    ``outer``: the size of the outermost mesh axis, which the stages are laid along; the degrees suggested in
    an error are the ones that divide it (default: the device count).
    """
    if pipeline is None:
        degree: int | None = 1
    elif pipeline == "auto":
        degree = None
    elif _whole(pipeline) and pipeline >= 1:  # type: ignore[operator]
        degree = int(pipeline)
        if degree > 1 and layers == 0:  # new-user trial: an MLP read "the model's 0 repeated layers"
            raise PipelineError(
                f"pipeline={degree}: the model has no repeated layers, and stages are cut between them; "
                "plan it without pipeline stages"
            )
        # stages hold whole nodes across nodes (pipeline/search.py layout), so more than one node limits them
        fits = [
            d for d in divisors(outer or devices) if d <= max(1, layers) and (nodes <= 1 or nodes % d == 0)
        ]
        if (outer or devices) % degree:  # new-user trial: "do not divide the 16 devices" when 4 and 8 do
            why = (
                f"the stages are laid along the outermost mesh axis, of size {outer}, which {degree} does not divide"
                if outer
                else f"{degree} stages do not divide the {devices} devices"
            )
            raise PipelineError(
                f"pipeline={degree}: {why}; use one of {fits}" + _both_limits(outer or devices, layers)
            )
        if degree > max(1, layers):
            raise PipelineError(
                f"pipeline={degree}: more stages than the model's {layers} repeated layers; use at most "
                f"{layers} (one of {fits})"
            )
    else:
        raise PipelineError(f"pipeline={pipeline!r}: use 'auto', None or a whole number of stages >= 1")
    by_default = microbatches is None
    if microbatches == "auto" or microbatches is None:
        count: int | None = None
    elif _whole(microbatches) and microbatches >= 1:  # type: ignore[operator]
        count = int(microbatches)
        if batch % count:
            raise PipelineError(
                f"microbatches={count} does not divide the global batch of {batch}; use one of "
                f"{divisors(batch)}"
            )
    else:
        raise PipelineError(f"microbatches={microbatches!r}: use 'auto' or a whole number >= 1")
    names = [s.value for s in Schedule]
    if schedule == "auto":
        schedules = tuple(Schedule)
    elif schedule in names:
        schedules = (Schedule(schedule),)
    else:
        raise PipelineError(f"schedule={schedule!r} is unknown; use 'auto' or one of {', '.join(names)}")
    if degree == 1 and schedule != "auto" and not cuts:
        raise PipelineError(
            f"schedule={schedule!r} orders pipeline stages, and the plan has none (pipeline={pipeline!r}): "
            "pass pipeline=N or pipeline='auto', or leave schedule='auto'"
        )
    return PipelineRequest(degree, count, schedules, tuple(sorted(set(cuts))), by_default)


def split_cut_pins(
    annotations: Mapping[str, Any] | None, prefix: str | None, layers: int
) -> tuple[dict[str, Any] | None, tuple[int, ...]]:
    """Take the ``"stage"`` pins out of ``annotations``: (the rest, the layer indices where stages start)."""
    if not annotations:
        return (dict(annotations) if annotations is not None else None), ()
    rest: dict[str, Any] = {}
    cuts: list[int] = []
    for name, value in annotations.items():
        if not (isinstance(value, str) and value == STAGE_PIN):
            rest[name] = value
            continue
        cuts.append(_cut_of(name, prefix, layers))
    return rest, tuple(sorted(set(cuts)))


def _cut_of(name: str, prefix: str | None, layers: int) -> int:
    if prefix is None:
        raise PipelineError(
            f"annotation {name!r}: 'stage' pins a cut at a repeated layer, but the model has no repeated "
            f"layers to cut"
        )
    match = re.fullmatch(rf"{re.escape(prefix)}\.(\d+)(\..+)?", name)
    if match is None:
        raise PipelineError(
            f"annotation {name!r}: a stage can only start at a repeated layer; name one of "
            f"{prefix}.1 .. {prefix}.{layers - 1}"
        )
    if match.group(2):
        raise PipelineError(
            f"annotation {name!r}: a cut inside a layer is not possible; pin the whole layer "
            f"{prefix}.{match.group(1)} (a stage starts at a layer boundary)"
        )
    index = int(match.group(1))
    if not 1 <= index < layers:
        raise PipelineError(
            f"annotation {name!r}: layer {index} cannot start a stage; use {prefix}.1 .. {prefix}.{layers - 1}"
        )
    return index


def whole_samples(planned: Callable[..., Plan], microbatches: int | str | None) -> Plan:
    """``planned(microbatches=...)``, with whole samples for every data-parallel replica (module doc).

    A pinned count that leaves a replica a fraction of a sample raises :class:`PipelineError`; ``"auto"`` or
    the default is planned again once with the largest count that fits, and the notes say so."""
    plan = planned(microbatches=microbatches)
    gap = _replica_gap(plan)
    if gap is None:
        return plan
    batch, replicas, fits = gap
    if _whole(microbatches):
        raise PipelineError(
            f"microbatches={microbatches}: the plan splits the batch of {batch} over {replicas} data-parallel "
            f"replicas, {batch // replicas} samples each, which {microbatches} microbatches do not divide; use one "
            f"of {fits}"
        )
    again = planned(microbatches=fits[-1])
    if _replica_gap(again) is not None:
        raise PipelineError(
            f"microbatches={microbatches!r}: neither {plan.microbatches} nor {fits[-1]} microbatches give each "
            f"data-parallel replica whole samples of the batch of {batch}; pin microbatches= (one of {fits})"
        )
    note = (
        f"microbatches: {fits[-1]}, the most that give each of the {replicas} data-parallel replicas whole "
        f"samples of the batch of {batch} ({plan.microbatches} would not); pin microbatches= to choose"
    )
    return dataclasses.replace(again, notes=(*again.notes, note))


def _replica_gap(plan: Plan) -> tuple[int, int, list[int]] | None:
    """(batch, replicas, counts that fit) when ``plan.microbatches`` leaves a replica a fraction of a sample."""
    batch = max((shape[0][0] for shape in plan.input_shapes.values() if shape and shape[0]), default=0)
    replicas = plan.degrees.get("dp", 1) * plan.degrees.get("fsdp", 1)
    if plan.microbatches <= 1 or not batch or batch % (plan.microbatches * replicas) == 0:
        return None
    return batch, replicas, [d for d in divisors(batch) if d == 1 or batch % (d * replicas) == 0]
