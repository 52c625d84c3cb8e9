"""The pipeline search prices a stage as the intra-op planner prices a plan: critical path, overlap, recompute."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

import autoshard
from autoshard.capture import capture
from autoshard.pipeline.layers import part_costs
from autoshard.pipeline.schedules import Schedule
from autoshard.pipeline.stages import price_split
from autoshard.problem.build import build_problem
from autoshard.problem.costs import CostOptions, Recompute
from autoshard.problem.extract import extract_plan
from autoshard.search import solve

transformers = pytest.importorskip("transformers")


def _llama(
    layers: int, hidden: int, batch: int, seq: int, vocab: int = 1024
) -> tuple[torch.nn.Module, torch.Tensor]:
    cfg = transformers.LlamaConfig(
        hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers, num_attention_heads=8,
        num_key_value_heads=8, vocab_size=vocab, max_position_embeddings=seq, use_cache=False,
        attn_implementation="sdpa", bos_token_id=0, eos_token_id=1023,
    )  # fmt: skip
    with torch.device("meta"):
        return transformers.LlamaForCausalLM(cfg), torch.zeros(batch, seq, dtype=torch.long, device="meta")


@pytest.fixture(scope="module")
def captured():
    model, ids = _llama(layers=4, hidden=256, batch=8, seq=64)
    return capture(model, (ids,))


@pytest.mark.parametrize(
    ("microbatches", "policy"), [(1, Recompute.NONE), (3, Recompute.SELECTIVE), (2, Recompute.FULL)]
)
def test_stage_time_is_the_intra_op_critical_path(captured, microbatches: int, policy: Recompute) -> None:
    """One stage holding the whole model, priced by the stage function, equals the intra-op plan's predicted
    step (problem/step.critical_path) on the same sub-mesh: the optimum and random plans that mix TP, FSDP
    gathers and gradient syncs."""
    cluster = autoshard.load_cluster("a100x8", nodes=2, mesh=(2, 8))
    built = build_problem(captured, cluster, CostOptions(microbatches=microbatches, recompute=policy))
    best = solve(built.problem, method="exact")
    rng = random.Random(microbatches)
    plans = [best]
    for _ in range(4):
        choice = list(best.choice)
        for i, name in enumerate(built.variables):
            if rng.random() < 0.5:
                choice[i] = rng.randrange(len(built.strategies[name]))
        plans.append(dataclasses.replace(best, choice=tuple(choice)))
    hidden = exposed = 0
    for solution in plans:
        intra = extract_plan(built, solution, model="llama", block_prefix=None, output_order=(), timings={})
        costs = part_costs(built, solution)
        stage = price_split(costs, (0, costs.layers), Schedule.GPIPE, 1, 1, microbatches)
        assert stage.step_seconds == pytest.approx(intra.predicted_step_time, rel=1e-12)
        hidden += costs.gather_head > 0  # FSDP gathers met the prefetch model
        exposed += costs.exposed_sync(costs.layers) > 0  # gradient syncs met the bucketed overlap model
    assert hidden and exposed


def test_pipelined_stage_hides_gradient_sync_under_its_own_layers(captured) -> None:
    """A device holding k layers exposes the sync of k layers as cost_models.overlap says, once per step."""
    cluster = autoshard.load_cluster("a100x8", nodes=2, mesh=(2, 8))
    built = build_problem(captured, cluster, CostOptions(microbatches=2))
    costs = part_costs(built, solve(built.problem, method="exact"))
    split = price_split(costs, (0, 2, 4), Schedule.ONE_F_ONE_B, 2, 1, 2)
    for device in range(2):
        assert split.once[device] == pytest.approx(
            (costs.pre if device == 0 else costs.post).once
            + 2 * costs.layer.once
            + costs.exposed_sync(2, pre=device == 0, post=device == 1)  # the part's syncs join the stream
        )
    assert costs.exposed_sync(2) <= costs.exposed_sync(4)


def test_selective_recomputation_wins_over_full_when_none_does_not_fit() -> None:
    """Under a budget between the selective and the no-recompute plans' memory, ``recompute="auto"`` plans
    selective recomputation: it fits, and it is faster than full recomputation at the same budget."""
    model, ids = _llama(layers=4, hidden=512, batch=32, seq=512)
    cluster = autoshard.load_cluster("a100x8", nodes=2, mesh=(2, 8))
    pins = {"pipeline": 2, "microbatches": 4}
    unbounded = {
        rc: autoshard.plan(model, cluster, (ids,), recompute=rc, **pins) for rc in ("none", "selective")
    }
    # just above the selective plan: midway to the no-recompute plan, a tensor-parallel plan without
    # recomputation fits (1122.6 MiB of 1122.7) once a stage counts selective's working set (+22 MiB)
    budget = 1.01 * unbounded["selective"].memory_per_device
    auto = autoshard.plan(model, cluster, (ids,), recompute="auto", memory_limit=budget, **pins)
    full = autoshard.plan(model, cluster, (ids,), recompute="full", memory_limit=budget, **pins)
    assert auto.recompute == "selective"
    assert auto.predicted_step_time < full.predicted_step_time
    assert unbounded["none"].memory_per_device > budget  # no recomputation does not fit
