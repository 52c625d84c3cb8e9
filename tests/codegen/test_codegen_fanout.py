"""One redistribution per (tensor, layout): a LLaMA layer under Megatron tensor + sequence parallelism moves
each activation once per layout -- 4 collectives forward and 4 backward -- in the plan, in the emitted code
and on real gloo ranks (Korthikanti et al. 2022, Fig. 5: g / g-bar around attention and around the MLP)."""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import pytest
import torch
from test_codegen_lower import code_counts  # phase kind -> collectives in the generated code
from torch import nn

import autoshard
from autoshard.capture import capture
from autoshard.codegen import assign_strategies, lower_graph, plan_cluster
from autoshard.placement import ShardingSpec
from autoshard.planner_steps import build as _build
from autoshard.planner_steps import output_order as _output_order
from autoshard.problem.costs import CostOptions
from autoshard.problem.extract import extract_plan
from autoshard.runtime.verify import cluster_for, verify
from autoshard.search import solve

transformers = pytest.importorskip("transformers")

COLUMN, ROW = ((1, 1, 1), (2, 1)), ((1, 1, 2), (1, 2))  # linear on (B, S, H) over 2 devices
MEGATRON_SP = {
    "x": ("S(1)",),  # the residual stream enters sharded over the sequence
    **{f"*.{m}": COLUMN for m in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")},
    **{f"*.{m}": ROW for m in ("o_proj", "down_proj")},
}
# Megatron-SP: g = all-gather before the column linears, g-bar = reduce-scatter after the row linears
SP_FORWARD = {"all_gather": 2, "reduce_scatter": 2}
SP_BACKWARD = {"reduce_scatter": 2, "all_gather": 2}


class LlamaLayer(nn.Module):
    """One HF ``LlamaDecoderLayer`` with its rotary tables: hidden states in, hidden states out."""

    def __init__(self, hidden: int, heads: int, kv: int, ffn: int) -> None:
        super().__init__()
        cfg = transformers.LlamaConfig(
            hidden_size=hidden,
            intermediate_size=ffn,
            num_hidden_layers=1,
            num_attention_heads=heads,
            num_key_value_heads=kv,
            vocab_size=128,
            attention_dropout=0.0,
        )
        cfg._attn_implementation = "sdpa"
        llama = transformers.models.llama.modeling_llama
        self.rotary = llama.LlamaRotaryEmbedding(cfg)
        self.layer = llama.LlamaDecoderLayer(cfg, 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(x.shape[1], device=x.device)[None]
        cos, sin = self.rotary(x, pos)
        return self.layer(x, attention_mask=None, position_embeddings=(cos, sin), position_ids=pos)


def activation_counts(plan: autoshard.Plan, phase: str) -> Counter[str]:
    """Collectives of ``phase`` that move activations (not a parameter's gradient synchronisation)."""
    return Counter(
        c.kind for c in plan.collectives if c.phase == phase and c.node not in plan.param_placements
    )


def test_megatron_sp_is_the_optimum_of_a_real_size_layer_with_4_and_4_collectives() -> None:
    """At real size (hidden 1024, 2 x 1024 tokens, A100) the search itself picks sequence-parallel norms
    once the linears are pinned Megatron-style, and pays each all-gather once for q, k and v (and gate, up)."""
    with torch.device("meta"):
        model, x = LlamaLayer(1024, 16, 8, 4096), torch.randn(2, 1024, 1024)
    plan = autoshard.plan(model, cluster_for("a100x8", 2), (x,), annotations=MEGATRON_SP)
    assert activation_counts(plan, "forward") == SP_FORWARD
    assert activation_counts(plan, "backward") == SP_BACKWARD
    # the two norm weights are replicated: their gradients are all-reduced, nothing else is
    params = Counter(c.kind for c in plan.collectives if c.node in plan.param_placements)
    assert params == {"all_reduce": 2}
    assert plan.solver.optimal
    assert plan.predicted_step_time == pytest.approx(plan.solver.objective, rel=1e-6)


def _sp_plan(model: nn.Module, x: torch.Tensor, cluster) -> autoshard.Plan:
    """At toy size the search (rightly) prefers plain TP; pin the norms' ops and the residual adds (the
    only 3-D adds: RoPE's are 4-D) to the sequence split as well."""
    captured = capture(model, (x,), {})
    _, built = _build(captured, cluster, CostOptions(), MEGATRON_SP, float("inf"), {})  # (unpinned, pinned)
    seq = ShardingSpec.parse(("S(1)",))
    allowed = list(built.problem.allowed or [None] * built.problem.num_nodes)
    for k, name in enumerate(built.variables):
        info = built.infos[name]
        residual = info.op == "add" and info.outputs[0] is not None and len(info.outputs[0].shape) == 3
        if info.kind == "op" and (info.module.endswith("layernorm") or residual):
            allowed[k] = np.array([s.outputs[0] == seq for s in built.strategies[name]])
    built = dataclasses.replace(built, problem=dataclasses.replace(built.problem, allowed=tuple(allowed)))
    solution = solve(built.problem)
    return extract_plan(
        built,
        solution,
        model="LlamaLayer",
        block_prefix=None,
        output_order=_output_order(captured),
        timings={},
    )


def test_sp_layer_emits_each_redistribution_once_and_runs_it_once_on_gloo() -> None:
    torch.manual_seed(0)
    model, x = LlamaLayer(64, 4, 2, 128).double(), torch.randn(2, 16, 64, dtype=torch.float64)
    cluster = cluster_for("cpu", 2)
    plan = _sp_plan(model, x, cluster)
    assert activation_counts(plan, "forward") == SP_FORWARD
    assert activation_counts(plan, "backward") == SP_BACKWARD
    planned = Counter(f"{c.phase} {c.kind}" for c in plan.collectives)
    captured = capture(model, (x,), {}, blocks="full")
    lowered = lower_graph(captured, assign_strategies(captured, plan), plan_cluster(plan), (1,))
    code = lowered.graph.python_code("self").src
    assert code_counts(code) == planned
    # q, k and v read one gathered copy of the norm's output: one redistribute node feeds all three
    gathered = [n for n in lowered.graph.nodes if n.name.startswith("to_") or "_to_linear" in n.name]
    shared = [n for n in gathered if "all_gather" in str(n.args[2:3]) and len(n.users) >= 3]
    assert shared, "the all-gathered norm output must feed q, k and v from one node"
    report = verify(model, (x,), plan=plan, captured=captured, name="llama-layer-sp")
    assert report.ok, str(report)
    assert report.emitted == planned and report.ranks_agree, "collectives counted at run time on gloo"
    assert report.emitted["forward all_gather"] == 2 and report.emitted["backward reduce_scatter"] == 2
