"""Repeated blocks: detection, the cut and its restoration, the k / k+1 check, and block labels."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from autoshard import zoo
from autoshard.capture import META_BLOCK, META_FQN, META_MODULE, META_OP, META_TENSOR, capture
from autoshard.capture.blocks import (
    BlockCandidate,
    BlockMismatch,
    annotate_blocks,
    check_extension,
    cut_blocks,
    find_repeated_blocks,
)

# --- detection ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "prefix", "block_type"),
    [
        ("llama-tiny", "model.layers", "LlamaDecoderLayer"),
        ("gpt2-tiny", "transformer.h", "GPT2Block"),
        ("bert-tiny", "bert.encoder.layer", "BertLayer"),
        ("mixtral-tiny", "model.layers", "MixtralDecoderLayer"),
        ("mlp-deep", "layers", "DeepMLPBlock"),
    ],
)
def test_find_repeated_blocks_in_the_zoo(name: str, prefix: str, block_type: str) -> None:
    found = find_repeated_blocks(zoo.build(name, layers=3, device="meta").model)
    assert found is not None
    assert (found.prefix, found.num_blocks, found.block_type) == (prefix, 3, block_type)


class _Two(nn.Module):
    """A small list of identical blocks and a bigger one; a list of different blocks is no candidate."""

    def __init__(self) -> None:
        super().__init__()
        self.small = nn.ModuleList(nn.Linear(2, 2) for _ in range(5))
        self.big = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))
        self.mixed = nn.ModuleList([nn.Linear(16, 16), nn.Linear(16, 32), nn.Linear(32, 16)])


def test_the_list_with_most_parameters_wins_and_mixed_lists_do_not_count() -> None:
    found = find_repeated_blocks(_Two())
    assert found == BlockCandidate("big", 3, "Linear", 3 * (64 + 8))
    assert find_repeated_blocks(nn.Sequential(nn.Linear(2, 2))) is None


def test_cut_blocks_restores_the_list_even_when_the_body_raises() -> None:
    model = zoo.build("mlp-deep", layers=5).model
    original = model.layers
    found = find_repeated_blocks(model)
    assert found is not None
    with pytest.raises(RuntimeError, match="inside"), cut_blocks(model, found, 2):
        assert len(model.layers) == 2 and model.layers[1] is original[1]
        raise RuntimeError("inside")
    assert model.layers is original and len(model.layers) == 5


# --- the 2-block capture ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llama4() -> tuple[zoo.ModelCase, object, object]:
    case = zoo.build("llama-tiny", layers=4)
    cut = capture(case.model, case.args)
    full = capture(case.model, case.args, blocks="full")
    return case, cut, full


def test_two_block_capture_stands_for_all_blocks(llama4: tuple) -> None:
    case, cut, full = llama4
    assert case.model.model.layers is not None and len(case.model.model.layers) == 4  # restored
    info = cut.blocks
    assert (info.prefix, info.num_blocks, info.captured_blocks) == ("model.layers", 4, 2)
    assert full.blocks.captured_blocks == 4 and full.blocks.nodes_per_block == info.nodes_per_block
    # the full graph is the cut graph plus two more blocks, node for node
    assert len(full.graph_module.graph.nodes) == len(cut.graph_module.graph.nodes) + 2 * info.nodes_per_block
    assert cut.total_flops() == full.total_flops()
    assert cut.all_params() == dict(full.params)
    assert set(cut.all_params()) == {n for n, _ in case.model.named_parameters()}
    assert (
        info.block_flops * 4
        + sum(n.meta["autoshard_flops"] for n in full.op_nodes() if META_BLOCK not in n.meta)
        == full.total_flops()
    )
    assert any("checked that 3 blocks add exactly one block" in note for note in cut.notes)


def test_block_positions_correspond(llama4: tuple) -> None:
    _, _, full = llama4
    by_block: dict[int, list] = {}
    for node in full.nodes():
        if META_BLOCK in node.meta:
            by_block.setdefault(node.meta[META_BLOCK][0], []).append(node)
    assert sorted(by_block) == [0, 1, 2, 3]
    for nodes in by_block.values():
        assert [n.meta[META_BLOCK][1] for n in nodes] == list(range(len(nodes)))
    for position in range(len(by_block[0])):
        row = [by_block[b][position] for b in range(4)]
        assert len({n.meta[META_OP] for n in row}) == 1
        assert len({str(n.meta[META_TENSOR]) for n in row}) == 1
        fqns = [n.meta.get(META_FQN) for n in row]
        if fqns[0] is not None:
            assert [f.replace(f"model.layers.{b}.", "") for b, f in enumerate(fqns)] == [
                fqns[0].replace("model.layers.0.", "")
            ] * 4


def test_every_node_on_a_block_path_is_labelled(llama4: tuple) -> None:
    _, _, full = llama4
    for node in full.op_nodes():
        on_path = node.meta[META_MODULE].startswith("model.layers.")
        assert on_path == (META_BLOCK in node.meta), node.name
        if on_path:
            assert node.meta[META_MODULE].split(".")[2] == str(node.meta[META_BLOCK][0])
    # residual adds sit in the decoder layer's own forward and carry its path
    adds = [n for n in full.op_nodes() if n.meta[META_MODULE] == "model.layers.2"]
    assert [n.meta[META_OP] for n in adds] == ["aten.add.Tensor", "aten.add.Tensor"]


def test_blocks_none_labels_nothing(llama4: tuple) -> None:
    case, _, _ = llama4
    cap = capture(case.model, case.args, blocks=None)
    assert cap.blocks is None and not any(META_BLOCK in n.meta for n in cap.nodes())


# --- when the shortcut must not be taken ------------------------------------------------------------------


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


class _CountsBlocks(nn.Module):
    """Its forward depends on its number of blocks: k- and (k+1)-block graphs differ outside the blocks."""

    def __init__(self, n: int = 4) -> None:
        super().__init__()
        self.layers = nn.ModuleList(_Block() for _ in range(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(len(self.layers) - 2):
            x = x * 2
        for layer in self.layers:
            x = layer(x)
        return x


class _IndexesBlocks(_CountsBlocks):
    """Indexes its blocks by a fixed count: the cut list makes export fail."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in range(4):
            x = self.layers[i](x)
        return x


class _WorkBetweenBlocks(_CountsBlocks):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x) * 0.5  # the parent's loop computes between blocks
        return x


@pytest.mark.parametrize(
    ("model_cls", "reason"),
    [
        (_CountsBlocks, "ops before the first block differ"),
        (_IndexesBlocks, "IndexError"),
        (_WorkBetweenBlocks, "belong to no block"),
    ],
)
def test_fallback_to_full_export(model_cls: type[nn.Module], reason: str) -> None:
    model, x = model_cls(), torch.randn(3, 8)
    original = model.layers
    cap = capture(model, (x,))
    assert model.layers is original and len(model.layers) == 4
    assert any("2-block capture of layers abandoned" in n and reason in n for n in cap.notes), cap.notes
    assert sum(1 for n in cap.op_nodes() if n.meta[META_OP] == "aten.linear.default") == 4
    got = cap.graph_module(*[p for p in model.parameters()], x)[0]
    torch.testing.assert_close(got, model(x))


def _cut_graphs(ks: tuple[int, ...]) -> list[tuple[torch.fx.GraphModule, object]]:
    case = zoo.build("mlp-deep", layers=4)
    found = find_repeated_blocks(case.model)
    assert found is not None
    graphs = []
    for k in ks:
        with cut_blocks(case.model, found, k):
            cap = capture(case.model, case.args, blocks="full")
        graphs.append((cap.graph_module, cap.blocks))
    return graphs


def test_check_extension_accepts_one_more_block_and_rejects_anything_else() -> None:
    (g2, i2), (g3, i3), (g4, i4) = _cut_graphs((2, 3, 4))
    check_extension(g2, g3, i2, i3)
    with pytest.raises(BlockMismatch, match=r"k and k \+ 1"):
        check_extension(g2, g4, i2, i4)
    relu = next(
        n for n in g3.graph.nodes if n.meta.get(META_BLOCK, (None,))[0] == 0 and "relu" in str(n.target)
    )
    relu.meta[META_OP] = "aten.gelu.default"
    with pytest.raises(BlockMismatch, match="block 0 differs"):
        check_extension(g2, g3, i2, i3)


def test_annotate_blocks_rejects_different_blocks() -> None:
    case = zoo.build("mlp-deep", layers=3)
    cap = capture(case.model, case.args, blocks=None)
    candidate = find_repeated_blocks(case.model)
    assert candidate is not None
    relu = [n for n in cap.op_nodes() if n.meta[META_OP] == "aten.relu.default"][1]
    relu.meta[META_OP] = "aten.gelu.default"  # pretend block 1 differs
    with pytest.raises(BlockMismatch, match=r"layers\.1 differs from layers\.0"):
        annotate_blocks(cap.graph_module, candidate, 3)
