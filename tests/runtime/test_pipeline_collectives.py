"""A pipelined plan's collectives are the stages' own, and one run issues exactly them.

1. Plan level: every stage the runtime prepares runs the whole plan's decisions (not a fresh stage search),
   so its plan lists, record for record, what :func:`~autoshard.pipeline.cuts.stage_collectives` reads
   back from ``Plan.collectives`` for that stage (ZB-V, one layer per chunk, Megatron TP inside).
2. On 4 gloo ranks (LLaMA, and a residual MLP whose stages start with a column-split linear): one
   training step logs, on every rank, each collective of its stages' share of ``Plan.collectives`` as
   often as the plan says (once per microbatch, a gradient sync once) -- same phases, kinds, axes and
   bytes -- and none other; the residual MLP's gradients equal one device's.
"""

from __future__ import annotations

import copy
import functools
from collections import Counter

import pytest
import torch
import torch.nn.functional as F

import autoshard
from autoshard import zoo
from autoshard.codegen import parallel_info
from autoshard.codegen.shard import gather_full
from autoshard.pipeline.cuts import per_step, stage_collectives
from autoshard.plans import Plan
from autoshard.runtime.launch import launch
from autoshard.runtime.pipelining import build_pipeline, step
from autoshard.runtime.stages import StageBuild, prepare_stages
from autoshard.runtime.verify import cluster_for

MEGATRON = {
    **{f"*.{m}": "column" for m in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")},
    **{f"*.{m}": "row" for m in ("o_proj", "down_proj")},
}


def _key(c) -> tuple[str, str, int, int]:
    return (c.phase, str(c.kind), c.mesh_axis, c.nbytes)


@functools.cache
def _case() -> tuple[torch.nn.Module, torch.Tensor, Plan, tuple[StageBuild, ...]]:
    torch.manual_seed(0)
    case = zoo.build("llama-tiny", batch=8, seq=8, layers=4)
    model, ids = case.model.to(torch.float64), case.args[0]
    plan = autoshard.plan(
        model, cluster_for("cpu", 4, (2, 2)), (ids,), pipeline=2, microbatches=4, schedule="zb_v",
        annotations=MEGATRON,
    )  # fmt: skip
    return model, ids, plan, prepare_stages(model, plan, (ids,), MEGATRON)


def test_stage_plans_list_the_plans_collectives() -> None:
    _, _, plan, builds = _case()
    assert plan.pipeline is not None and len(plan.pipeline.stages) == 4  # one layer per chunk
    for b in builds:
        mine = Counter(_key(c) for c in stage_collectives(plan, b.index))
        assert sum(mine.values()) > 0
        assert Counter(_key(c) for c in b.plan.collectives) == mine, b.index
    # every record of the plan off the pipeline axis belongs to some stage
    listed = sum(len(stage_collectives(plan, i)) for i in range(4))
    assert listed >= sum(1 for c in plan.collectives if c.mesh_axis != 0)


def _rank(model, plan, builds, ids) -> list[tuple[int, Counter]]:
    loss = lambda y, t: F.cross_entropy(y.flatten(0, 1), t.flatten())  # noqa: E731
    run = build_pipeline(model, plan, (ids,), loss, stages=builds, record=True)
    step(run, ids, torch.roll(ids, -1, 1))
    return [
        (
            index,
            Counter((r.phase, str(r.kind), r.mesh_axis, r.nbytes) for r in parallel_info(m).comm.log or ()),
        )
        for m, index in zip(run.modules, run.stage_indices, strict=True)
    ]


@pytest.mark.slow
def test_one_step_issues_the_plans_collectives() -> None:
    model, ids, plan, builds = _case()
    for ran in launch(_rank, 4, model, plan, builds, ids, timeout=600):
        for index, issued in ran:
            planned: Counter = Counter()
            for c in stage_collectives(plan, index):
                planned[_key(c)] += per_step(plan, c)
            assert sum(planned.values()) > 0 and {k[0] for k in planned} == {"forward", "backward"}
            assert issued == planned, index


def test_a_stage_runs_the_plans_context_parallelism_not_a_search_of_its_own() -> None:
    """A 512-wide LLaMA, 4 one-layer chunks on 4-device stages: the pipeline search picks context parallel 4
    (zigzag).  Each stage planned again on its own (only weights and input pinned) chose otherwise and ran none
    of the plan's gradient syncs; each stage now runs the plan's decisions."""
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=512, intermediate_size=2048, num_hidden_layers=4, num_attention_heads=8,
        num_key_value_heads=4, vocab_size=1024, max_position_embeddings=64, use_cache=False,
        attn_implementation="sdpa", bos_token_id=0, eos_token_id=1023,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 1024, (4, 64))
    plan = autoshard.plan(
        model, cluster_for("a100x8", 8, (2, 4)), (ids,), pipeline=2, microbatches=4, schedule="zb_v"
    )
    assert plan.degrees.get("cp") == 4 and plan.context_layout == "zigzag"
    for b in prepare_stages(model, plan, (ids,)):
        assert b.plan.degrees == {"cp": 4} and b.plan.zigzag_axis == plan.stage_zigzag_axis
        mine = Counter(_key(c) for c in stage_collectives(plan, b.index))
        assert Counter(_key(c) for c in b.plan.collectives) == mine and sum(mine.values()) > 0


class _Block(torch.nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(hidden, 4 * hidden), torch.nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.relu(self.fc1(x)))


class _Residual(torch.nn.Module):
    """Residual MLP blocks whose first op is a column-split linear: a stage's input feeds it directly."""

    def __init__(self, hidden: int = 16, layers: int = 4) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(_Block(hidden) for _ in range(layers))
        self.head = torch.nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def _residual_rank(model, plan, builds, x, y, ref) -> tuple[float, list[tuple[int, Counter]]]:
    run = build_pipeline(model, plan, (x,), F.mse_loss, stages=builds, record=True)
    step(run, x, y)
    logs, error = [], 0.0
    for m, index in zip(run.modules, run.stage_indices, strict=True):
        info = parallel_info(m)
        logs.append(
            (index, Counter((r.phase, str(r.kind), r.mesh_axis, r.nbytes) for r in info.comm.log or ()))
        )
        for a in info.attrs:
            if a.kind == "parameter":
                whole = gather_full(m.get_parameter(a.fqn).grad, a.spec, a.global_shape, info.comm)
                error = max(error, float((whole - ref[a.fqn]).abs().max()))
    return error, logs


@pytest.mark.slow
def test_a_later_stage_reduces_its_input_gradient() -> None:
    """Each later stage's input gradient is all-reduced before it goes back (the column-split fc1 reads the
    input directly; that all-reduce was listed in the plan but not run, so every earlier stage's gradients
    were off by ~1e-3 in float64)."""
    torch.manual_seed(0)
    model = _Residual().double()
    x, y = torch.randn(8, 4, 16, dtype=torch.float64), torch.randn(8, 4, 16, dtype=torch.float64)
    pins = {"*.fc1": "column", "*.fc2": "row"}
    plan = autoshard.plan(
        model,
        cluster_for("cpu", 4, (2, 2)),
        (x,),
        pipeline=2,
        microbatches=4,
        schedule="zb_v",
        annotations=pins,
    )
    builds = prepare_stages(model, plan, (x,), pins)
    for b in builds[1:]:  # the input's gradient all-reduce, listed where the plan lists it
        assert any(c.phase == "backward" and c.tensor == "inputs" for c in b.plan.collectives)
    reference = copy.deepcopy(model)
    F.mse_loss(reference(x), y).backward()
    ref = {k: p.grad for k, p in reference.named_parameters()}
    for error, logs in launch(_residual_rank, 4, model, plan, builds, x, y, ref, timeout=600):
        assert error < 1e-12
        for index, issued in logs:
            planned: Counter = Counter()
            for c in stage_collectives(plan, index):
                planned[_key(c)] += per_step(plan, c)
            assert issued == planned, index
