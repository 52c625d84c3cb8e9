"""A user-spec model with ops that have no sharding rule, for ``autoshard ops`` and the replicated-FLOPs report."""

from __future__ import annotations

import torch
from torch import nn


class Rolling(nn.Module):
    """``roll`` and ``logcumsumexp`` mix the batch dim and have no rule: they run replicated."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(64, 256), nn.Linear(256, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)
        h = torch.roll(h, 1, dims=0) + torch.logcumsumexp(h, dim=0)
        return self.fc2(h)


def rolling() -> tuple[nn.Module, torch.Tensor]:
    return Rolling(), torch.randn(32, 64)
