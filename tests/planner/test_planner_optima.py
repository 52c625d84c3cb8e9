"""Known optima: the plans experts write must come out of the search, under the same cost model."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import autoshard
from autoshard import zoo
from autoshard.zoo import MLP


def WideMLP(hidden: int = 8192, ffn: int = 32768) -> nn.Module:
    return MLP(hidden, ffn)


class DeepMLP(nn.Module):
    """REFERENCE.md canonical plan 5: N linear layers of hidden 256 with ReLU between them."""

    def __init__(self, depth: int, hidden: int = 256) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            *[nn.Sequential(nn.Linear(hidden, hidden, bias=False), nn.ReLU()) for _ in range(depth)]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def _forward(plan: autoshard.Plan, kind: str) -> int:
    return sum(1 for c in plan.collectives if c.phase == "forward" and c.kind == kind)


def test_megatron_mlp_on_one_a100_node() -> None:
    with torch.device("meta"):
        model, x = WideMLP(), torch.randn(1, 1024, 8192)
    plan = autoshard.plan(model, autoshard.load_cluster("a100x8"), (x,))
    assert plan.param_placements["fc1.weight"] == ("S(0)",)
    assert plan.param_placements["fc2.weight"] == ("S(1)",)
    assert _forward(plan, "all_reduce") == 1
    assert _forward(plan, "all_gather") == 0
    assert plan.solver.optimal and plan.solver.gap == 0.0


def test_seed_text_model_gets_data_parallel() -> None:
    case = zoo.build("seed", batch=2048, seq=512, device="meta")
    plan = autoshard.plan(case.model, autoshard.load_cluster("a100x8"), case.args, case.kwargs)
    assert set(plan.param_placements.values()) == {("R",)}
    grads = {c.node for c in plan.collectives if c.phase == "backward" and c.kind == "all_reduce"}
    assert grads == set(plan.param_placements), "every replicated parameter needs its gradient all-reduced"
    assert plan.input_placements[next(iter(plan.input_placements))] == ("S(0)",)
    assert not any(c.phase == "forward" for c in plan.collectives)


def test_two_nodes_data_parallel_across_tensor_parallel_inside() -> None:
    """Across nodes only data parallelism (REFERENCE.md 8).  Inside the node, Megatron's TP and data
    parallelism (hierarchical all-reduce) are within 0.3% of each other at this batch; since the loss after
    the returned output is priced (autoshard/problem/hidden_ops.py, measured on an H100), TP's output,
    replicated on the 8 TP ranks, costs each of them the fp32 loss over 64 x 2048 x 8192 values, and data
    parallel inside comes out 0.3% ahead (2.025 s against 2.030 s).  Either is the expert plan."""
    with torch.device("meta"):
        model, x = WideMLP(), torch.randn(64, 2048, 8192)
    plan = autoshard.plan(model, autoshard.load_cluster("a100x8", nodes=2, mesh=(2, 8)), (x,))
    inside = (plan.param_placements["fc1.weight"], plan.param_placements["fc2.weight"])
    assert inside in ((("R", "S(0)"), ("R", "S(1)")), (("R", "R"), ("R", "R")))
    assert plan.input_placements["x"][0] == "S(0)", "the batch is split over the inter-node axis"
    inter = [c for c in plan.collectives if c.mesh_axis == 0]
    assert inter and all(c.phase == "backward" and c.kind == "all_reduce" for c in inter), (
        "only gradient synchronisation may cross nodes"
    )


@pytest.mark.parametrize("depth", [2, 4, 6])
def test_deep_mlp_alternates_column_and_row(depth: int) -> None:
    """REFERENCE.md plan 5 with the batch pinned replicated ("only model parallelism is allowed").

    At hidden 256 every op sits at the A100 launch floor and replicating everything is genuinely fastest
    (tests/planner/test_planner_costs.py checks that); from hidden 4096 on, splitting compute pays and the
    Megatron alternation is optimal.
    """
    with torch.device("meta"):
        model, x = DeepMLP(depth, hidden=4096), torch.randn(32, 4096)
    plan = autoshard.plan(model, autoshard.load_cluster("a100x8"), (x,), annotations={"x": ("R",)})
    placements = [plan.param_placements[f"layers.{i}.0.weight"] for i in range(depth)]
    assert placements == [("S(0)",), ("S(1)",)] * (depth // 2)
    # one all-reduce after every row-split layer; column -> row needs nothing
    assert _forward(plan, "all_reduce") == depth // 2
    assert _forward(plan, "all_gather") == 0
    # backward: the Megatron f operator before every column layer except the first (x needs no gradient)
    backward = sum(1 for c in plan.collectives if c.phase == "backward" and c.kind == "all_reduce")
    assert backward == depth // 2 - 1
    # so the whole step has exactly N - 1 all-reduces, as REFERENCE.md counts them
    assert plan.collective_counts()["all_reduce"] == depth - 1
