"""One pipeline stage's intra-op plan: the whole plan's decisions carried onto the stage's own graph.

Input: a stage module (:func:`autoshard.runtime.stages.split_stage`), its example microbatch input, the
whole pipelined :class:`~autoshard.plans.Plan`, the stage's sub-mesh cluster and the pins every stage keeps
(its parameters' placements, its input's placements, the user's annotations naming it).
Output: the stage's :class:`~autoshard.plans.Plan` on its sub-mesh and the capture it was made on (every
layer explicit: the same capture :func:`autoshard.parallelize` lowers).

Why not plan the stage again: a stage planned on its own (only weights and input pinned) is a different
optimisation -- one microbatch, no memory budget, none of the whole search's stage weighting -- and it can
pick another intra-op plan than the one the pipeline search priced and ``Plan.collectives`` lists (a 1024-
wide LLaMA in ZB-V one-layer chunks on 4-device stages: context parallel 4 priced, tensor parallel 4 run).
So every node the whole plan decided keeps its strategy here, with the pipeline axis dropped from the label:

- a node of a repeated layer takes the decision ``block:<position>`` of its position in its layer (the whole
  plan solves identical layers once, so every layer of every stage runs the same strategies);
- a node outside the layers (embedding, rotary tables, mask, final norm, head) is matched to the whole plan's
  ``outside:<i>`` decisions as :mod:`autoshard.runtime.mapping` matches a scaled copy: the two sequences of
  ``(op, module path with layer indices erased)`` aligned;
- the stage's recomputation policy, overlap policy and microbatch count are the plan's, so its collectives
  are priced per step as the plan's are.

Nodes only the stage has (its hidden-states input, a cast at the cut) are chosen by the solver under those
pins.  A decision that exists but cannot be honoured here (no strategy of the stage node prints so) is
refused in one line: the stage would run something the plan does not say.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from autoshard.annotations import pin_problem
from autoshard.capture import Captured, capture
from autoshard.capture.annotate import annotate_requires_grad
from autoshard.capture.blocks import BlockCandidate, BlockMismatch, annotate_blocks
from autoshard.capture.experts import plan_fuses_experts
from autoshard.capture.meta import META_KIND
from autoshard.cluster import Cluster
from autoshard.errors import AutoshardError
from autoshard.pipeline.schedules import Schedule, recompute_refused
from autoshard.plans import NodePlan, Plan
from autoshard.problem.build import BuiltProblem, build_problem
from autoshard.problem.context import zigzag_cluster
from autoshard.problem.costs import CostOptions, Recompute
from autoshard.problem.extract import extract_plan
from autoshard.problem.graph import META_AFTER_BLOCK, NodeInfo
from autoshard.report.labels import OpLabel, parse_label
from autoshard.runtime.mapping import align_sequences
from autoshard.search import solve

__all__ = ["StagePlanError", "label_layers", "narrow_label", "plan_stage"]


class StagePlanError(AutoshardError, ValueError):
    """A stage cannot run the whole plan's decision for one of its nodes."""


def narrow_label(label: str, axis: int | None, width: int | None = None) -> OpLabel:
    """A whole-mesh strategy label on one stage's sub-mesh: the pipeline ``axis`` dropped from every spec of
    ``width`` entries (the whole mesh's rank; a label already written on the sub-mesh is kept as it is)."""
    parsed = parse_label(label)
    if axis is None:
        return parsed

    def drop(specs: tuple[tuple[str, ...] | None, ...]) -> tuple[tuple[str, ...] | None, ...]:
        return tuple(
            s
            if s is None or (width is not None and len(s) != width)
            else tuple(p for a, p in enumerate(s) if a != axis)
            for s in specs
        )

    return OpLabel(drop(parsed.inputs), drop(parsed.outputs))


def plan_stage(
    module: nn.Module,
    index: int,
    plan: Plan,
    axis: int | None,
    cluster: Cluster,
    example: torch.Tensor,
    pins: Mapping[str, Any],
) -> tuple[Plan, Captured]:
    """The stage's plan under the whole plan's decisions (module doc); ``pins``: the annotations every stage
    keeps (parameter placements, the stage input's, the user's)."""
    captured = capture(module, (example,), {}, blocks="full", fuse_experts=plan_fuses_experts(plan.nodes))
    captured = label_layers(captured, module, plan, index)
    if index > 0 and example.is_floating_point() and plan.training:  # hidden states: their gradient goes back
        _input_gradient(captured, module)
    zigzag = plan.stage_zigzag_axis
    if zigzag is not None:  # the plan's sequence layout: every stage keeps it (activations cross in it)
        cluster = zigzag_cluster(cluster, zigzag)
    opts = CostOptions(
        training=plan.training,
        recompute=Recompute(plan.recompute),
        overlap=plan.overlap,
        microbatches=plan.microbatches,
        cp_layout="contiguous",  # on a zigzag cluster its ring axis is priced zigzag
    )
    built = build_problem(captured, cluster, opts)
    prefix = captured.blocks.prefix if captured.blocks else None
    first = captured.blocks.first if captured.blocks else 0
    pinned = pin_problem(built, pins, frozenset(), prefix, first)
    pinned = _keep_decisions(pinned, plan, axis, index)
    solution = solve(pinned.problem)
    out = next(n for n in captured.graph_module.graph.nodes if n.op == "output")
    stage_plan = extract_plan(
        pinned,
        solution,
        model=type(module).__name__,
        block_prefix=prefix,
        block_first=first,
        output_order=tuple(n.name for n in out.all_input_nodes),
        timings={},
        notes=(f"stage {index} of a pipelined plan: the whole plan's decisions on its sub-mesh",),
    )
    return stage_plan, captured


def label_layers(captured: Captured, module: nn.Module, plan: Plan, index: int) -> Captured:
    """The stage's layers labelled as the whole plan's repeated blocks, as its recomputation needs them.

    Capture finds a stack only where a container holds two or more identical children indexed from 0; a
    later stage holds ``layers.1`` alone, or ``layers.2`` and ``layers.3``, so its layers lost the block labels
    that :func:`~autoshard.codegen.recompute.checkpoint_blocks` wraps -- the plan priced their recomputation,
    the stage never re-ran it.  Here every layer the stage holds of the whole plan's stack is a block (its own
    container index), and the stage's input is marked as made by the previous layer when that layer is a block
    of the whole model (``META_AFTER_BLOCK``): the moves into the first layer re-run with it, as the whole
    plan prices the moves between layers (:func:`autoshard.problem.recompute.reissued`)."""
    heads = [m for n in plan.nodes if n.key.startswith("block:") and (m := _HEAD.match(n.module)) is not None]
    if not heads or plan.recompute == "none":
        return captured  # no repeated blocks, or none to recompute: the stage is planned as captured
    refused = recompute_refused(Schedule(plan.pipeline.schedule), plan.recompute) if plan.pipeline else None
    if refused is not None:  # the search prices no such plan; a plan file made before it did
        raise StagePlanError(f"stage {index} of a plan made before the search refused this pair: {refused}")
    prefix = heads[0].group(1)
    first = min(int(m.group(2)) for m in heads if m.group(1) == prefix)  # container index of its block 0
    try:
        container = module.get_submodule(prefix)
    except AttributeError:
        return captured  # the stage holds none of the stack (an embedding-only or head-only stage)
    held = sorted(int(k) for k in container._modules if k.isdigit() and int(k) >= first)
    if not held:
        return captured
    if held != list(range(held[0], held[0] + len(held))):
        raise StagePlanError(
            f"stage {index}: layers {held} of {prefix} are not consecutive: fix the plan's stages"
        )
    info = captured.blocks
    if info is None:
        body = container.get_submodule(str(held[0]))
        numel = sum(p.numel() for k in held for p in container.get_submodule(str(k)).parameters())
        candidate = BlockCandidate(prefix, len(held), type(body).__name__, numel, held[0])
        try:
            info = annotate_blocks(captured.graph_module, candidate, len(held))
        except BlockMismatch as e:
            raise StagePlanError(
                f"stage {index}: layers {held} of {prefix} are not the plan's repeated blocks ({e}), so they "
                f"cannot recompute as the plan prices ({plan.recompute}): re-plan with recompute='none'"
            ) from e
    if held[0] > first:  # the input is the previous layer's output, a block of the whole model
        for node in captured.graph_module.graph.nodes:
            if node.op == "placeholder" and node.meta.get(META_KIND) == "user_input":
                node.meta[META_AFTER_BLOCK] = True
    return dataclasses.replace(captured, blocks=info)


_HEAD = re.compile(r"^(.*?)\.(\d+)(?=\.|$)")


def _input_gradient(captured: Captured, module: nn.Module) -> None:
    """Mark the stage's input as carrying a gradient (capture starts user inputs without one): the previous
    stage receives it, so its redistribution's backward -- e.g. the all-reduce of a column-split layer's input
    gradient -- runs here, as it does in the whole model between those layers."""
    gm = captured.graph_module
    inputs = frozenset(
        n.name for n in gm.graph.nodes if n.op == "placeholder" and n.meta.get(META_KIND) == "user_input"
    )
    trainable = frozenset(n for n, p in module.named_parameters() if p.requires_grad)
    annotate_requires_grad(gm, trainable, module, inputs)


def _keep_decisions(built: BuiltProblem, plan: Plan, axis: int | None, index: int) -> BuiltProblem:
    """``built`` with every node the whole plan decided allowed only that decision (module doc)."""
    decisions = _decisions(built, plan)
    problem = built.problem
    masks = list(problem.allowed or (None,) * problem.num_nodes)
    for k, name in enumerate(built.variables):
        decision = decisions.get(name)
        if decision is None:
            continue
        wanted = narrow_label(decision.strategy, axis, len(plan.mesh_shape))
        mine = np.array([parse_label(str(s)) == wanted for s in built.strategies[name]], dtype=bool)
        pinned = masks[k]
        both = mine if pinned is None else mine & pinned
        if not both.any():
            info = built.infos[name]
            raise StagePlanError(
                f"stage {index}: node {name} ({info.target} in {info.module or '<root>'}) cannot run the plan's "
                f"{decision.strategy} on the stage's sub-mesh: re-plan the model with this pipeline"
            )
        masks[k] = both
    allowed = tuple(masks)
    return dataclasses.replace(built, problem=dataclasses.replace(problem, allowed=allowed))


def _decisions(built: BuiltProblem, plan: Plan) -> dict[str, NodePlan]:
    """Stage node name -> the whole plan's decision it runs (module doc)."""
    by_key = {n.key: n for n in plan.nodes}
    block = sorted((n for n in plan.nodes if n.key.startswith("block:")), key=_index)
    layer_modules = {_DIGITS.sub("#", m) for m in (_layer_of(n.module) for n in block) if m}
    found: dict[str, NodePlan] = {}
    others = []
    loose: dict[str, list[NodeInfo]] = {}  # a layer the capture did not mark (a stage of one layer): by path
    for name in built.variables:
        info = built.infos[name]
        if info.kind == "user_input":
            continue  # the stage's input: pinned to what the previous stage sends (or the plan's input)
        decision = by_key.get(f"block:{info.block[1]}") if info.block is not None else None
        if decision is not None and decision.target == info.target:
            found[name] = decision
            continue
        layer = _layer_of(info.fqn or info.module)
        if info.block is None and layer is not None and _DIGITS.sub("#", layer) in layer_modules:
            loose.setdefault(layer, []).append(info)
            continue
        others.append(info)
    for infos in loose.values():
        found.update(align_sequences(block, infos))
    outside = sorted((n for n in plan.nodes if n.key.startswith("outside:")), key=_index)
    found.update(align_sequences(outside, others))
    return found


_DIGITS = re.compile(r"(?<=\.)\d+(?=\.|$)")
_LAYER = re.compile(r"^(.*?\.\d+)(?=\.|$)")


def _layer_of(module: str) -> str | None:
    """The repeated layer a module path is in (``model.layers.3``), or None."""
    found = _LAYER.match(module)
    return found.group(1) if found else None


def _index(node: NodePlan) -> int:
    return int(node.key.partition(":")[2])
