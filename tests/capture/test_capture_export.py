"""capture(): every zoo model family captures, runs like eager, and carries every annotation."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from autoshard import zoo
from autoshard.capture import (
    META_ALIASES,
    META_FLOPS,
    META_FQN,
    META_KIND,
    META_MODULE,
    META_MODULE_TYPE,
    META_OP,
    META_REQUIRES_GRAD,
    META_TENSOR,
    Captured,
    TensorMeta,
    capture,
    graph_inputs,
)
from autoshard.errors import AutoshardError, CaptureError

TINY = ("seed", "mlp-deep", "gpt2-tiny", "llama-tiny", "bert-tiny", "mixtral-tiny")


def _small_seed() -> zoo.ModelCase:
    return zoo.build("seed", batch=4, seq=8)


def _case(name: str) -> zoo.ModelCase:
    return _small_seed() if name == "seed" else zoo.build(name)


@pytest.fixture(scope="module")
def captured() -> dict[str, tuple[zoo.ModelCase, Captured]]:
    out = {}
    for name in TINY:
        case = _case(name)
        out[name] = (case, capture(case.model, case.args, case.kwargs, blocks="full"))
    return out


def _eager(case: zoo.ModelCase) -> torch.Tensor:
    out = case.model(*case.args, **case.kwargs)
    return out.logits if hasattr(out, "logits") else out


@pytest.mark.parametrize("name", TINY)
def test_graph_output_equals_eager(captured: dict, name: str) -> None:
    case, cap = captured[name]
    with torch.no_grad():
        got = cap.graph_module(*graph_inputs(cap, case.model, case.args, case.kwargs))
        want = _eager(case)
    assert cap.method == "export"
    torch.testing.assert_close(got[0], want, rtol=0, atol=0)


@pytest.mark.parametrize("name", TINY)
def test_every_node_is_annotated(captured: dict, name: str) -> None:
    _, cap = captured[name]
    for node in cap.nodes():
        for key in (META_TENSOR, META_FLOPS, META_MODULE, META_MODULE_TYPE, META_OP, META_REQUIRES_GRAD):
            assert key in node.meta, f"{name}: {node.name} lacks {key}"
        assert isinstance(node.meta[META_FLOPS], int) and node.meta[META_FLOPS] >= 0
    for node in cap.op_nodes():
        meta = node.meta[META_TENSOR]
        assert isinstance(meta, (TensorMeta, tuple)), f"{name}: {node.name} has no tensor meta"
        assert node.meta[META_OP].startswith(("aten.", "getitem", "expert_mlp", "routed_experts")), (
            f"{name}: {node.name} is {node.meta[META_OP]}"
        )


@pytest.mark.parametrize("name", TINY)
def test_params_keep_their_fqns(captured: dict, name: str) -> None:
    case, cap = captured[name]
    expected = {n: tuple(p.shape) for n, p in case.model.named_parameters()}
    assert {n: m.shape for n, m in cap.params.items()} == expected
    for node in cap.placeholders("parameter"):
        assert node.meta[META_FQN] in expected
        assert node.meta[META_MODULE] == node.meta[META_FQN].rpartition(".")[0]
    assert cap.user_inputs == tuple(n.name for n in cap.placeholders("user_input"))


def test_tied_weights_are_one_placeholder(captured: dict) -> None:
    _, cap = captured["gpt2-tiny"]
    (wte,) = [n for n in cap.placeholders("parameter") if n.meta[META_FQN] == "transformer.wte.weight"]
    assert wte.meta[META_ALIASES] == ("lm_head.weight",)
    assert {u.meta[META_OP] for u in wte.users} == {"aten.embedding.default", "aten.linear.default"}
    assert any("tied parameters: lm_head.weight is transformer.wte.weight" in note for note in cap.notes)


def test_module_paths_are_fqns(captured: dict) -> None:
    _, cap = captured["llama-tiny"]
    paths = {n.meta[META_MODULE] for n in cap.op_nodes()}
    assert "model.layers.1.mlp.down_proj" in paths
    assert "lm_head" in paths
    modules = dict(_case("llama-tiny").model.named_modules())
    assert all(p in modules for p in paths), paths - set(modules)
    down = next(n for n in cap.op_nodes() if n.meta[META_MODULE] == "model.layers.0.mlp.down_proj")
    assert down.meta[META_OP] == "aten.linear.default" and down.meta[META_MODULE_TYPE] == "Linear"


def test_seed_model_graph(captured: dict) -> None:
    _, cap = captured["seed"]
    assert cap.op_targets() == ("aten.embedding.default", "aten.linear.default", "aten.mean.dim")
    assert cap.outputs[0].tensor == TensorMeta((4, 1), "float32", 4)
    assert cap.outputs[0].kind == "user_output"
    # linear 64 -> 64 and 64 -> 1 over 4 x 8 tokens; embedding and views cost nothing.
    assert cap.total_flops() == 2 * 32 * 64 * 64 + 2 * 32 * 64 * 1 + 32
    assert cap.blocks is None


def test_pre_decomposition_ops_stay_whole(captured: dict) -> None:
    _, cap = captured["llama-tiny"]
    targets = set(cap.op_targets())
    assert {
        "aten.scaled_dot_product_attention.default",
        "aten.linear.default",
        "aten.embedding.default",
    } <= targets
    assert not any("assert" in t or "wrap_with" in t for t in targets)
    assert "aten.bmm.default" not in targets and "aten._softmax.default" not in targets


def test_mixtral_bf16_experts_export_as_grouped_mm(captured: dict) -> None:
    """bf16 experts export as ``aten._grouped_mm``; capture fuses each layer's pair (gate_up, down) with the
    activation into one expert MLP node that runs aten's grouped matmul (``use_aten``), priced as both."""
    _, cap = captured["mixtral-tiny"]
    fused = [n for n in cap.op_nodes() if n.meta[META_OP] == "routed_experts"]  # expert MLP and its routing
    assert len(fused) == 2 and all(n.args[6] is True for n in fused)  # one per layer, aten's grouped matmul
    assert all(n.meta[META_FLOPS] > 0 for n in fused)


def test_requires_grad_follows_trainable_params() -> None:
    case = zoo.build("mlp-deep", layers=3)
    case.model.layers[0].fc.weight.requires_grad_(False)
    case.model.layers[0].fc.bias.requires_grad_(False)
    cap = capture(case.model, case.args, blocks=None)
    by_name = {n.meta[META_MODULE]: n for n in cap.op_nodes() if n.meta[META_OP] == "aten.linear.default"}
    assert not by_name["layers.0.fc"].meta[META_REQUIRES_GRAD]
    assert by_name["layers.1.fc"].meta[META_REQUIRES_GRAD]
    assert not next(cap.placeholders("user_input")).meta[META_REQUIRES_GRAD]


def test_requires_grad_is_false_for_integer_and_mask_values(captured: dict) -> None:
    _, cap = captured["llama-tiny"]
    for node in cap.op_nodes():
        meta = node.meta[META_TENSOR]
        if isinstance(meta, TensorMeta) and not meta.is_floating:
            assert not node.meta[META_REQUIRES_GRAD], node.name
    logits = cap.node(cap.outputs[0].name)
    assert logits.meta[META_REQUIRES_GRAD]


def test_buffers_and_kinds(captured: dict) -> None:
    _, cap = captured["llama-tiny"]
    kinds = {n.meta[META_KIND] for n in cap.placeholders()}
    assert kinds == {"parameter", "buffer", "user_input"}
    assert "model.rotary_emb.inv_freq" in cap.buffers


class _Attr(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(
        self, x: torch.Tensor, *, scale: float = 2.0, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        y = self.lin(x) * scale
        return y if bias is None else y + bias


def test_kwargs_are_user_inputs() -> None:
    model, x, bias = _Attr(), torch.randn(3, 4), torch.randn(4)
    cap = capture(model, (x,), {"bias": bias})
    assert cap.user_inputs == ("x", "bias")
    got = cap.graph_module(*graph_inputs(cap, model, (x,), {"bias": bias}))[0]
    torch.testing.assert_close(got, model(x, bias=bias))


@torch.library.custom_op("autoshard_test::twice", mutates_args=())
def _twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2  # no fake kernel on purpose: torch.export cannot trace through it


class _NeedsFallback(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _twice(self.lin(x)).relu()


def test_symbolic_trace_fallback_when_export_fails() -> None:
    model, x = _NeedsFallback(), torch.randn(2, 4)
    cap = capture(model, (x,))
    assert cap.method == "symbolic_trace"
    assert any("no fake impl" in note for note in cap.notes)
    assert set(cap.params) == {"lin.weight", "lin.bias"}
    lin = next(n for n in cap.op_nodes() if n.op == "call_module")
    assert lin.meta[META_OP] == "module.Linear" and lin.meta[META_MODULE] == "lin"
    assert lin.meta[META_TENSOR] == TensorMeta((2, 8), "float32", 4)
    assert lin.meta[META_FLOPS] == 2 * 2 * 4 * 8
    assert lin.meta[META_REQUIRES_GRAD]
    out = cap.graph_module(*graph_inputs(cap, model, (x,)))
    torch.testing.assert_close(out, model(x))


class _Branchy(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # data-dependent control flow
            return x * 2
        return x


class _HasBranchy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.ModuleList([_Branchy()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner[0](x)


def test_data_dependent_control_flow_raises_capture_error() -> None:
    with pytest.raises(CaptureError) as info:
        capture(_HasBranchy(), (torch.randn(3),))
    message = str(info.value)
    assert isinstance(info.value, AutoshardError)
    assert "data-dependent" in message
    assert "if x.sum() > 0:" in message  # the user's line
    assert "test_capture_export.py" in message
    assert "module inner.0" in message
    assert "torch.cond" in message  # the fix
    assert "symbolic_trace failed too" in message


def test_capture_error_suggests_use_cache_for_hf_models() -> None:
    case = zoo.build("llama-tiny")
    case.model.config.use_cache = True

    def explode(*args: object, **kwargs: object) -> None:
        raise RuntimeError("boom")

    case.model.model.norm.forward = explode  # type: ignore[method-assign]
    with pytest.raises(CaptureError, match="use_cache=False"):
        capture(case.model, case.args)


def test_bad_blocks_argument() -> None:
    with pytest.raises(ValueError, match="'auto', 'full' or None"):
        capture(_Attr(), (torch.randn(1, 4),), blocks="two")  # type: ignore[arg-type]


def test_capture_works_on_meta() -> None:
    case = zoo.build("llama-tiny", device="meta")
    cap = capture(case.model, case.args, blocks=None)
    assert cap.params["lm_head.weight"] == TensorMeta((512, 64), "float32", 4)
    assert cap.total_flops() > 0
    assert cap.seconds > 0
