"""Cleaning passes: each one's postcondition, and that the cleaned graph still computes the same values."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import fx, nn

from autoshard import zoo
from autoshard.capture import META_NO_GRAD, META_OP, META_REQUIRES_GRAD, capture, graph_inputs
from autoshard.capture.clean import (
    clean,
    drop_asserts,
    drop_identities,
    eliminate_dead_code,
    inline_higher_order_ops,
    merge_placeholders,
)


def _targets(gm: fx.GraphModule) -> list[str]:
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]


@pytest.fixture(scope="module")
def llama_export() -> tuple[zoo.ModelCase, torch.export.ExportedProgram]:
    case = zoo.build("llama-tiny")
    return case, torch.export.export(case.model, case.args, strict=False)


def _fresh(ep: torch.export.ExportedProgram) -> fx.GraphModule:
    # Each test edits its own copy; deepcopy keeps the submodules of the higher-order ops.
    return copy.deepcopy(ep.graph_module)


class _NoGradRope(nn.Module):
    """Rotary angles under ``torch.no_grad`` (as HF's rotary embeddings up to transformers 5.23 ran): export
    keeps the block as a ``wrap_with_set_grad_enabled`` higher-order op.  Own module, so the test does not
    depend on how a transformers release writes its rotary embedding (5.24 dropped the no_grad)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.register_buffer("inv", torch.arange(8, dtype=torch.float32) * 0.1, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            angles = x.new_ones(x.shape) * self.inv
            cos, sin = angles.cos(), angles.sin()
        return self.lin(x * cos + x * sin)


@pytest.fixture(scope="module")
def rope_export() -> tuple[nn.Module, torch.Tensor, torch.export.ExportedProgram]:
    torch.manual_seed(0)
    model, x = _NoGradRope(), torch.randn(2, 8)
    return model, x, torch.export.export(model, (x,), strict=False)


def test_raw_export_has_what_cleaning_removes(llama_export: tuple, rope_export: tuple) -> None:
    _, ep = llama_export
    assert any("_assert_tensor_metadata" in t for t in _targets(ep.graph_module))
    assert any("wrap_with_set_grad_enabled" in t for t in _targets(rope_export[2].graph_module))


def test_inline_higher_order_ops(rope_export: tuple) -> None:
    model, x, ep = rope_export
    gm = inline_higher_order_ops(_fresh(ep))
    assert not any("wrap_with" in t for t in _targets(gm))
    assert not any(isinstance(m, fx.GraphModule) for _, m in gm.named_children())
    inlined = [n for n in gm.graph.nodes if n.meta.get(META_NO_GRAD)]
    assert {str(n.target) for n in inlined} >= {"aten.cos.default", "aten.sin.default"}  # ran under no_grad
    assert all("nn_module_stack" in n.meta for n in inlined)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    state = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    values = [state.get(str(s.target), x) for s in ep.graph_signature.input_specs]
    assert len(values) == len(placeholders)
    torch.testing.assert_close(gm(*values)[0], model(x), rtol=0, atol=0)


def test_drop_asserts(llama_export: tuple) -> None:
    _, ep = llama_export
    gm = _fresh(ep)
    before = len(gm.graph.nodes)
    n_asserts = sum("_assert" in t for t in _targets(gm))
    gm = drop_asserts(gm)
    assert n_asserts > 0 and len(gm.graph.nodes) == before - n_asserts
    assert not any("_assert" in t for t in _targets(gm))


class _Identities(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.off = nn.Dropout(0.0)
        self.on = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.off(self.lin(x)).to(torch.float32)  # no-op dropout, no-op cast
        return self.on(y).to(torch.float64)  # real dropout (training), real cast


def test_drop_identities_keeps_real_dropout_and_casts() -> None:
    model = _Identities().train()
    gm = torch.export.export(model, (torch.randn(2, 4),), strict=False).graph_module
    gm = drop_identities(gm)
    targets = _targets(gm)
    assert targets.count("aten.dropout.default") == 1
    dropout = next(n for n in gm.graph.nodes if str(n.target) == "aten.dropout.default")
    assert dropout.args[1] == 0.5
    casts = [n for n in gm.graph.nodes if "aten.to." in str(n.target)]
    assert [n.args[1] for n in casts] == [torch.float64]


def test_eval_dropout_disappears_from_capture() -> None:
    model = _Identities().eval()
    cap = capture(model, (torch.randn(2, 4),))
    assert "aten.dropout.default" not in cap.op_targets()


def test_merge_placeholders_ties_users(llama_export: tuple) -> None:
    _, ep = llama_export
    gm = _fresh(ep)
    names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    gm = merge_placeholders(gm, {"p_lm_head_weight": "p_model_embed_tokens_weight"})
    embed = next(n for n in gm.graph.nodes if n.name == "p_model_embed_tokens_weight")
    assert "p_lm_head_weight" not in {n.name for n in gm.graph.nodes}
    assert len([n for n in gm.graph.nodes if n.op == "placeholder"]) == len(names) - 1
    assert {str(u.target) for u in embed.users} == {"aten.embedding.default", "aten.linear.default"}


def test_clean_is_the_composition_and_eliminates_dead_code(llama_export: tuple) -> None:
    _, ep = llama_export
    gm = clean(_fresh(ep))
    gm.graph.lint()
    for node in gm.graph.nodes:
        if node.op == "call_function":
            assert isinstance(node.target, torch._ops.OpOverload) or node.target.__name__ == "getitem"
            assert node.users or node.target is torch.ops.aten.index_put_.default, f"dead node {node.name}"
    assert len(eliminate_dead_code(gm).graph.nodes) == len(gm.graph.nodes)  # already clean: a fixed point


class _Regions(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            y = self.a(x) * 2
        with torch.autocast("cpu", dtype=torch.bfloat16):
            z = self.b(x)
        return y + z.float()


def test_no_grad_and_autocast_regions_inline_with_their_semantics() -> None:
    model, x = _Regions(), torch.randn(4, 8)
    raw = torch.export.export(model, (x,), strict=False).graph_module
    assert {"wrap_with_set_grad_enabled", "wrap_with_autocast"} <= set(_targets(raw))
    cap = capture(model, (x,))
    linear_a, linear_b = [n for n in cap.op_nodes() if n.meta[META_OP] == "aten.linear.default"]
    assert linear_a.meta[META_NO_GRAD] and not linear_a.meta[META_REQUIRES_GRAD]
    assert linear_b.meta[META_REQUIRES_GRAD]
    assert linear_b.meta["autoshard_tensor"].dtype == "bfloat16"
    # autocast's input casts are explicit now: the cleaned graph computes in bf16 as the region did
    assert all(str(a.target) == "aten.to.dtype" for a in linear_b.all_input_nodes)
    got = cap.graph_module(*graph_inputs(cap, model, (x,)))[0]
    torch.testing.assert_close(got, model(x), rtol=0, atol=0)
