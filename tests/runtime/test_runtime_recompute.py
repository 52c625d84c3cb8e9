"""The plan's recomputation emitted with torch's checkpoint utilities, on real gloo ranks (float64):
each LLaMA layer under ``torch.utils.checkpoint`` (full) or an op-level selective policy
(``create_selective_checkpoint_contexts``); outputs and gradients match the single-device model, and the
forward collectives that backward re-issues are the ones the plan priced."""

from __future__ import annotations

import functools

import pytest
import torch
from runtime_cases import LLAMA_MEGATRON, model
from torch import fx

import autoshard
from autoshard.codegen import assign_strategies, lower_graph, plan_cluster
from autoshard.codegen.recompute import Checkpointed, checkpoint_blocks
from autoshard.plans import Plan
from autoshard.runtime.verify import cluster_for, verify


@functools.cache
def recompute_plan(policy: str) -> Plan:
    m = model("llama")
    cluster = cluster_for("cpu", 2)
    return autoshard.plan(m.model, cluster, m.args, m.kwargs, annotations=LLAMA_MEGATRON, recompute=policy)  # type: ignore[arg-type]


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["full", "selective"])
def test_recomputed_layers_match_single_device_and_reissue_what_was_priced(policy: str) -> None:
    m = model("llama")
    plan = recompute_plan(policy)
    assert plan.recompute == policy
    report = verify(m.model, m.args, m.kwargs, plan=plan, captured=m.captured, name=f"llama-{policy}")
    assert report.ok, str(report)
    assert report.emitted == report.planned and report.ranks_agree
    # the re-issued forward all-reduces (listed with ``recompute``) ran on top of the forward pass's own (the
    # plan keeps the residual stream Partial since ZeRO-1's gathers are priced: not Megatron's equal counts)
    rerun = sum(1 for c in plan.collectives if c.kind == "all_reduce" and c.recompute)
    once = sum(
        1 for c in plan.collectives if c.kind == "all_reduce" and c.phase == "forward" and not c.recompute
    )
    assert rerun > 0 and report.emitted["forward all_reduce"] == once + rerun


def test_each_layer_is_one_checkpointed_region() -> None:
    m = model("llama")
    plan = recompute_plan("selective")
    lowered = lower_graph(m.captured, assign_strategies(m.captured, plan), plan_cluster(plan), (0,))
    root = {a.fqn: torch.zeros(a.spec.local_shape(a.global_shape, (2,))) for a in lowered.attrs}
    module = fx.GraphModule({**root, "autoshard_comm": torch.nn.Module()}, lowered.graph)
    checkpoint_blocks(module, "selective")
    regions = [mod for _, mod in module.named_children() if isinstance(mod, Checkpointed)]
    assert len(regions) == 2 and all(r.selective for r in regions)  # llama-tiny has 2 layers
    code = module.code
    assert code.count("self.block_0(") == 1 and code.count("self.block_1(") == 1


def test_recompute_blocks_checkpoints_only_the_first_k_layers() -> None:
    """``Plan.recompute_blocks`` = k: the first k layers are checkpointed, as the planner priced them."""
    m = model("llama")
    plan = recompute_plan("full")
    lowered = lower_graph(m.captured, assign_strategies(m.captured, plan), plan_cluster(plan), (0,))
    root = {a.fqn: torch.zeros(a.spec.local_shape(a.global_shape, (2,))) for a in lowered.attrs}
    module = fx.GraphModule({**root, "autoshard_comm": torch.nn.Module()}, lowered.graph)
    again = checkpoint_blocks(module, "full", blocks=1)
    regions = [name for name, mod in module.named_children() if isinstance(mod, Checkpointed)]
    assert regions == ["block_0"] and again  # layer 1 keeps its activations; layer 0's moves re-run
