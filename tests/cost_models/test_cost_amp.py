"""The amp recipe (``autoshard.plan(..., precision="amp")``): autocast's dtypes read from a captured graph, its
priced terms (fp32 activations, activation and weight casts, foreach AdamW, fp32 weights), on CPU."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import autoshard
from autoshard.capture import capture
from autoshard.errors import ProfileError
from autoshard.problem.autocast import autocast_seconds
from autoshard.problem.elementwise import autocast_update_seconds, recipe
from autoshard.problem.graph import NodeInfo, describe
from autoshard.problem.hidden_ops import UPCAST_BYTES
from autoshard.runtime.verify import cluster_for
from cost_models.memory import AMP_BF16, FOREACH_ADAMW_BYTES

ROWS, WIDTH, VOCAB = 8192, 1024, 4096
BW = 3.015e12  # h100x8's achieved HBM bandwidth


class Block(nn.Module):
    """Embedding, an RMS norm as HF writes it (upcast, scale, cast back), a projection, a residual add."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH, dtype=torch.bfloat16)
        self.norm = nn.Parameter(torch.ones(WIDTH, dtype=torch.bfloat16))
        self.proj = nn.Linear(WIDTH, WIDTH, bias=False, dtype=torch.bfloat16)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False, dtype=torch.bfloat16)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        x = h.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        n = self.norm * x.to(h.dtype)
        h = h + self.proj(n)
        return self.head(h)


def _ids() -> torch.Tensor:
    return torch.zeros(4, ROWS // 4, dtype=torch.long, device="meta")


@pytest.fixture(scope="module")
def graph() -> dict[str, NodeInfo]:
    with torch.device("meta"):
        model = Block()
    return {n.name: n for n in describe(capture(model, (_ids(),), {}).graph_module)}


def test_autocast_dtypes_follow_torchs_op_lists(graph: dict[str, NodeInfo]) -> None:
    by_op = {n.op: n.autocast_dtype for n in graph.values() if n.kind == "op"}
    assert by_op["embedding"] == "float32"  # fp32 weights
    assert by_op["linear"] == "bfloat16"  # autocast's lower-precision list
    residual = next(n for n in graph.values() if n.op == "add" and n.outputs[0].dtype == "bfloat16")
    assert residual.autocast_dtype == "float32"  # the residual stream: fp32 + bf16 promotes
    assert by_op["pow"] == by_op["rsqrt"] == "float32"
    params = [n for n in graph.values() if n.kind == "parameter"]
    assert params and all(n.autocast_dtype == "float32" and n.outputs[0].dtype == "bfloat16" for n in params)


def test_casts_that_autocast_makes_no_ops_are_taken_back_and_fp32_operands_priced(
    graph: dict[str, NodeInfo],
) -> None:
    cluster = cluster_for("h100x8", 1)
    casts = [n for n in graph.values() if n.op in ("to", "_to_copy")]
    assert casts  # HF's upcast and cast back: both fp32 -> fp32 under amp, nothing runs
    for cast in casts:
        inputs = tuple(graph[s] for s in cast.inputs)
        moved = 6.0 * ROWS * WIDTH
        f, b = autocast_seconds(cast, inputs, moved, cast.outputs[0].nbytes, cluster, training=True)
        assert f < 0 and b < 0
    proj = next(n for n in graph.values() if n.op == "linear")
    inputs = tuple(graph[s] for s in proj.inputs)
    f, b = autocast_seconds(proj, inputs, 0.0, float(proj.outputs[0].nbytes), cluster, training=True)
    # the norm's fp32 output is cast down once for the product (4 read, 2 written), its gradient back up
    assert (f, b) == pytest.approx((ROWS * WIDTH * 6 / BW, ROWS * WIDTH * UPCAST_BYTES / BW), rel=0.01)
    add = next(n for n in graph.values() if n.op == "add" and n.outputs[0].dtype == "bfloat16")  # residual
    inputs = tuple(graph[s] for s in add.inputs)
    moved = float(sum(graph[s].outputs[0].nbytes for s in add.inputs) + add.outputs[0].nbytes)
    f, _ = autocast_seconds(add, inputs, moved, float(add.outputs[0].nbytes), cluster, training=True)
    assert f == pytest.approx(moved * (4 + 2 + 4) / 6 / BW - moved / BW, rel=0.01)  # fp32 + bf16 -> fp32


def test_amp_update_is_foreach_adamw_and_the_weight_casts() -> None:
    cluster = cluster_for("h100x8", 1)
    numel = 1.24e9  # llama-1b: foreach AdamW 36.2 ms measured on the H100 (gpu_step_ops_llama-1b_amp.txt)
    seconds = autocast_update_seconds(numel, AMP_BF16, cluster)
    assert seconds == pytest.approx(numel * (FOREACH_ADAMW_BYTES + 6 + UPCAST_BYTES) / BW, rel=0.01)
    assert autocast_update_seconds(numel, recipe("amp") or AMP_BF16, cluster) == seconds
    assert recipe("bf16") is None
    with pytest.raises(ProfileError, match="precision='fp8'"):
        recipe("fp8")


def test_the_planner_prices_amp_as_a_recipe_the_user_picks() -> None:
    with torch.device("meta"):
        model = Block()
    params = sum(p.numel() for p in model.parameters())
    cluster = cluster_for("h100x8", 1)
    bf16 = autoshard.plan(model, cluster, (_ids(),), recompute="none", memory_limit=float("inf"))
    amp = autoshard.plan(
        model, cluster, (_ids(),), recompute="none", memory_limit=float("inf"), precision="amp"
    )
    # state: 2 + 2 + 12 bytes per parameter against fp32 weights, the kept bf16 casts, fp32 grads, moments
    extra = amp.memory_per_device - bf16.memory_per_device
    assert extra >= params * (4 + 2 + 4 + 8 - 16)
    assert amp.predicted_step_time > bf16.predicted_step_time
    with pytest.raises(ProfileError):
        autoshard.plan(model, cluster, (_ids(),), precision="fp8")  # type: ignore[arg-type]
