"""Run a plan with pipeline stages: each stage's autoshard module driven by ``torch.distributed.pipelining``.

Input: the model (real weights, the same on every rank), a :class:`~autoshard.plans.Plan` whose ``pipeline``
and ``microbatches`` are set, the global example inputs of one step and a loss; called on every rank of an
initialised default process group (gloo on CPU, NCCL on GPU: the device follows the backend).
Output: a :class:`PipelineRun` -- torch's ``Schedule*`` object driving this rank's ``PipelineStage`` s, the
stage modules (``fx.GraphModule`` s from :func:`autoshard.parallelize`, intra-op collectives included) and the
device mesh.  :func:`step` runs one training step on the global batch and returns the global loss.

Steps (:func:`build_pipeline`):

1. the stages' modules and intra-op plans (:func:`autoshard.runtime.stages.prepare_stages`; pass ``stages=``
   to reuse ones prepared before forking ranks);
2. a ``DeviceMesh`` ``(pp, *intra)`` laid over the stages' ranks: row ``p`` holds the ranks of stage ``p``;
   its ``pp`` axis groups carry the activations between stages, the intra axes the stage's own collectives;
3. every stage this rank holds is lowered by :func:`autoshard.parallelize` on the intra sub-mesh and wrapped
   in ``PipelineStage`` with its local microbatch input and output shapes (no shape-inference round trip);
4. the schedule named by ``plan.pipeline.schedule`` (:data:`SCHEDULES`): ``ScheduleGPipe``, ``Schedule1F1B``
   (one stage per rank), ``ScheduleInterleaved1F1B``, ``ScheduleInterleavedZeroBubble`` (stage ``s`` on pipeline
   rank ``s % pp``) or ``ScheduleZBVZeroBubble`` (V order: stage ``s`` and ``2 pp - 1 - s`` share a rank).

Loss and gradient accumulation as torch's pipelining expects: ``loss_fn(output, target)`` is a *mean* over
the microbatch (``F.cross_entropy``'s default) and the schedule divides the accumulated gradients by the number
of microbatches (``scale_grads=True``), so the gradients are those of the mean loss of the whole batch.  When
the last stage's output is split over the batch inside its sub-mesh, each rank's loss is weighted by its
share of the microbatch (the gradient of the global mean, as autoshard's gradients of split outputs are).
The loss reads the last stage's output whole or split over the batch only: logits the plan leaves split
over the vocabulary (a column-split LM head) or partial are first redistributed to that layout by the steps
:mod:`autoshard.redistribute` plans (an all-gather forward, this rank's slice of the gradient backward),
run through the stage's own collective log and shown in ``PipelineRun.loss_steps``.

The batch is cut into microbatches *before* it is split over a stage's ranks (:func:`local_batch`), so that
microbatch ``k`` is the same rows of the global batch whatever the intra-op split.  Replicated parameters
synchronise their gradients once per step, after the last microbatch (:mod:`autoshard.runtime.grad_sync`
takes their all-reduces out of the stage graph's backward; ``sync_once=False`` keeps one per microbatch);
gathered (FSDP) parameters accumulate their whole gradient over the microbatches and reduce-scatter it once
per step, as priced.  A :class:`~autoshard.runtime.zero.ZeroOptimizer` over a stage module reduce-scatters
the deferred sums itself (ZeRO-1 combines with pipelining: the same pass, one record).  Weights tied across
stages (GPT-2's embedding and head) then sum their copies' gradients (:mod:`autoshard.runtime.tied`).

Example (on every rank, e.g. under ``torchrun``)::

    init_from_env()
    run = build_pipeline(model, plan, (ids,), loss_fn=lambda logits, y: F.cross_entropy(logits.flatten(0, 1),
                                                                                         y.flatten()))
    optimizer = torch.optim.AdamW(run.parameters())
    loss = step(run, ids, target=labels)      # the global loss on the last stage's ranks, else None
    optimizer.step(); optimizer.zero_grad()

Checkpoints: :func:`full_state_dict` gives the whole model's state dict on every rank (each stage module is
an :func:`autoshard.parallelize` module, gathered over its own ranks, then merged over the pipeline ranks).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch import fx, nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    ScheduleZBVZeroBubble,
)

from autoshard.codegen.collectives import format_steps, redistribute
from autoshard.codegen.parallelize import parallel_info, parallelize
from autoshard.codegen.shard import local_piece, spec_of
from autoshard.pipeline.schedules import Schedule, device_of_chunk
from autoshard.placement import Partial, Replicate, Shard, ShardingSpec
from autoshard.plans import Plan
from autoshard.redistribute import plan_redistribute
from autoshard.runtime.grad_sync import DeferredSync, defer_gradient_sync, sync_gradients
from autoshard.runtime.reshard import reshard_after_forward
from autoshard.runtime.stages import PipelineRunError, StageBuild, intra_layout, prepare_stages
from autoshard.runtime.tied import TiedSync, sum_tied, tied_groups

__all__ = [
    "SCHEDULES",
    "PipelineRun",
    "PipelineRunError",
    "build_pipeline",
    "full_state_dict",
    "local_batch",
    "step",
]

Order = Literal["loop", "v"]
SCHEDULES: dict[str, tuple[type, Order]] = {
    "gpipe": (ScheduleGPipe, "loop"),
    "1f1b": (Schedule1F1B, "loop"),
    "interleaved_1f1b": (ScheduleInterleaved1F1B, "loop"),
    "interleaved_zb": (ScheduleInterleavedZeroBubble, "loop"),
    "zb_v": (ScheduleZBVZeroBubble, "v"),
}
"""Schedule name (``PipelinePlan.schedule``) -> torch class and how stages map to pipeline ranks."""
_SINGLE = ("gpipe", "1f1b")


@dataclass(frozen=True)
class PipelineRun:
    """What :func:`build_pipeline` returns on one rank."""

    schedule: Any  # a torch.distributed.pipelining Schedule* object
    modules: tuple[fx.GraphModule, ...]  # this rank's stage modules, in stage order
    stage_indices: tuple[int, ...]
    mesh: Any  # DeviceMesh (pp, *intra)
    plan: Plan
    microbatches: int
    input_spec: ShardingSpec  # of the first stage's input on the intra sub-mesh
    output_spec: ShardingSpec  # of the last stage's output as the loss reads it (batch split at most)
    is_first: bool
    is_last: bool
    device: torch.device  # where this rank computes (inputs and targets go there)
    deferred: tuple[tuple[DeferredSync, ...], ...] = ()  # per module: gradient syncs run once per step
    loss_steps: str = ""  # what the last stage runs on its output for the loss (e.g. an all-gather of logits)
    tied: tuple[TiedSync, ...] = ()  # weights tied across stages: their copies' gradients summed every step
    tied_log: list[tuple[str, int, tuple[int, ...]]] = field(default_factory=list)  # (weight, bytes, ranks)
    stages: tuple[Any, ...] = ()  # this rank's torch ``PipelineStage`` s, in the order of ``modules``

    def parameters(self) -> list[torch.nn.Parameter]:
        """This rank's parameters (every stage it holds), for a ``torch.optim`` optimizer."""
        return [p for m in self.modules for p in m.parameters()]


def build_pipeline(
    model: torch.nn.Module,
    plan: Plan,
    example_args: tuple[Any, ...] | Any,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    *,
    annotations: Mapping[str, Any] | None = None,
    stages: Sequence[StageBuild] | None = None,
    device: torch.device | str | None = None,
    record: bool = False,
    sync_once: bool = True,
) -> PipelineRun:
    """This rank's pipeline under ``plan`` (module doc).

    Args:
        annotations: those the plan was made with (each stage is planned with the ones naming its modules).
        stages: from :func:`prepare_stages` (same model, plan and inputs), to skip re-planning the stages.
        device: where this rank computes; default ``cuda`` under NCCL, else ``cpu``.
        record: log every intra-op collective (``module.autoshard.comm.log`` of each stage module).
        sync_once: synchronise replicated parameters' gradients once per step, after the last microbatch
            (:mod:`autoshard.runtime.grad_sync`; as the planner prices it), rather than in every microbatch's
            backward.

    Raises:
        PipelineRunError: no pipeline in the plan, a stage module the model lacks, microbatches that do not
        divide the batch, an unknown schedule, stages laid out unlike the schedule, too few ranks.
    """
    from autoshard.runtime.launch import default_device

    pipe = plan.pipeline
    if pipe is not None and pipe.schedule not in SCHEDULES:
        raise PipelineRunError(f"unknown pipeline schedule {pipe.schedule!r}: use one of {sorted(SCHEDULES)}")
    builds = tuple(stages) if stages is not None else prepare_stages(model, plan, example_args, annotations)
    assert pipe is not None  # prepare_stages checked it
    cls, order = SCHEDULES[pipe.schedule]
    intra, _ = intra_layout(plan)
    mesh = _pipeline_mesh(builds, pipe.degree, intra, order, default_device().type)
    where = torch.device(device) if device is not None else default_device()
    coord = mesh.get_coordinate()
    mine = [b for b in builds if _rank_of(b.index, pipe.degree, order) == coord[0]]
    intra_mesh = mesh[tuple(mesh.mesh_dim_names[1:])]
    last = builds[-1]
    output_spec = _loss_layout(spec_of(last.plan.output_placements[0]))
    loss_steps = ""
    modules, pstages, deferred = [], [], []
    for b in mine:
        module = parallelize(
            b.module, b.plan, (b.example,), mesh=intra_mesh, captured=b.captured, device=where, record=record
        )
        if plan.overlap.reshard_after_forward:  # FSDP weights freed after use, as priced (no-op without)
            reshard_after_forward(module)
        modules.append(module)
        deferred.append(defer_gradient_sync(module, gathered=True) if sync_once else ())
        planned_out = spec_of(b.plan.output_placements[0])
        out_spec = output_spec if b is last else planned_out
        runs: nn.Module = module
        if b is last:
            runs = _LossLayout(module, last.output, planned_out, output_spec)
            loss_steps = runs.steps[0]
        pstages.append(
            PipelineStage(
                runs,
                b.index,
                len(builds),
                where,
                input_args=_local(
                    b.example, b.plan.input_placements[_input_name(b)], intra, coord[1:], where
                ),
                output_args=_local(
                    b.output, tuple(str(p) for p in out_spec.placements), intra, coord[1:], where
                ),
                group=mesh.get_group(0),
            )
        )
    scaled = _scaled_loss(loss_fn, output_spec, intra)
    single = pipe.schedule in _SINGLE
    if single != (len(pstages) == 1):
        raise PipelineRunError(
            f"schedule {pipe.schedule!r} runs {'one stage' if single else 'several stages'} per rank, the plan puts "
            f"{len(pstages)} on pipeline rank {coord[0]}: use {'interleaved_1f1b' if not single else '1f1b'}"
        )
    try:
        schedule = cls(pstages[0] if single else pstages, plan.microbatches, loss_fn=scaled)
    except ValueError as e:  # torch's own limits (microbatches per round, stages per rank): one line
        reason = " ".join(str(e).split())
        raise PipelineRunError(
            f"torch's {cls.__name__} refuses {plan.microbatches} microbatches over {len(builds)} stages "
            f"({reason}): change plan.microbatches or the stages"
        ) from e
    return PipelineRun(
        schedule,
        tuple(modules),
        tuple(b.index for b in mine),
        mesh,
        plan,
        plan.microbatches,
        spec_of(builds[0].plan.input_placements[_input_name(builds[0])]),
        output_spec,
        any(b.index == 0 for b in mine),
        any(b.index == len(builds) - 1 for b in mine),
        where,
        tuple(deferred),
        loss_steps,
        tied_groups(builds, mine),
        stages=tuple(pstages),
    )


def step(run: PipelineRun, inputs: torch.Tensor, target: torch.Tensor) -> torch.Tensor | None:
    """One training step on the *global* batch: forward, loss and backward of every microbatch; gradients
    accumulate in the stage modules' parameters (zero them before, step the optimizer after).

    Returns the loss of the whole batch (mean of the microbatches' losses) on the last stage's ranks, ``None``
    on the others.  Every rank passes the same global ``inputs`` and ``target``.
    """
    # this rank's place in a stage's sub-mesh, and context parallelism's layout there (every stage keeps it)
    where = (tuple(run.mesh.shape[1:]), tuple(run.mesh.get_coordinate()[1:]), run.plan.stage_zigzag_axis)
    cut = lambda x, spec: local_batch(x, spec, run.microbatches, *where).to(run.device)  # noqa: E731
    args = (cut(inputs, run.input_spec),) if run.is_first else ()
    local_target = cut(target, run.output_spec)
    losses: list[torch.Tensor] = []
    run.schedule.step(*args, target=local_target if run.is_last else None, losses=losses)
    scale = run.microbatches if getattr(run.schedule, "scale_grads", True) else 1  # as torch scaled .grad
    for module, deferred in zip(run.modules, run.deferred, strict=True):
        sync_gradients(module, deferred, scale=scale)
    sum_tied(run.modules, run.tied, run.tied_log)  # after the stages' own sync, as Megatron-LM does
    if not run.is_last:
        return None
    loss = torch.stack([t.detach() for t in losses]).mean()
    for axis in _batch_axes(run.output_spec):  # each rank weighted its share: the global loss is their sum
        dist.all_reduce(loss, group=run.mesh.get_group(axis + 1))
    return loss


def full_state_dict(run: PipelineRun) -> dict[str, torch.Tensor]:
    """The whole model's state dict on every rank, under the model's names (a collective of all ranks):
    each stage gathers its weights over its own ranks, then the pipeline ranks exchange theirs."""
    from autoshard.codegen.parallelize import full_state_dict as stage_state

    mine: dict[str, torch.Tensor] = {}
    for module in run.modules:
        mine.update(stage_state(module))
    parts: list[Any] = [None] * int(run.mesh.shape[0])
    dist.all_gather_object(parts, mine, group=run.mesh.get_group(0))
    return {k: v for part in parts for k, v in part.items()}


def local_batch(
    batch: torch.Tensor,
    spec: ShardingSpec,
    microbatches: int,
    mesh_shape: Sequence[int],
    coord: Sequence[int],
    zigzag_axis: int | None = None,
) -> torch.Tensor:
    """This rank's rows of ``batch``: microbatch ``k`` of the global batch cut under ``spec``, for every ``k``,
    concatenated (so that torch's schedule, chunking it into ``microbatches``, hands each stage its piece of
    the same global microbatch).  Splits on ``zigzag_axis`` keep the zigzag layout's two chunks."""
    size = int(batch.shape[0])
    if size % microbatches:
        raise PipelineRunError(
            f"{microbatches} microbatches do not divide the batch of {size}: pass a batch of a multiple of "
            f"{microbatches} rows"
        )
    chunks = batch.tensor_split(microbatches)
    return torch.cat([local_piece(c, spec, mesh_shape, coord, zigzag_axis) for c in chunks])


def _pipeline_mesh(
    builds: Sequence[StageBuild], degree: int, intra: tuple[int, ...], order: Order, device_type: str
) -> Any:
    from torch.distributed.device_mesh import DeviceMesh

    rows = [builds[s].ranks for s in range(degree)]
    for b in builds:
        expected = rows[_rank_of(b.index, degree, order)]
        if b.ranks != expected:
            raise PipelineRunError(
                f"stage {b.index} runs on ranks {b.ranks}, but {'V' if order == 'v' else 'loop'}-order schedules "
                f"put it with stage {_rank_of(b.index, degree, order)} on ranks {expected}: fix the stages' ranks"
            )
    world = dist.get_world_size()
    flat = sorted(r for row in rows for r in row)
    if flat != list(range(world)):
        raise PipelineRunError(
            f"the stages use ranks {flat}, the process group has {world}: launch {len(flat)} ranks, one per stage "
            "device"
        )
    names = ("pp", *(f"intra{a}" for a in range(len(intra))))
    layout = torch.tensor(rows, dtype=torch.int).reshape(degree, *intra)
    return DeviceMesh(device_type, layout, mesh_dim_names=names)


def _rank_of(stage: int, degree: int, order: Order) -> int:
    """The pipeline rank of stage ``stage``: loop order ``s % pp``; V order ``0 .. pp-1, pp-1 .. 0`` (the
    pricing's own map, :func:`~autoshard.pipeline.schedules.device_of_chunk`)."""
    return device_of_chunk(Schedule.ZB_V if order == "v" else Schedule.INTERLEAVED_1F1B, stage, degree)


def _input_name(b: StageBuild) -> str:
    return next(iter(b.plan.input_placements))


def _local(
    whole: torch.Tensor,
    placements: Sequence[str],
    intra: Sequence[int],
    coord: Sequence[int],
    where: torch.device,
) -> torch.Tensor:
    spec = spec_of(placements)
    if spec.partial_axes():
        raise PipelineRunError(
            f"a stage boundary tensor is planned {spec} (a partial sum): only R or S(d) can be sent between stages; "
            "re-plan the stage"
        )
    piece = local_piece(whole, spec, intra, coord).to(where)
    # torch derives which activations carry gradients back from these examples' requires_grad
    return piece.requires_grad_(piece.is_floating_point())


class _LossLayout(nn.Module):
    """The last stage's module, its output redistributed to the layout the loss reads (module doc)."""

    def __init__(
        self, stage: fx.GraphModule, output: torch.Tensor, planned: ShardingSpec, wanted: ShardingSpec
    ) -> None:
        super().__init__()
        self.stage = stage
        mesh_shape, shape, size = parallel_info(stage).comm.mesh_shape, output.shape, output.element_size()
        # backward: the gradient of the gathered logits is whole on every rank; keep this rank's piece (a
        # Partial output's gradient passes unchanged, as for any all-reduced Partial in autoshard's graphs)
        settled = ShardingSpec(
            tuple(Replicate() if isinstance(p, Partial) else p for p in planned.placements)
        )
        self.steps = (
            format_steps(plan_redistribute(planned, wanted, shape, size, mesh_shape)),
            format_steps(plan_redistribute(wanted, settled, shape, size, mesh_shape)),
        )

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        out = self.stage(inputs)
        if not self.steps[0]:
            return out
        return redistribute(out, parallel_info(self.stage).comm, *self.steps)


def _loss_layout(spec: ShardingSpec) -> ShardingSpec:
    """What the loss reads: the last stage's output split over the batch (dim 0) as planned, else whole."""
    return ShardingSpec(
        tuple(p if isinstance(p, Shard) and p.dim == 0 else Replicate() for p in spec.placements)
    )


def _batch_axes(spec: ShardingSpec) -> list[int]:
    return [a for a, p in enumerate(spec.placements) if isinstance(p, Shard) and p.dim == 0]


def _scaled_loss(
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], spec: ShardingSpec, intra: Sequence[int]
) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    share = 1
    for axis in _batch_axes(spec):
        share *= int(intra[axis])

    def scaled(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        loss = loss_fn(output, target)
        return loss / share if share != 1 else loss

    return scaled
