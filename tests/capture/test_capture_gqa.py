"""Grouped-query K/V copies are marked exactly where the graph proves them: HF's ``repeat_kv`` and
``repeat_interleave`` along the heads, never a multi-head model, a copy along another dim, or K and V copied
unequally."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from autoshard import zoo
from autoshard.capture import capture
from autoshard.capture.meta import META_KV_REPEATS
from autoshard.problem.graph import describe


def _repeats(model: nn.Module, *args: torch.Tensor) -> list[int | None]:
    cap = capture(model, args)
    return [
        n.meta.get(META_KV_REPEATS) for n in cap.op_nodes() if "scaled_dot_product_attention" in str(n.target)
    ]


def test_hf_llama_repeat_kv_is_marked_and_reaches_the_node_records() -> None:
    case = zoo.build("llama-tiny", batch=1, seq=16)  # 4 heads over 2 K/V heads
    cap = capture(case.model, case.args)
    sdpa = [i for i in describe(cap.graph_module) if i.op == "scaled_dot_product_attention"]
    assert [i.kv_repeats for i in sdpa] == [2, 2]
    assert _repeats(case.model, *case.args) == [2, 2]


class Attention(nn.Module):
    """8 query heads over ``kv`` K/V heads, copied by ``how``."""

    def __init__(self, kv: int, how: str) -> None:
        super().__init__()
        self.kv, self.how = kv, how
        self.q, self.k, self.v = nn.Linear(32, 32), nn.Linear(32, 4 * kv), nn.Linear(32, 4 * kv)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q(x).view(b, s, 8, 4).transpose(1, 2)
        k, v = (f(x).view(b, s, self.kv, 4).transpose(1, 2) for f in (self.k, self.v))
        r = 8 // self.kv
        if self.how == "interleave":
            k, v = k.repeat_interleave(r, dim=1), v.repeat_interleave(r, dim=1)
        elif self.how == "tile":  # heads in the wrong order for GQA: not one run per K/V head
            k, v = k.repeat(1, r, 1, 1), v.repeat(1, r, 1, 1)
        elif self.how == "k only":
            k = k.repeat_interleave(r, dim=1)
            v = v.repeat_interleave(r, dim=1) * 1.0
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return y.transpose(1, 2).reshape(b, s, 32)


@pytest.mark.parametrize(
    ("kv", "how", "expected"),
    [(2, "interleave", 4), (8, "none", None), (2, "tile", None), (2, "k only", None)],
)
def test_only_proven_copies_are_marked(kv: int, how: str, expected: int | None) -> None:
    assert _repeats(Attention(kv, how), torch.randn(1, 8, 32)) == [expected]
