"""Gradient sync outside repeated layers is priced where its gradient is ready (autoshard/problem/step.py).

Data parallelism on an MLP: backward runs fc2, then fc1.  fc2's gradient is ready first and its all-reduce
runs under fc1's backward; fc1's is ready only as backward ends, so it is exposed (the last bucket).  A
one-layer model has nothing left to hide its sync.  Expected times are worked out by hand from the
cluster's all-reduce price of each weight and the layer's backward (a weight gradient GEMM: fc1's input
needs no gradient, so its backward is one GEMM the size of its forward).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import autoshard
from autoshard.capture import capture
from autoshard.planner_rerank import lower_bound_problem
from autoshard.problem.build import build_problem
from autoshard.problem.costs import CostOptions
from autoshard.problem.ready import backward_units
from autoshard.search import solve
from cost_models.overlap import OverlapPolicy, sync_schedule


class OneLayer(nn.Module):
    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.fc = nn.Linear(hidden, ffn, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


class TwoLayers(nn.Module):
    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(hidden, ffn, bias=False)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


def _plan(model: nn.Module, x: torch.Tensor, nodes: int = 1) -> autoshard.Plan:
    cluster = autoshard.load_cluster("a100x8", nodes=nodes, mesh=(8 * nodes,))
    return autoshard.plan(model, cluster, (x,), allow=("dp",))


def _sync(plan: autoshard.Plan, name: str, numel: int) -> float:
    """The all-reduce of one weight's gradient, by hand: the cluster's price of its fp32 bytes on axis 0."""
    (c,) = [c for c in plan.collectives if c.phase == "backward" and c.node == name]
    assert c.kind == "all_reduce" and c.nbytes == numel * 4
    cluster = autoshard.load_cluster("a100x8", nodes=plan.cluster["nodes"], mesh=plan.mesh_shape)
    return cluster.collective_time("all_reduce", c.nbytes, 0)


def _meta(tokens: int, hidden: int, ffn: int) -> tuple[nn.Module, torch.Tensor]:
    with torch.device("meta"):
        return TwoLayers(hidden, ffn), torch.randn(tokens, hidden)


def test_two_layers_expose_only_fc1s_sync_when_fc1s_backward_hides_fc2s() -> None:
    model, x = _meta(65536, 2048, 8192)  # 64 MiB of gradient per weight: a bucket each
    plan = _plan(model, x)
    fc1, fc2 = _sync(plan, "fc1.weight", 2048 * 8192), _sync(plan, "fc2.weight", 8192 * 2048)
    fc1_backward = next(n for n in plan.nodes if n.module == "fc1" and n.target.endswith("linear.default"))
    assert fc2 < fc1_backward.compute_seconds / 2, "compute-bound: fc1's backward outlasts fc2's sync"
    sync = plan.grad_sync
    assert sync is not None and sync.seconds == pytest.approx(fc1 + fc2, rel=1e-9)
    assert sync.exposed == pytest.approx(fc1, rel=1e-9)  # the last bucket, fc1's; fc2's hides
    assert sync.last == ("fc1.weight",)
    assert plan.predicted_step_time == pytest.approx(plan.compute_time + fc1, rel=1e-9)
    assert plan.solver.step_optimal, "the lower bound charges exactly the last bucket: the step is proven"
    line = " ".join(plan.summary().split())
    assert "the last bucket (fc1.weight: " in line and "the rest hides under backward" in line


def test_two_layers_communication_bound_hide_fc2s_sync_only_for_fc1s_backward() -> None:
    """Across two nodes the syncs outlast fc1's backward: exposed = s1 + s2 - fc1's backward (by hand)."""
    model, x = _meta(2048, 2048, 8192)  # 64 MiB per weight: a bucket each
    plan = _plan(model, x, nodes=2)
    fc1, fc2 = _sync(plan, "fc1.weight", 2048 * 8192), _sync(plan, "fc2.weight", 8192 * 2048)
    seconds = {n.module: n.compute_seconds for n in plan.nodes if n.target.startswith("aten.")}
    # what runs after fc2's gradient is ready: relu's backward (one kernel, its forward's size) and fc1's
    # (its weight gradient only -- the input needs none -- one GEMM the size of its forward)
    backward = seconds["act"] / 2 + seconds["fc1"] / 2
    assert fc2 > backward
    assert plan.grad_sync is not None
    assert plan.grad_sync.exposed == pytest.approx(fc1 + fc2 - backward, rel=1e-6)
    assert fc1 < plan.grad_sync.exposed < fc1 + fc2


def test_one_layer_exposes_its_whole_sync() -> None:
    """Nothing runs after the only layer's backward: its sync is exposed in full (correct, not a defect)."""
    with torch.device("meta"):
        model, x = OneLayer(1024, 4096), torch.randn(65536, 1024)
    plan = _plan(model, x)
    (c,) = [c for c in plan.collectives if c.phase == "backward"]
    whole = autoshard.load_cluster("a100x8").collective_time("all_reduce", c.nbytes, 0)
    assert plan.grad_sync is not None
    assert plan.grad_sync.exposed == pytest.approx(whole, rel=1e-9) == plan.grad_sync.seconds
    assert plan.predicted_step_time == pytest.approx(plan.compute_time + whole, rel=1e-9)
    assert "nothing is left to hide it" in " ".join(plan.summary().split())


def test_the_lower_bound_never_exceeds_the_step_and_is_met_when_fc2_has_its_own_bucket() -> None:
    """The bound lets fc2's sync hide (it is ready before fc1's).  With 64 MiB of gradient per weight fc2 has
    its own bucket and does hide: the bound is met and data parallel is proven.  At 16 MiB both weights share
    one bucket, issued as backward ends, so nothing hides: the bound stays below the step (a plan whose fc1
    reduces nothing would issue fc2's bucket early, and no linear term can tell the two apart)."""
    cluster = autoshard.load_cluster("a100x8", mesh=(8,))
    for hidden, proven in ((2048, True), (1024, False)):
        model, x = _meta(65536, hidden, 4 * hidden)
        built = build_problem(capture(model, (x,)), cluster, CostOptions())
        assert backward_units(built).hidden("p_fc2_weight") and not backward_units(built).hidden(
            "p_fc1_weight"
        )
        lower = lower_bound_problem(built)
        assert lower is not None
        plan = autoshard.plan(model, cluster, (x,), allow=("dp",))
        assert plan.solver.step_bound is not None and plan.solver.step_optimal is proven
        assert plan.solver.step_bound <= plan.predicted_step_time * (1 + 1e-9)
        assert solve(lower, method="exact").objective <= plan.predicted_step_time * (1 + 1e-9)


def test_a_partly_filled_bucket_is_issued_when_its_last_gradient_is_ready() -> None:
    """Units without a reduction (fc1 stored split) neither join nor hold back a bucket: fc2's small bias
    sync is issued after fc2's backward and hides under fc1's."""
    exposed, last = sync_schedule([1.0, 2.0], [0.5, 0.0], OverlapPolicy(bucket_bytes=100), grad_bytes=[10, 0])
    assert exposed == 0.0 and last == [0]
    exposed, last = sync_schedule(
        [1.0, 2.0], [0.5, 0.25], OverlapPolicy(bucket_bytes=100), grad_bytes=[10, 10]
    )
    assert exposed == pytest.approx(0.75) and last == [0, 1]  # one bucket, issued at the end
