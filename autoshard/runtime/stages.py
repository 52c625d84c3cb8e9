"""Pipeline stages of a model: one module per stage, and each stage's intra-op plan on its sub-mesh.

Input: a model (real weights), a :class:`~autoshard.plans.Plan` whose ``pipeline`` is set (as the planner fills
it: every stage names its user modules, e.g. ``("model.embed_tokens", "model.layers.0", "model.layers.1")``,
and its ranks), and the *global* example inputs of one step.  Output: one :class:`StageBuild` per stage, in
stage order -- the stage's module, its plan on the stage's sub-mesh and its example microbatch input.  No
process group is needed: :func:`prepare_stages` runs once (before forking ranks, or on every rank: it is
deterministic) and :func:`autoshard.runtime.pipelining.build_pipeline` lowers each rank's stages.

How a stage module is cut (the torchtitan way -- copy the model, drop what other stages own -- made generic
for models whose ``forward`` does not know about stages, such as Hugging Face's):

- a module other stages own is replaced by ``nn.Identity`` (an embedding then passes the incoming hidden
  states through, a final norm or LM head hands them on unchanged); a layer of an ``nn.ModuleList`` is
  removed from the list, the others keep their keys, so every parameter keeps its name in the full model
  (``model.layers.2.mlp.up_proj.weight`` on stage 1) and the plan's placements apply by name;
- a later stage of a model whose ``forward`` takes ``inputs_embeds`` (Hugging Face's) gets its hidden states
  there instead, and its dropped embeddings return zeros (GPT-2 adds a position embedding to the hidden
  states: the first stage added it);
- modules that hold no parameter (rotary embeddings) stay on every stage, whichever stage names them;
- the stage takes one tensor (token ids on the first stage, hidden states after) and returns one tensor (the
  first output: logits on the last stage of a ``*ForCausalLM``, hidden states before);
- a tied weight read on two stages (GPT-2's embedding on the first, its LM head on the last) is held by both,
  as Megatron-LM does: each stage's copy under its own name (``lm_head.weight``) with the placement of the
  plan's one (``transformer.wte.weight``), listed in :attr:`StageBuild.tied`; the pipeline sums their
  gradients every step (:mod:`autoshard.runtime.pipelining`), so the copies stay equal.

Each stage's intra-op plan is the full plan's, carried onto the stage's own capture
(:mod:`autoshard.runtime.stage_plan`): every node keeps the strategy the plan decided for it, every parameter
its placement, the stage input the previous stage's output placements (the first stage's the plan's input
placements); only nodes the stage alone has are chosen by the solver.  The stage graph is a different capture
(its nodes have other names and positions), so decisions are matched by layer position and op sequence; a
decision the stage cannot run is refused in one line.  A stage therefore issues exactly its share of
``Plan.collectives`` (:func:`autoshard.pipeline.cuts.stage_collectives`).

Example::

    builds = prepare_stages(model, plan, (ids,))
    builds[1].modules, builds[1].plan.param_placements["model.layers.2.mlp.up_proj.weight"]
"""

from __future__ import annotations

import copy
import fnmatch
import inspect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from autoshard.capture import Captured
from autoshard.cluster import Cluster
from autoshard.errors import AutoshardError
from autoshard.plans import PipelinePlan, Plan

__all__ = ["PipelineRunError", "StageBuild", "intra_layout", "prepare_stages", "split_stage"]

STAGE_INPUT = "inputs"
"""The argument name of every stage module's ``forward`` (annotations pin it by this name)."""


class PipelineRunError(AutoshardError, ValueError):
    """A plan's pipeline cannot be run on this model or these inputs."""


@dataclass(frozen=True)
class StageBuild:
    """One stage ready to lower: its module (full weights of its own modules only) and its intra-op plan."""

    index: int
    modules: tuple[str, ...]
    ranks: tuple[int, ...]
    module: nn.Module
    plan: Plan  # on the stage's sub-mesh; parameter placements = the full plan's
    example: torch.Tensor  # the stage's input for one global microbatch
    output: torch.Tensor  # its output for that microbatch (shape and dtype of what it sends on)
    captured: Captured
    tied: tuple[tuple[str, str], ...] = ()  # (name here, the plan's name) of weights other stages also hold


def intra_layout(plan: Plan) -> tuple[tuple[int, ...], int | None]:
    """The intra-op mesh of one stage and the plan's pipeline axis (``None``: the plan's mesh *is* one stage's
    sub-mesh, as when an intra-op plan is given a pipeline afterwards)."""
    pipe = _pipeline(plan)
    group = len(pipe.stages[0].ranks)
    devices = math.prod(plan.mesh_shape)
    if devices == group:
        return tuple(plan.mesh_shape), None
    axis = pipe.mesh_axis
    if (
        devices == group * pipe.degree
        and 0 <= axis < len(plan.mesh_shape)
        and plan.mesh_shape[axis] == pipe.degree
    ):
        return tuple(n for a, n in enumerate(plan.mesh_shape) if a != axis), axis
    raise PipelineRunError(
        f"plan mesh {plan.mesh_shape} fits neither one stage ({group} ranks) nor {pipe.degree} stages of {group} "
        f"along mesh axis {axis}: fix Plan.pipeline.mesh_axis or the stages' ranks"
    )


def split_stage(
    model: nn.Module, keep: Sequence[str], drop: Sequence[str], embeds: bool = False
) -> nn.Module:
    """A copy of ``model`` without the modules in ``drop`` (module doc); weights of ``drop`` are not copied.
    ``embeds``: the stage takes hidden states as ``inputs_embeds`` and its dropped embeddings return zeros."""
    placeholder = nn.Identity()
    drop = [n for n in drop if not any(n.startswith(f"{outer}.") for outer in drop)]  # a whole layer suffices
    memo: dict[int, Any] = {id(model.get_submodule(name)): placeholder for name in drop}
    stage = copy.deepcopy(model, memo)
    for name in sorted(drop, key=lambda n: n.count("."), reverse=True):
        parent_name, _, child = name.rpartition(".")
        parent = stage.get_submodule(parent_name)
        original = model.get_submodule(name)
        if isinstance(parent, nn.ModuleList):
            del parent._modules[child]
        elif embeds and isinstance(original, nn.Embedding):
            setattr(parent, child, _NoEmbedding(original.embedding_dim, original.weight.dtype))
        else:
            setattr(parent, child, nn.Identity())
    stage.__class__ = _stage_class(type(model), embeds)
    for name in keep:
        stage.get_submodule(name)  # still there (not under a dropped module)
    return stage


class _StageForward(nn.Module):
    """Mixed into a stage's class: one tensor in, one tensor out."""

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return _first_tensor(super().forward(inputs), type(self).__name__)


class _EmbedsStageForward(nn.Module):
    """Mixed into a later stage's class: hidden states in as ``inputs_embeds``, one tensor out."""

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return _first_tensor(super().forward(inputs_embeds=inputs), type(self).__name__)


class _NoEmbedding(nn.Module):
    """A dropped embedding on a later stage: zeros (what the first stage added is in the hidden states)."""

    def __init__(self, dim: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.dim, self.dtype = dim, dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.zeros(*ids.shape, self.dim, dtype=self.dtype, device=ids.device)


def takes_embeds(model: nn.Module) -> bool:
    """Whether ``model.forward`` takes ``inputs_embeds`` (later stages then pass hidden states there)."""
    return "inputs_embeds" in inspect.signature(type(model).forward).parameters


def _first_tensor(out: Any, what: str) -> torch.Tensor:
    first = (
        out if isinstance(out, torch.Tensor) else out.to_tuple()[0] if hasattr(out, "to_tuple") else out[0]
    )
    if not isinstance(first, torch.Tensor):
        raise PipelineRunError(
            f"{what} returned {type(first).__name__} first: a pipeline stage must return its activation (or "
            "logits) as its first output"
        )
    return first


def _chain(model: nn.Module, stages: Sequence[nn.Module], example: torch.Tensor) -> list[torch.Tensor]:
    """Each stage's input for one microbatch, then the last stage's output; checked against the whole model
    (a forward that reads a dropped module as more than a pass-through would silently compute another
    function)."""
    modes = [(m, m.training) for m in (model, *stages)]
    values = [example]
    try:
        with torch.no_grad():
            for m, _ in modes:
                m.eval()
            for i, stage in enumerate(stages):
                values.append(_run_stage(model, i, stage, values[-1]))
            if example.device.type != "meta":
                whole = _first_tensor(model(example), type(model).__name__)
                _check_same(model, whole, values[-1])
    finally:
        for m, mode in modes:
            m.train(mode)
    return values


def _run_stage(model: nn.Module, index: int, stage: nn.Module, inputs: torch.Tensor) -> torch.Tensor:
    try:
        return stage(inputs)
    except Exception as e:  # the model's own forward failing on a stage's input: say which stage and why
        cause = (str(e).strip().splitlines() or [type(e).__name__])[-1]
        raise PipelineRunError(
            f"stage {index} of {type(model).__name__} fails on its input {tuple(inputs.shape)} ({cause}): its "
            "forward does not pass hidden states through a dropped embedding; pipeline models whose forward "
            "runs embedding -> layers -> norm -> head"
        ) from e


def _check_same(model: nn.Module, whole: torch.Tensor, piped: torch.Tensor) -> None:
    same = whole.shape == piped.shape and torch.allclose(whole, piped, rtol=1e-5, atol=1e-6)
    if not same:
        gap = (
            f"largest difference {float((whole - piped).abs().max()):.3g}"
            if whole.shape == piped.shape
            else (f"shape {tuple(piped.shape)} instead of {tuple(whole.shape)}")
        )
        raise PipelineRunError(
            f"the stages of {type(model).__name__} chained do not compute the model ({gap}): its forward uses a "
            "module another stage owns as more than a pass-through (e.g. a position embedding added to the "
            "hidden states); pipeline models whose forward runs embedding -> layers -> norm -> head"
        )


_STAGE_CLASSES: dict[tuple[type, bool], type] = {}


def _stage_class(cls: type[nn.Module], embeds: bool) -> type[nn.Module]:
    # A subclass per model class, as FSDP2's fully_shard does: names, hooks and the model's forward are kept.
    if (cls, embeds) not in _STAGE_CLASSES:
        mixin = _EmbedsStageForward if embeds else _StageForward
        _STAGE_CLASSES[cls, embeds] = type(f"{cls.__name__}Stage", (mixin, cls), {})
    return _STAGE_CLASSES[cls, embeds]


def prepare_stages(
    model: nn.Module,
    plan: Plan,
    example_args: tuple[Any, ...] | Any,
    annotations: Mapping[str, Any] | None = None,
) -> tuple[StageBuild, ...]:
    """Every stage's module and intra-op plan (module doc).

    ``annotations``: those the plan was made with; each stage is planned with the ones that name one of its
    modules or parameters (on top of the pinned parameter placements).
    """
    pipe = _pipeline(plan)
    args = example_args if isinstance(example_args, tuple) else (example_args,)
    if len(args) != 1 or not isinstance(args[0], torch.Tensor):
        raise PipelineRunError(
            f"a pipeline takes one input tensor (token ids or features), got {len(args)} example inputs: "
            "pass build_pipeline(model, plan, (ids,))"
        )
    batch = int(args[0].shape[0])
    if plan.microbatches < 1 or batch % plan.microbatches:
        raise PipelineRunError(
            f"{plan.microbatches} microbatches do not divide the batch of {batch}: use a divisor of {batch} "
            f"({', '.join(str(d) for d in range(1, batch + 1) if batch % d == 0)})"
        )
    names = _check_cover(model, pipe)
    intra, axis = intra_layout(plan)
    cluster = _stage_cluster(plan, intra, axis)
    # modules without parameters (rotary embeddings) run on every stage, whichever stage names them
    owned = [m for stage in pipe.stages for m in stage.modules if _holds_parameters(model, m)]
    embeds = takes_embeds(model)
    modules = [
        split_stage(model, s.modules, [m for m in owned if m not in s.modules], embeds and s.index > 0)
        for s in pipe.stages
    ]
    examples = _chain(model, modules, args[0][: batch // plan.microbatches])
    placements = _first_input(plan, axis)
    copied, builds = _copied(names, modules), []
    for stage, module, example, output in zip(pipe.stages, modules, examples, examples[1:], strict=False):
        pins = _stage_annotations(module, annotations or {})
        stage_plan, captured = _plan_stage(
            module, stage.index, plan, axis, cluster, example, placements, pins, names
        )
        tied = tuple((n, names[n]) for n, _ in module.named_parameters() if names[n] in copied)
        builds.append(
            StageBuild(
                stage.index, stage.modules, stage.ranks, module, stage_plan, example, output, captured, tied
            )
        )
        placements = stage_plan.output_placements[0]
    return tuple(builds)


def _stage_annotations(module: nn.Module, annotations: Mapping[str, Any]) -> dict[str, Any]:
    """The annotations that name something of this stage (others would match nothing and be refused)."""
    params = [n for n, _ in module.named_parameters()]
    names = {*params, *(prefix for n in params for prefix in _prefixes(n))}  # modules holding parameters
    return {k: v for k, v in annotations.items() if any(fnmatch.fnmatchcase(n, k) for n in names)}


def _pipeline(plan: Plan) -> PipelinePlan:
    if plan.pipeline is None or not plan.pipeline.stages:
        raise PipelineRunError(
            "the plan has no pipeline stages (Plan.pipeline is None): plan with pipeline=N, or run it with "
            "autoshard.parallelize"
        )
    return plan.pipeline


def _copied(names: Mapping[str, str], modules: Sequence[nn.Module]) -> set[str]:
    """The plan's names of the weights more than one stage holds (a tied embedding and head)."""
    holders: dict[str, int] = {}
    for module in modules:
        for plan_name in {names[n] for n, _ in module.named_parameters()}:
            holders[plan_name] = holders.get(plan_name, 0) + 1
    return {n for n, count in holders.items() if count > 1}


def _check_cover(model: nn.Module, pipe: PipelinePlan) -> dict[str, str]:
    """Every stage module exists; every parameter belongs to exactly one stage, a tied weight's every name to
    the stage reading it there.  Returns every parameter name -> the plan's name (its first one)."""
    names = dict(model.named_modules())
    owner: dict[str, int] = {}
    for stage in pipe.stages:
        for name in stage.modules:
            if name not in names:
                close = [n for n in names if n.rsplit(".", 1)[-1] == name.rsplit(".", 1)[-1]][:4]
                raise PipelineRunError(
                    f"stage {stage.index} names module {name!r}, which {type(model).__name__} lacks"
                    f"{f' (modules with that name: {close})' if close else ''}: fix the plan's stage modules"
                )
            if name in owner and _holds_parameters(model, name):
                raise PipelineRunError(
                    f"module {name!r} is in stages {owner[name]} and {stage.index}: keep it in one"
                )
            owner[name] = stage.index
    first: dict[int, str] = {}
    for fqn, param in model.named_parameters(remove_duplicate=False):
        holder = next((owner[m] for m in _prefixes(fqn) if m in owner), None)
        if holder is None:
            raise PipelineRunError(
                f"parameter {fqn} belongs to no pipeline stage: add its module to a stage (stages own "
                f"{sorted(owner)[:6]} ...)"
            )
        first.setdefault(id(param), fqn)
    return {fqn: first[id(p)] for fqn, p in model.named_parameters(remove_duplicate=False)}


def _holds_parameters(model: nn.Module, name: str) -> bool:
    return next(model.get_submodule(name).parameters(), None) is not None


def _prefixes(fqn: str) -> list[str]:
    parts = fqn.split(".")
    return [".".join(parts[:i]) for i in range(len(parts) - 1, 0, -1)]


def _stage_cluster(plan: Plan, intra: tuple[int, ...], axis: int | None) -> Cluster:
    from autoshard.codegen.parallelize import plan_cluster
    from autoshard.runtime.verify import cluster_for

    if axis is None:
        return plan_cluster(plan)
    return cluster_for(str(plan.cluster["profile"]), math.prod(intra), intra)


def _drop_axis(placements: Sequence[str], axis: int | None) -> tuple[str, ...]:
    return tuple(p for a, p in enumerate(placements) if a != axis)


def _first_input(plan: Plan, axis: int | None) -> tuple[str, ...]:
    if len(plan.input_placements) != 1:
        raise PipelineRunError(
            f"the plan has {len(plan.input_placements)} inputs ({list(plan.input_placements)}): a pipeline takes "
            "one; plan the model with its token ids only"
        )
    return _drop_axis(next(iter(plan.input_placements.values())), axis)


def _plan_stage(
    module: nn.Module,
    index: int,
    plan: Plan,
    axis: int | None,
    cluster: Cluster,
    example: torch.Tensor,
    input_placements: tuple[str, ...],
    annotations: Mapping[str, Any],
    names: Mapping[str, str],
) -> tuple[Plan, Captured]:
    from autoshard.runtime.stage_plan import plan_stage

    pins: dict[str, Any] = {**annotations, STAGE_INPUT: input_placements}
    params = dict(module.named_parameters())
    for fqn in params:
        planned = names.get(fqn, fqn)  # a tied weight's copy is placed as the plan's one
        if planned not in plan.param_placements:
            raise PipelineRunError(f"the plan has no placement for {fqn} (stage {index}): re-plan this model")
        pins[fqn] = _drop_axis(plan.param_placements[planned], axis)
    stage_plan, captured = plan_stage(module, index, plan, axis, cluster, example, pins)
    moved = {k: v for k, v in pins.items() if k in params and stage_plan.param_placements.get(k) != tuple(v)}
    assert not moved, f"stage {index} plan moved pinned parameters: {moved}"
    if stage_plan.zigzag_axis != plan.stage_zigzag_axis:
        raise PipelineRunError(f"stage {index} cannot keep the zigzag layout: use cp_layout='contiguous'")
    return stage_plan, captured
