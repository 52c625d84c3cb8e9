"""Capture's coverage rewrites keep the model's numbers: training batch norm as statistic ops, slice
assignment as ``slice_scatter``, the grouped-GEMM expert MLP and its routing fused into one node."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from autoshard.capture import capture, graph_inputs
from autoshard.capture.dispatch import routed_experts
from autoshard.zoo_extra import ResNetCNN

aten = torch.ops.aten


def _targets(cap: object) -> set[object]:
    return {n.target for n in cap.graph_module.graph.nodes}  # type: ignore[attr-defined]


def test_training_batch_norm_becomes_statistic_ops_with_the_same_numbers() -> None:
    torch.manual_seed(0)
    model = ResNetCNN(channels=4, depth=2).train().double()
    x = torch.randn(6, 3, 8, 8, dtype=torch.float64)
    cap = capture(model, (x,), blocks="full")
    assert aten.batch_norm.default not in _targets(cap)
    assert any("batch norm(s) written as statistic ops" in n for n in cap.notes)
    got = cap.graph_module(*graph_inputs(cap, model, (x,)))
    got = got[0] if isinstance(got, tuple | list) else got
    torch.testing.assert_close(got, model(x), rtol=1e-10, atol=1e-12)


def test_eval_batch_norm_stays_one_op() -> None:
    model = ResNetCNN(channels=4, depth=1).eval()
    cap = capture(model, (torch.randn(2, 3, 8, 8),), blocks=None)
    assert aten.batch_norm.default in _targets(cap)


class SliceAssign(nn.Module):
    """DeepSeek's MLA idiom: fill a new buffer through slices, then read the buffer."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        buf = a.new_empty(*a.shape[:-1], a.shape[-1] + b.shape[-1])
        buf[..., : a.shape[-1]] = a
        buf[..., a.shape[-1] :] = b.expand(*a.shape[:-1], b.shape[-1])
        return buf * 2


def test_slice_assignment_becomes_slice_scatter() -> None:
    a, b = torch.randn(2, 3, 4), torch.randn(1, 1, 2)
    cap = capture(SliceAssign(), (a, b), blocks=None)
    targets = _targets(cap)
    assert aten.copy_.default not in targets and aten.slice_scatter.default in targets
    got = cap.graph_module(*graph_inputs(cap, SliceAssign(), (a, b)))
    got = got[0] if isinstance(got, tuple | list) else got
    torch.testing.assert_close(got, SliceAssign()(a, b), rtol=0, atol=0)


def test_routed_experts_are_fused_with_the_same_numbers() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.MixtralConfig(
        hidden_size=32, intermediate_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=64, num_local_experts=4, num_experts_per_tok=2, use_cache=False, router_jitter_noise=0.0,
    )  # fmt: skip
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = transformers.MixtralForCausalLM(config).eval()
    ids = torch.randint(0, 64, (2, 8))
    cap = capture(model, (ids,), blocks=None)
    targets = [str(n.target) for n in cap.graph_module.graph.nodes]
    fused = [n for n in cap.graph_module.graph.nodes if n.target is routed_experts]
    assert len(fused) == 1 and not any("grouped_mm" in t or "expert_mlp" in t for t in targets)
    # the routing around the expert MLP went into the node too: no sort, histc or unsorting index_put_ left
    assert not any(t.startswith(("aten.sort", "aten.histc", "aten.index_put_")) for t in targets)
    hidden, gate_up, down, index, weights = fused[0].args[:5]
    assert [tuple(a.meta["val"].shape) for a in (hidden, gate_up, down, index, weights)] == [
        (16, 32), (4, 32, 64), (4, 32, 32), (16, 2), (16, 2)
    ]  # fmt: skip
    got = cap.graph_module(*graph_inputs(cap, model, (ids,)))
    got = got[0] if isinstance(got, tuple | list) else got
    torch.testing.assert_close(got, model(ids).logits, rtol=0, atol=0)
