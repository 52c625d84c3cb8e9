"""The plan's step time is the critical path of cost_models.overlap: gradient sync hides under backward."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import autoshard
from autoshard.plans import Plan, load_plan
from cost_models.overlap import OverlapPolicy, bucket_layers


class Block(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(hidden, hidden, bias=False)
        self.fc2 = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.relu(self.fc1(x)))


class Stack(nn.Module):
    def __init__(self, depth: int, hidden: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Block(hidden) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def _data_parallel(tokens: int, hidden: int, nodes: int = 1) -> Plan:
    with torch.device("meta"):
        model = Stack(8, hidden).to(torch.bfloat16)
        x = torch.randn(tokens, hidden, dtype=torch.bfloat16)
    pins = {"x": ("S(0)",), "*.weight": ("R",)}
    cluster = autoshard.load_cluster("a100x8", nodes=nodes, mesh=(8 * nodes,))
    return autoshard.plan(model, cluster, (x,), annotations=pins)


def test_dp_sync_smaller_than_backward_costs_compute_plus_the_last_bucket() -> None:
    plan = _data_parallel(32768, 4096)  # 64 MiB of gradients per layer: one bucket per layer
    syncs = [c for c in plan.collectives if c.phase == "backward"]
    assert syncs and all(c.kind == "all_reduce" and c.layer is not None for c in syncs)
    assert not any(c.phase == "forward" for c in plan.collectives)
    per_layer = {i: sum(c.seconds for c in syncs if c.layer == i) for i in range(8)}
    nbytes = {i: sum(c.nbytes for c in syncs if c.layer == i) for i in range(8)}
    backward_per_layer = plan.compute_time / 8 / 2  # forward + 2x backward per layer; < 1/2 of it
    assert max(per_layer.values()) < backward_per_layer, "the case must be compute-bound"
    order = list(range(7, -1, -1))  # backward visits layer 7 first
    last = bucket_layers([nbytes[i] for i in order], plan.overlap.bucket_bytes)[-1]
    last_bucket = sum(per_layer[order[j]] for j in last)
    assert plan.predicted_step_time == _approx(plan.compute_time + last_bucket)
    assert plan.predicted_step_time < plan.compute_time + plan.communication_time
    # compute-bound: the solver's linearisation (one exposed copy per repeated layer's sync) is exact
    assert plan.solver.objective == _approx_tie(plan.predicted_step_time)


def test_communication_bound_dp_exposes_more_than_the_last_bucket() -> None:
    small = _data_parallel(4096, 2048, nodes=2)  # little compute, gradients all-reduced across two nodes
    exposed = small.predicted_step_time - small.compute_time
    last_layer = sum(c.seconds for c in small.collectives if c.layer == 0)
    assert 2 * last_layer < exposed <= small.communication_time * (1 + 1e-9)
    # communication-bound: the solver's linearisation is optimistic; the plan's critical path is not
    assert small.solver.objective < small.predicted_step_time


def test_the_overlap_policy_and_memory_breakdown_travel_with_the_plan(tmp_path) -> None:
    plan = _data_parallel(64, 256)
    assert plan.overlap == OverlapPolicy()
    assert plan.memory_breakdown["runtime reserve"] == 1e9  # a100x8.json, memory.runtime_reserve
    assert plan.memory_per_device >= sum(plan.memory_breakdown.values())
    plan.save(tmp_path / "p.json")
    again = load_plan(tmp_path / "p.json")
    assert again.overlap == plan.overlap and again.memory_breakdown == plan.memory_breakdown


def _approx(x: float):
    return pytest.approx(x, rel=1e-9)


def _approx_tie(x: float):
    return pytest.approx(x, rel=1e-6, abs=1e-9)  # the objective carries a sub-nanosecond memory tie-break


def test_precision_policy_sets_gradient_and_optimizer_bytes() -> None:
    """fp32 gradient accumulation (Megatron's main_grad) adds 2 bytes per bf16 parameter, nothing else."""
    from autoshard.capture import capture
    from autoshard.problem.build import build_problem
    from autoshard.problem.costs import CostOptions
    from cost_models.memory import PrecisionPolicy

    with torch.device("meta"):
        model = nn.Linear(256, 512, bias=False).to(torch.bfloat16)
        x = torch.randn(8, 256, dtype=torch.bfloat16)
    captured = capture(model, (x,))
    cluster = autoshard.load_cluster("a100x8")  # 8 devices; the cheapest layout shards the weight 8 ways

    def parameter_bytes(opts: CostOptions) -> float:
        built = build_problem(captured, cluster, opts)
        k = built.variables.index(next(n for n in built.variables if built.infos[n].kind == "parameter"))
        return float(built.problem.memory[k].min()) - (
            cluster.profile.memory.runtime_reserve if k == 0 else 0
        )

    default = parameter_bytes(CostOptions())
    megatron = parameter_bytes(CostOptions(precision=PrecisionPolicy(fp32_grad_accumulation=True)))
    assert megatron - default == pytest.approx(2 * 256 * 512 / cluster.num_devices, rel=1e-9)
