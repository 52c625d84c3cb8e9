"""Models, plans and captures shared by the runtime tests: each built once per test session.

Every model runs in float64 so that outputs and gradients must match the single-device model to ~1e-12.
Plans are forced with annotations where the planner would (rightly, at these sizes) replicate everything.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

import autoshard
from autoshard import zoo
from autoshard.capture import Captured, capture
from autoshard.plans import Plan
from autoshard.runtime.verify import cluster_for
from autoshard.zoo import MLP

COLUMN3, ROW3 = ((1, 1, 1), (2, 1)), ((1, 1, 2), (1, 2))  # linear on (B, S, H) over 2 devices
LLAMA_MEGATRON = {
    **{f"*.{m}": COLUMN3 for m in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")},
    **{f"*.{m}": ROW3 for m in ("o_proj", "down_proj")},
}
# FSDP on LLaMA-tiny: the batch split, every projection and the LM head stored split (S(0)) and gathered
LLAMA_FSDP = (
    ("input_ids", ("S(0)",)),
    ("*_proj", ((2, 1, 1), (1, 1))),
    ("*_proj.weight", ("S(0)",)),
    ("lm_head", ((2, 1, 1), (1, 1))),
    ("lm_head.weight", ("S(0)",)),
)
# GPT-2's Conv1D runs addmm(bias, x (B*S, in), weight (in, out)): column splits weight dim 1 and the bias
GPT2_MEGATRON = {
    "*.c_attn": ((2,), (1, 1), (1, 2)),
    "*.attn.c_proj": ((1,), (1, 2), (2, 1)),
    "*.c_fc": ((2,), (1, 1), (1, 2)),
    "*.mlp.c_proj": ((1,), (1, 2), (2, 1)),
}
GPT2_DP = {
    "input_ids": ("S(0)",),
    "labels": ("S(0)",),
    **{f"*.{m}": ((1,), (4, 1), (1, 1)) for m in ("c_attn", "c_proj", "c_fc")},
    "lm_head": ((4, 1, 1), (1, 1)),
}


class Unsupported(nn.Module):
    """``roll`` and ``logcumsumexp`` have no sharding rule: planned replicate-only, with a warning."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)
        h = torch.roll(h, 1, dims=0) + torch.logcumsumexp(h, dim=0)  # both mix the batch dim
        return self.fc2(h)


class InPlace(nn.Module):
    """In-place ops survive capture (``add_``, ``relu_``); a batch-split fc1 into a row-split fc2 needs an
    all-to-all (``S(0) -> S(1)``) forward and backward."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x) * 1.0
        h.add_(1.0)
        return self.fc2(h.relu_())


@dataclass(frozen=True)
class Model:
    model: nn.Module
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    captured: Captured


@functools.cache
def model(name: str) -> Model:
    """A float64 model with example inputs and its full capture."""
    torch.manual_seed(0)
    kwargs: dict[str, Any] = {}
    if name == "mlp":
        m: nn.Module = MLP(8, 16)
        args: tuple[Any, ...] = (torch.randn(8, 8),)
    elif name == "unsupported":
        m, args = Unsupported(), (torch.randn(4, 8),)
    elif name == "inplace":
        m, args = InPlace(), (torch.randn(4, 8),)
    elif name == "seed":
        case = zoo.build("seed", batch=4, seq=8)
        m, args = case.model, case.args
    elif name == "gpt2":  # with labels: the loss is computed in the graph
        case = zoo.build("gpt2-tiny", batch=4, seq=8)
        m, args, kwargs = case.model, case.args, {"labels": torch.zeros(4, 8, dtype=torch.long)}
    else:
        case = zoo.build("llama-tiny", batch=4, seq=8)
        m, args = case.model, case.args
    m = m.to(torch.float64)
    args = tuple(a.double() if a.is_floating_point() else a for a in args)
    return Model(m, args, kwargs, capture(m, args, kwargs, blocks="full"))


@functools.cache
def plan(name: str, nproc: int, mesh: tuple[int, ...] | None, annotations: Any, profile: str = "cpu") -> Plan:
    """``annotations`` is a tuple of (target, choice) pairs (hashable, for the cache)."""
    m = model(name)
    cluster = cluster_for(profile, nproc, mesh)
    return autoshard.plan(m.model, cluster, m.args, m.kwargs, annotations=dict(annotations) or None)
