"""A plan that chooses ring attention (context parallelism) runs on 4 gloo ranks and matches one device."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import autoshard
from autoshard.codegen import context
from autoshard.runtime.verify import cluster_for


class CausalAttention(nn.Module):
    """One head, batch 1: nothing to split but the sequence, so a long one makes the ring pay."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, 1, d).permute(2, 0, 3, 1, 4)
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, s, d))


@pytest.mark.slow
def test_planned_ring_attention_runs_and_matches_one_device(tmp_path: Path, monkeypatch) -> None:
    torch.manual_seed(0)
    model, x = CausalAttention(32), torch.randn(1, 4096, 32)
    plan = autoshard.plan(model, cluster_for("cpu", 4), (x,))
    (sdpa,) = [n for n in plan.nodes if "scaled_dot_product_attention" in n.target]
    assert sdpa.strategy == "S(2), S(2), S(2) -> S(2)"  # q, k, v and the output split along the sequence
    assert plan.degrees == {"cp": 4}
    hops = tmp_path / "hops"
    rotate = context._rotate

    def counted(tensors, nxt, prv, group):  # type: ignore[no-untyped-def]
        with hops.open("a") as f:  # the ranks are forked: they append to one file
            f.write("hop\n")
        return rotate(tensors, nxt, prv, group)

    monkeypatch.setattr(context, "_rotate", counted)
    report = autoshard.verify(model, (x,), plan=plan)
    assert report.ok, str(report)
    # 4 ranks x (3 hops forward + 4 backward): the ring really ran
    assert hops.read_text().count("hop") == 4 * 7
