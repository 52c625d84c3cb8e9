"""Layer collapse beyond ``nn.ModuleList``: ModuleDict (torchtitan), Sequential, and the final run of identical
layers in a heterogeneous stack (dense layers, then MoE layers, as in DeepSeek-V3).

Each collapsed capture keeps the proof of the ModuleList path: the graph with k + 1 blocks is the graph with
k blocks plus exactly one block's nodes (capture notes it, or falls back to the full graph).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import autoshard
from autoshard.capture import capture, find_repeated_blocks
from autoshard.capture.blocks import cut_blocks
from autoshard.zoo_extra import ResNetCNN, TitanConfig, TitanLlama


class Dense(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(self.fc(x))


class Wide(nn.Module):
    """A different layer (another parameter shape): the 'MoE' layers of the stack."""

    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(16, 64), nn.Linear(64, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


class Mixed(nn.Module):
    """``dense`` Dense layers, then ``wide`` Wide layers, in one ModuleList."""

    def __init__(self, dense: int = 2, wide: int = 4) -> None:
        super().__init__()
        self.layers = nn.ModuleList([*(Dense() for _ in range(dense)), *(Wide() for _ in range(wide))])
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def test_module_dict_of_blocks_is_found() -> None:
    found = find_repeated_blocks(TitanLlama(TitanConfig(n_layers=3)))
    assert found is not None and (found.prefix, found.num_blocks, found.first) == ("layers", 3, 0)
    assert found.block_type == "TransformerBlock"


def test_sequential_of_blocks_is_found() -> None:
    found = find_repeated_blocks(ResNetCNN(depth=3))
    assert found is not None and (found.prefix, found.num_blocks, found.block_type) == (
        "layers",
        3,
        "BasicBlock",
    )


def test_heterogeneous_stack_yields_its_final_run() -> None:
    model = Mixed(dense=2, wide=4)
    found = find_repeated_blocks(model)
    assert found is not None and (found.prefix, found.num_blocks, found.first) == ("layers", 4, 2)
    with cut_blocks(model, found, 2):
        assert [type(m).__name__ for m in model.layers] == ["Dense", "Dense", "Wide", "Wide"]
    assert len(model.layers) == 6


def test_cut_module_dict_keeps_its_keys() -> None:
    model = TitanLlama(TitanConfig(n_layers=4))
    found = find_repeated_blocks(model)
    assert found is not None
    with cut_blocks(model, found, 2):
        assert isinstance(model.layers, nn.ModuleDict) and list(model.layers) == ["0", "1"]
    assert list(model.layers) == ["0", "1", "2", "3"]


@pytest.mark.parametrize("depth", [5, 8])
def test_heterogeneous_capture_collapses_the_run(depth: int) -> None:
    torch.manual_seed(0)
    model = Mixed(dense=2, wide=depth - 2)
    x = torch.randn(8, 16)
    cap = capture(model, (x,))
    assert cap.blocks is not None
    assert (cap.blocks.first, cap.blocks.num_blocks, cap.blocks.captured_blocks) == (2, depth - 2, 2)
    assert any("3 blocks add exactly one block" in n for n in cap.notes), cap.notes
    assert set(cap.all_params()) == {name for name, _ in model.named_parameters()}
    assert cap.blocks.fqn(0, "up.weight") == "layers.2.up.weight"
    assert str(cap.blocks).startswith(f"layers: {depth - 2} x Wide from layers.2")


def test_titan_capture_collapses_module_dict() -> None:
    model = TitanLlama(TitanConfig(n_layers=5))
    cap = capture(model, (torch.zeros(2, 8, dtype=torch.long),))
    assert cap.blocks is not None and (cap.blocks.num_blocks, cap.blocks.captured_blocks) == (5, 2)
    assert set(cap.all_params()) == {name for name, _ in model.named_parameters()}


def test_plan_of_a_heterogeneous_stack_names_every_parameter() -> None:
    model = Mixed(dense=2, wide=5)
    plan = autoshard.plan(model, autoshard.load_cluster("a100x8"), (torch.randn(64, 16),))
    assert set(plan.param_placements) == {name for name, _ in model.named_parameters()}
    layers = {
        n.module.split(".")[1]
        for n in plan.nodes
        if n.key.startswith("block:") and n.module.startswith("layers.")
    }
    assert layers == {"2"}, layers  # the run's nodes are named after its first layer, not after layers.0
