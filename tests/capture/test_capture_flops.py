"""FLOP formulas: checked against torch's FlopCounterMode on real tensors where it counts the op."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from autoshard.capture import META_FLOPS, META_OP, capture
from autoshard.capture.meta import TensorMeta


class _Fn(nn.Module):
    def __init__(self, fn: Callable[..., torch.Tensor]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        return self.fn(*args)


def _ours(fn: Callable[..., torch.Tensor], *args: torch.Tensor) -> dict[str, int]:
    cap = capture(_Fn(fn), args, blocks=None)
    flops: dict[str, int] = {}
    for node in cap.op_nodes():
        flops[node.meta[META_OP]] = flops.get(node.meta[META_OP], 0) + node.meta[META_FLOPS]
    return flops


def _torch(fn: Callable[..., torch.Tensor], *args: torch.Tensor) -> int:
    with FlopCounterMode(display=False) as counter:
        fn(*args)
    return counter.get_total_flops()


def _r(*shape: int) -> torch.Tensor:
    return torch.randn(*shape)


CONTRACTIONS = [
    ("mm", torch.mm, (_r(6, 5), _r(5, 7)), "aten.mm.default"),
    ("addmm", lambda b, x, w: torch.addmm(b, x, w), (_r(7), _r(6, 5), _r(5, 7)), "aten.addmm.default"),
    ("bmm", torch.bmm, (_r(3, 6, 5), _r(3, 5, 7)), "aten.bmm.default"),
    ("baddbmm", torch.baddbmm, (_r(3, 6, 7), _r(3, 6, 5), _r(3, 5, 7)), "aten.baddbmm.default"),
    ("matmul-batched", torch.matmul, (_r(2, 3, 6, 5), _r(5, 7)), "aten.matmul.default"),
    ("linear", F.linear, (_r(2, 6, 5), _r(7, 5), _r(7)), "aten.linear.default"),
    ("linear-no-bias", F.linear, (_r(6, 5), _r(7, 5)), "aten.linear.default"),
    ("conv1d", lambda x, w: F.conv1d(x, w, padding=1), (_r(2, 4, 9), _r(6, 4, 3)), "aten.conv1d.default"),
    (
        "conv2d",
        lambda x, w: F.conv2d(x, w, stride=2),
        (_r(2, 4, 9, 9), _r(6, 4, 3, 3)),
        "aten.conv2d.default",
    ),
    (
        "conv2d-groups",
        lambda x, w: F.conv2d(x, w, groups=2),
        (_r(1, 4, 6, 6), _r(6, 2, 3, 3)),
        "aten.conv2d.default",
    ),
    (
        "conv_transpose2d",
        lambda x, w: F.conv_transpose2d(x, w, stride=2),
        (_r(1, 4, 5, 5), _r(4, 3, 3, 3)),
        "aten.conv_transpose2d.input",
    ),
]


@pytest.mark.parametrize(("label", "fn", "args", "op"), CONTRACTIONS, ids=[c[0] for c in CONTRACTIONS])
def test_contractions_match_flop_counter(label: str, fn: Callable, args: tuple, op: str) -> None:
    ours = _ours(fn, *args)
    assert op in ours, f"{label}: captured ops {sorted(ours)}"
    assert ours[op] == _torch(fn, *args) > 0


def test_mm_formula_is_2mnk() -> None:
    assert _ours(torch.mm, _r(6, 5), _r(5, 7))["aten.mm.default"] == 2 * 6 * 7 * 5


def _sdpa_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> int:
    """FLOPs of attention written as two explicit matmuls, counted by FlopCounterMode."""

    def math(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v

    return _torch(math, q, k, v)


def test_sdpa_equals_its_two_matmuls() -> None:
    q, k, v = _r(2, 4, 8, 16), _r(2, 4, 10, 16), _r(2, 4, 10, 12)
    ours = _ours(F.scaled_dot_product_attention, q, k, v)["aten.scaled_dot_product_attention.default"]
    assert ours == _sdpa_reference(q, k, v) == 2 * 2 * 4 * 8 * 10 * 16 + 2 * 2 * 4 * 8 * 10 * 12


def test_sdpa_causal_is_half() -> None:
    q = _r(1, 2, 8, 4)
    full = _ours(F.scaled_dot_product_attention, q, q, q)["aten.scaled_dot_product_attention.default"]
    causal = _ours(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True), q, q, q)
    assert causal["aten.scaled_dot_product_attention.default"] * 2 == full == 4 * 2 * 8 * 8 * 4


def test_sdpa_with_gqa_counts_query_heads() -> None:
    q, kv = _r(1, 8, 6, 4), _r(1, 2, 6, 4)
    fn = lambda a, b, c: F.scaled_dot_product_attention(a, b, c, enable_gqa=True)  # noqa: E731
    assert _ours(fn, q, kv, kv)["aten.scaled_dot_product_attention.default"] == 4 * 1 * 8 * 6 * 6 * 4


def test_grouped_mm_is_a_contraction() -> None:
    x = torch.randn(10, 16, dtype=torch.bfloat16)
    w = torch.randn(4, 16, 8, dtype=torch.bfloat16)
    offs = torch.tensor([2, 5, 9, 10], dtype=torch.int32)
    ours = _ours(lambda a, b, o: torch._grouped_mm(a, b, offs=o), x, w, offs)
    assert ours["aten._grouped_mm.default"] == 2 * 10 * 16 * 8  # every row meets exactly one expert


def test_elementwise_reduction_and_free_ops() -> None:
    x = _r(4, 6)
    assert _ours(torch.relu, x)["aten.relu.default"] == 24
    assert _ours(lambda a: a * 2 + 1, x) == {"aten.mul.Tensor": 24, "aten.add.Tensor": 24}
    assert _ours(lambda a: a.sum(dim=1), x)["aten.sum.dim_IntList"] == 24  # input elements
    assert _ours(lambda a: a.view(6, 4).transpose(0, 1), x) == {
        "aten.view.default": 0,
        "aten.transpose.int": 0,
    }
    assert _ours(lambda a: torch.softmax(a, -1), x)["aten.softmax.int"] == 5 * 24


def test_embedding_costs_nothing() -> None:
    emb = nn.Embedding(50, 8)
    cap = capture(emb, (torch.tensor([[1, 2, 3]]),))
    (node,) = cap.op_nodes()
    assert node.meta[META_OP] == "aten.embedding.default" and node.meta[META_FLOPS] == 0


def test_unknown_op_defaults_to_output_numel() -> None:
    from autoshard.capture.flops import node_flops

    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    x.meta["autoshard_tensor"] = TensorMeta((3, 5), "float32", 4)
    y = graph.call_function(torch.ops.aten.special_bessel_j0.default, (x,))
    y.meta["autoshard_tensor"] = TensorMeta((3, 5), "float32", 4)
    assert node_flops(y) == 15
