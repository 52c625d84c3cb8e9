"""The model zoo, captured: every op has a rule, every node gets strategies, and rules hold on real graphs.

Models (tiny one-block configs -- more blocks add no op --, CPU, ``attn_implementation="sdpa"``,
``use_cache=False``, dropout 0): the seed model, a 2-layer MLP, GPT-2 (LM head, also in train mode), LLaMA
(GQA: 4 heads, 2 kv heads) with a cross-entropy loss on its logits, BERT and BERT-for-masked-LM, Mixtral in
float32 (experts as ``transformers.grouped_mm_fallback``) and bfloat16 (``aten._grouped_mm``).  Each is
captured with :func:`autoshard.capture.capture`.

The numeric check runs the harness on every node of the captured LLaMA and Mixtral graphs (float64) with the
node's real input values, so the rules are proven on the shapes and arguments HF models actually produce.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch import fx, nn

from autoshard.capture import capture, graph_inputs
from autoshard.capture.dispatch import routed_experts
from autoshard.strategies import UnsupportedOpWarning, missing_rules, strategies_for
from autoshard.strategies.validate import check_rule

transformers = pytest.importorskip("transformers")

IDS = torch.randint(0, 100, (2, 8), generator=torch.Generator().manual_seed(0))


class Seed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(30522, 64)
        self.hidden = nn.Linear(64, 64)
        self.head = nn.Linear(64, 1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.hidden(self.embed(ids))).mean(dim=1)


class WithLoss(nn.Module):
    """A causal LM with the cross-entropy loss the planner trains on."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = self.lm(ids, use_cache=False).logits
        return nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1))


def _hf(cls: Any, config: Any, train: bool = False) -> nn.Module:
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = cls(config)
    return model.train() if train else model.eval()


def _llama_config() -> Any:
    return transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=100, max_position_embeddings=32,
    )  # fmt: skip


def _mixtral_config() -> Any:
    return transformers.MixtralConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=100, max_position_embeddings=32, num_local_experts=4, num_experts_per_tok=2,
    )  # fmt: skip


def _gpt2_config() -> Any:
    return transformers.GPT2Config(
        n_layer=1, n_embd=32, n_head=4, vocab_size=100, n_positions=32, bos_token_id=0, eos_token_id=0,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )  # fmt: skip


def _bert_config() -> Any:
    return transformers.BertConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64, vocab_size=100,
        max_position_embeddings=32, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip


Case = tuple[nn.Module, tuple[Any, ...], dict[str, Any]]
NO_CACHE = {"use_cache": False}


def _mlp() -> Case:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16)).eval(), (torch.randn(4, 16),), {}


ZOO: dict[str, Callable[[], Case]] = {
    "seed": lambda: (Seed().eval(), (IDS,), {}),
    "mlp": _mlp,
    "gpt2": lambda: (_hf(transformers.GPT2LMHeadModel, _gpt2_config()), (IDS,), NO_CACHE),
    "gpt2-train": lambda: (_hf(transformers.GPT2LMHeadModel, _gpt2_config(), train=True), (IDS,), NO_CACHE),
    "llama": lambda: (_hf(transformers.LlamaForCausalLM, _llama_config()), (IDS,), NO_CACHE),
    "llama-loss": lambda: (
        WithLoss(_hf(transformers.LlamaForCausalLM, _llama_config())),
        (IDS, IDS.roll(-1, 1)),
        {},
    ),
    "bert": lambda: (_hf(transformers.BertModel, _bert_config()), (IDS,), {}),
    "bert-mlm": lambda: (_hf(transformers.BertForMaskedLM, _bert_config()), (IDS,), {}),
    "mixtral": lambda: (_hf(transformers.MixtralForCausalLM, _mixtral_config()), (IDS,), NO_CACHE),
    "mixtral-bf16": lambda: (
        _hf(transformers.MixtralForCausalLM, _mixtral_config()).to(torch.bfloat16),
        (IDS,),
        NO_CACHE,
    ),
}


@pytest.fixture(scope="module")
def zoo() -> dict[str, fx.GraphModule]:
    return {name: capture(*build(), blocks=None).graph_module for name, build in ZOO.items()}


def test_every_zoo_op_has_a_rule(zoo: dict[str, fx.GraphModule]) -> None:
    missing = {name: missing_rules(gm) for name, gm in zoo.items()}
    assert not any(missing.values()), f"ops without a sharding rule: {missing}"


def test_zoo_covers_the_ops_that_matter(zoo: dict[str, fx.GraphModule]) -> None:
    """The zoo really contains what the rules were written for (a guard against a silently changed export)."""
    targets = {str(n.target) for gm in zoo.values() for n in gm.graph.nodes if n.op == "call_function"}
    wanted = ["scaled_dot_product_attention.default", "embedding.default", "linear.default", "addmm.default"]
    wanted += [
        "cross_entropy_loss.default",
        "topk.default",
        "index.Tensor",
        "expand.default",
    ]
    for op in [f"aten.{name}" for name in wanted]:
        assert op in targets, op
    # both Mixtral dtypes' grouped matmuls (transformers' fallback in fp32, aten._grouped_mm in bf16) are fused
    fused = [n for gm in zoo.values() for n in gm.graph.nodes if n.target is routed_experts]
    assert {n.args[6] for n in fused} == {False, True}


def _nodes(gm: fx.GraphModule) -> Iterator[fx.Node]:
    return (n for n in gm.graph.nodes if n.op != "output")


@pytest.mark.parametrize("mesh", [(2,), (2, 2), (8,), (8, 8)], ids=str)
def test_every_node_gets_strategies(zoo: dict[str, fx.GraphModule], mesh: tuple[int, ...]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnsupportedOpWarning)
        for gm in zoo.values():
            for node in _nodes(gm):
                strategies = strategies_for(node, mesh)
                assert strategies, node
                if mesh == (2, 2):  # the mesh where most strategies fit
                    assert strategies == strategies_for(node, mesh), (
                        f"{node}: strategies are not deterministic"
                    )
                n_inputs = len(node.all_input_nodes)
                assert all(len(s.inputs) == n_inputs == len(s.input_grads) for s in strategies)
                assert len({(s.inputs, s.outputs) for s in strategies}) == len(strategies), (
                    f"{node}: duplicates"
                )


def test_canonical_strategies_are_offered(zoo: dict[str, fx.GraphModule]) -> None:
    """REFERENCE.md's canonical plans need these per-op strategies (mesh (2,), the only split these tiny
    shapes allow everywhere): column- and row-split linear, head-split attention, vocab-parallel embedding,
    expert-parallel grouped matmul."""

    def offered(gm: fx.GraphModule, target: str) -> set[str]:
        return {str(s) for n in _nodes(gm) if str(n.target) == target for s in strategies_for(n, (2,))}

    linear = offered(zoo["llama"], "aten.linear.default")
    assert {"R, S(0) -> S(2)", "S(2), S(1) -> P"} <= linear  # Megatron column / row split, no bias
    sdpa = offered(zoo["llama"], "aten.scaled_dot_product_attention.default")
    assert "S(1), S(1), S(1), R -> S(1)" in sdpa  # heads split, (B, 1, S, S) mask replicated
    assert "S(0), R -> P" in offered(zoo["llama"], "aten.embedding.default")  # vocab parallel
    experts = {
        str(s) for n in _nodes(zoo["mixtral"]) if n.target is routed_experts for s in strategies_for(n, (2,))
    }
    assert "R, S(0), S(0), R, R -> P" in experts  # expert parallel, all-gather dispatch: output Partial
    assert "S(0), S(0), S(0), S(0), S(0) -> S(0)" in experts  # expert parallel, all-to-all dispatch


# -- the harness on every node of real graphs -------------------------------------------------------------------


def _node_values(name: str) -> tuple[fx.GraphModule, dict[fx.Node, Any]]:
    """A float64 capture of zoo model ``name`` and the real value of every node."""
    model, args, kwargs = ZOO[name]()
    model = model.double()
    captured = capture(model, args, kwargs, blocks=None)
    gm = captured.graph_module
    values: dict[fx.Node, Any] = {}
    placeholders = iter(graph_inputs(captured, model, args, kwargs))
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            values[node] = next(placeholders)
        elif node.op == "call_function":
            assert callable(node.target)
            clone = lambda n: values[n].clone() if isinstance(values[n], torch.Tensor) else values[n]  # noqa: E731
            values[node] = node.target(
                *fx.node.map_arg(node.args, clone), **fx.node.map_arg(node.kwargs, clone)
            )
    return gm, values


def _check_graph(name: str, mesh: tuple[int, ...], max_strategies: int | None) -> list[str]:
    gm, values = _node_values(name)
    failures = []
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        report = check_rule(
            node, [values[n] for n in node.all_input_nodes], mesh, max_strategies=max_strategies
        )
        if not report.ok:
            failures.append(f"{node.name}: {report}")
    return failures


@pytest.mark.parametrize("name", ["llama-loss", "mixtral"])
def test_rules_hold_on_every_node_of_a_real_graph(name: str) -> None:
    assert not _check_graph(name, (2,), max_strategies=4)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama-loss", "mixtral", "gpt2"])
def test_rules_hold_on_every_node_every_strategy(name: str) -> None:
    """Mesh (2, 2): every strategy of every node (the tiny shapes let most of them fit)."""
    assert not _check_graph(name, (2, 2), max_strategies=None)
