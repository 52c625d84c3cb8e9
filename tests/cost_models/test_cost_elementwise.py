"""Elementwise work the H100 step showed and the byte roofline missed (autoshard/problem/elementwise.py), each
term on a tiny real module captured by autoshard."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from autoshard.capture import capture
from autoshard.problem.elementwise import (
    MASTER_CAST_BYTES,
    STRIDED_BYTES_PER_ELEMENT,
    extra_seconds,
    master_cast_seconds,
)
from autoshard.problem.graph import NodeInfo, describe
from autoshard.runtime.verify import cluster_for

ROWS, WIDTH = 16384, 1024  # large enough that every kernel here is above the H100's launch floor
BW = 3.015e12  # h100x8's achieved HBM bandwidth


class Tiny(nn.Module):
    """A residual fan-out, a broadcast norm weight, a transposed copy and a biased linear layer."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(WIDTH, dtype=torch.bfloat16))
        self.pre = nn.Linear(WIDTH, WIDTH, bias=False, dtype=torch.bfloat16)
        self.proj = nn.Linear(WIDTH, WIDTH, dtype=torch.bfloat16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.pre(x))  # read by three consumers that need its gradient
        y = self.weight * h + h
        z = y.transpose(0, 1).contiguous()
        return self.proj(z.transpose(0, 1)) + h


@pytest.fixture(scope="module")
def graph() -> dict[str, NodeInfo]:
    with torch.device("meta"):
        model, x = Tiny(), torch.randn(ROWS, WIDTH, dtype=torch.bfloat16, requires_grad=True)
    return {n.name: n for n in describe(capture(model, (x,), {}).graph_module)}


def _price(graph: dict[str, NodeInfo], op: str, training: bool = True) -> tuple[float, float]:
    node = [n for n in graph.values() if n.op == op][-1]
    inputs = tuple(graph[s] for s in node.inputs)
    local = float(node.outputs[0].nbytes) if node.outputs[0] else 0.0
    moved = local + sum(float(s.outputs[0].nbytes) for s in inputs if s.outputs[0] is not None)
    return extra_seconds(node, inputs, moved, local, cluster_for("h100x8", 1), training)


def test_a_tensor_read_by_three_gradient_consumers_pays_two_accumulating_adds(
    graph: dict[str, NodeInfo],
) -> None:
    relu = next(n for n in graph.values() if n.op == "relu")
    assert relu.grad_users == 3
    bytes_ = ROWS * WIDTH * 2
    assert _price(graph, "relu") == pytest.approx((0.0, 2 * 3 * bytes_ / BW), rel=1e-6)
    assert _price(graph, "relu", training=False) == (0.0, 0.0)


def test_a_broadcast_weight_product_runs_the_strided_loop_and_reduces_its_gradient(
    graph: dict[str, NodeInfo],
) -> None:
    elements = ROWS * WIDTH
    fwd, bwd = _price(graph, "mul")
    excess = elements * STRIDED_BYTES_PER_ELEMENT / BW - (elements * 4 + WIDTH * 2) / BW
    assert fwd == pytest.approx(excess, rel=1e-6)
    # backward: the strided loop again for h's gradient, and the weight's gradient summed over the rows
    assert bwd == pytest.approx(excess + elements * 2 / BW, rel=1e-6)


def test_contiguous_of_a_transpose_copies_each_way_and_the_bias_gradient_is_a_row_sum(
    graph: dict[str, NodeInfo],
) -> None:
    copy = ROWS * WIDTH * 2 * 2 / BW
    assert _price(graph, "contiguous") == pytest.approx((copy, copy), rel=1e-6)
    linear = [n for n in graph.values() if n.op == "linear"][-1]
    assert len(linear.inputs) == 3 and linear.grad_users == 1
    assert _price(graph, "linear") == pytest.approx((0.0, ROWS * WIDTH * 2 / BW), rel=1e-6)


def test_master_weight_casts_only_for_16_bit_weights_with_an_fp32_master() -> None:
    cluster = cluster_for("h100x8", 1)
    numel = 1.24e9  # llama-1b: measured 6.97 ms of master-cast kernels on the H100 (second session)
    assert master_cast_seconds(numel, 2, 12, cluster) == pytest.approx(numel * MASTER_CAST_BYTES / BW)
    assert 6e-3 < master_cast_seconds(numel, 2, 12, cluster) < 7.5e-3
    assert master_cast_seconds(numel, 4, 8, cluster) == 0.0  # fp32 weights: no master copy
    small = master_cast_seconds(1000, 2, 12, cluster)  # two launch-bound kernels
    assert small == pytest.approx(2 * cluster.profile.compute.launch_floor)
