"""A pipelined plan with full recomputation runs the recomputation it prices.

Found on main: verify of LLaMA in 2 one-layer stages with ``recompute="full"`` and FSDP-stored weights listed
8 forward all-gathers per microbatch (4, and 4 that backward re-runs, ``Collective.recompute``) and ran 4: a
stage's capture holds ``layers.1`` alone (or ``layers.2`` and ``layers.3``), no stack indexed from 0, so its
layer had no block label and :func:`~autoshard.codegen.recompute.checkpoint_blocks` wrapped nothing.

1. On 4 gloo ranks (2 stages x 2): the re-run gathers run -- twice the forward gathers of a plan without
   recomputation, each stage's exactly its share of ``Plan.collectives`` -- and the gradients match one device.
2. A stage of several later layers (``layers.2``, ``layers.3``) is labelled with its own container indices.
3. The stage's input is the previous layer's output (a block of the whole model): a move from it into the
   first layer is inside that layer's checkpointed region and re-run, as the whole plan prices the moves
   between layers; the stage's own plan lists it as recomputed too (no warning from ``parallelize``).
4. The zero-bubble schedules split backward in two and torch re-runs a checkpointed layer in each (ZB-V
   chunks re-issued each gather 10 times a microbatch): the search prices no such plan, asked for one it says
   why in one line, and a plan file that has one is refused by the stages, not run unlike its pricing.
"""

from __future__ import annotations

import dataclasses
import functools
from collections import Counter

import pytest
import torch
from torch import fx

import autoshard
from autoshard import zoo
from autoshard.codegen import assign_strategies, lower_graph, plan_cluster
from autoshard.codegen.recompute import checkpoint_blocks
from autoshard.errors import PipelineError
from autoshard.pipeline.cuts import per_step, stage_collectives
from autoshard.plans import Plan
from autoshard.problem.graph import META_AFTER_BLOCK
from autoshard.runtime.stage_plan import StagePlanError
from autoshard.runtime.stages import StageBuild, prepare_stages
from autoshard.runtime.verify import cluster_for
from autoshard.runtime.verify_pipeline import verify_pipelined

FSDP = {"*.mlp.up_proj.weight": "(S(0))", "*.self_attn.q_proj.weight": "(S(0))"}  # gathered every use


@functools.cache
def _planned(
    layers: int, seq: int, recompute: str = "full", fsdp: bool = True, forbid: tuple[str, ...] = ()
) -> tuple[torch.nn.Module, torch.Tensor, Plan]:
    torch.manual_seed(0)
    case = zoo.build("llama-tiny", batch=4, seq=seq, layers=layers)
    model, ids = case.model.to(torch.float64), case.args[0]
    plan = autoshard.plan(
        model, cluster_for("cpu", 4, (2, 2)), (ids,), pipeline=2, schedule="gpipe", recompute=recompute,  # type: ignore[arg-type]
        annotations=FSDP if fsdp else None, forbid=forbid,
    )  # fmt: skip
    return model, ids, plan


def _gathers(plan: Plan) -> int:
    return sum(per_step(plan, c) for c in plan.collectives if (c.phase, c.kind) == ("forward", "all_gather"))


@pytest.mark.slow
def test_one_layer_stages_re_issue_the_gathers_their_recomputation_prices() -> None:
    model, ids, plan = _planned(2, 16)
    assert plan.recompute == "full" and [len(s.modules) for s in plan.pipeline.stages] == [3, 3]  # type: ignore[union-attr]
    again = [c for c in plan.collectives if c.recompute]
    assert again and {c.kind for c in again} == {"all_gather"} and {c.layer for c in again} == {0, 1}
    plain = _planned(2, 16, "none")[2]
    assert _gathers(plan) == 2 * _gathers(plain) > 0  # every gather of a layer runs again in backward
    report = verify_pipelined(plan, model, ids)
    assert report.ok, str(report)
    assert report.ranks_agree and report.emitted == report.planned  # each stage ran its share, bytes too
    assert report.emitted["forward all_gather"] == _gathers(plan)  # re-runs included: 32 where 16 ran before


def test_later_stages_of_several_layers_are_labelled_with_their_own_indices() -> None:
    model, ids, plan = _planned(4, 16)
    builds = prepare_stages(model, plan, (ids,), FSDP)
    blocks = [b.captured.blocks for b in builds]
    assert [(b.first, b.num_blocks) for b in blocks if b is not None] == [(0, 2), (2, 2)]
    for b in builds:  # what the stage's checkpointed layers re-run is the plan's share, record for record
        assert Counter(_rerun(b)) == Counter(_key(c) for c in stage_collectives(plan, b.index) if c.recompute)


def test_the_move_into_a_stages_first_layer_is_re_run_with_it() -> None:
    # the residual stream split on the sequence, gathered for attention (CP forbidden: since ZeRO-1's gathers
    # are priced this case's optimum is CP 2 in each stage, with no forward collective at all)
    model, ids, plan = _planned(2, 256, fsdp=False, forbid=("cp",))
    entering = [c for c in plan.collectives if c.recompute and c.layer == 1]
    assert entering and all(c.kind == "all_gather" and c.phase == "forward" for c in entering)
    builds = prepare_stages(model, plan, (ids,))
    inputs = [n for n in builds[1].captured.graph_module.graph.nodes if n.op == "placeholder"]
    assert any(n.meta.get(META_AFTER_BLOCK) for n in inputs)  # stage 1's input: layer 0's output
    assert not any(n.meta.get(META_AFTER_BLOCK) for n in builds[0].captured.graph_module.graph.nodes)
    for b in builds:
        mine = Counter(_key(c) for c in stage_collectives(plan, b.index) if c.recompute)
        assert Counter(_rerun(b)) == mine
        assert Counter(_key(c) for c in b.plan.collectives if c.recompute) == mine  # the stage plan agrees
    assert Counter(_rerun(builds[1]))  # and it is not empty


def test_zero_bubble_schedules_run_no_recomputation() -> None:
    model, ids, plan = _planned(4, 16)
    cluster = cluster_for("cpu", 4, (2, 2))
    refusal = (  # one line: what is refused, why, and what to plan instead
        r"zb_v with full recomputation refused: torch splits zb_v's backward into an input pass and a weight "
        r"pass and re-runs each checkpointed layer in both \(pytorch/pytorch#136766\), not once as priced; "
        r"plan with schedule 1f1b, interleaved_1f1b or gpipe, or without recomputation \(pinned, or a memory "
        r"budget that fits every activation\)$"
    )
    with pytest.raises(PipelineError, match=r"^2 pipeline stages: " + refusal):
        autoshard.plan(
            model, cluster, (ids,), pipeline=2, schedule="zb_v", recompute="full", annotations=FSDP
        )
    assert plan.pipeline is not None and plan.pipeline.schedule not in ("zb_v", "interleaved_zb")
    zbv = autoshard.plan(
        model, cluster, (ids,), pipeline=2, schedule="zb_v", recompute="none", annotations=FSDP
    )
    old = dataclasses.replace(zbv, recompute="full")  # a plan file from before the search refused it
    with pytest.raises(
        StagePlanError, match=r"^stage 0 of a plan made before the search refused this pair: " + refusal
    ):
        prepare_stages(model, old, (ids,), FSDP)


def _key(c: object) -> tuple[str, int, int]:
    return (str(c.kind), c.mesh_axis, c.nbytes)  # type: ignore[attr-defined]


def _rerun(build: StageBuild) -> list[tuple[str, int, int]]:
    """The collectives backward re-runs in ``build``'s emitted module (rank 0's), once per microbatch."""
    captured, plan = build.captured, build.plan
    lowered = lower_graph(captured, assign_strategies(captured, plan), plan_cluster(plan), (0,))
    shape = tuple(plan.mesh_shape)
    root = {a.fqn: torch.zeros(a.spec.local_shape(a.global_shape, shape)) for a in lowered.attrs}
    module = fx.GraphModule({**root, "autoshard_comm": torch.nn.Module()}, lowered.graph)
    again = checkpoint_blocks(module, plan.recompute, plan.recompute_blocks)
    return [(str(s.kind), s.mesh_axis, s.nbytes) for e in again for p, s in e.collectives() if p == "forward"]
