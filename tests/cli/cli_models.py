"""Models for ``autoshard search --model tests/cli/cli_models.py:FUNCTION`` (user-spec files).

Each function returns ``(model, example_args)``; the models live on the meta device, so planning them costs
no memory and well under a second.
"""

from __future__ import annotations

import torch
from torch import nn


class WideBlock(nn.Module):
    """A residual Megatron MLP block: ``x + fc2(gelu(fc1(x)))``."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(hidden, 4 * hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(self.act(self.fc1(x)))


class WideStack(nn.Module):
    """``depth`` identical :class:`WideBlock` in ``self.layers`` (a repeated-layer stack)."""

    def __init__(self, depth: int, hidden: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(WideBlock(hidden) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def wide_stack() -> tuple[nn.Module, torch.Tensor]:
    """Six 8192-wide blocks, batch 1 x 2048 tokens: only tensor parallelism can split the work."""
    with torch.device("meta"):
        return WideStack(6, 8192), torch.zeros(1, 2048, 8192)


def broken() -> tuple[nn.Module, torch.Tensor]:
    raise RuntimeError("this model cannot be built")


def small_mlp() -> tuple[nn.Module, torch.Tensor]:
    """A small Megatron MLP (64 -> 256 -> 64) with a large batch: data parallel is its free optimum."""
    from autoshard.zoo import MLP

    return MLP(64, 256), torch.zeros(512, 64)


class Unruled(nn.Module):
    """A linear, then an op autoshard has no sharding rule for (QR): it runs replicated, with a warning."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.linalg.qr(self.fc(x))[0].sum()


def unruled() -> tuple[nn.Module, torch.Tensor]:
    with torch.device("meta"):
        model = Unruled()
    return model, torch.zeros(64, 64, device="meta")
