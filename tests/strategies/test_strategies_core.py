"""The strategy record, dim maps, mesh expansion, the registry and the local-call hooks.

Counts asserted here follow from the rules: each is derived in a comment from the per-axis choices.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torch import fx

from autoshard.errors import ShardingError
from autoshard.placement import ShardingSpec
from autoshard.strategies import (
    OpStrategy,
    UnsupportedOpWarning,
    has_rule,
    local_call,
    missing_rules,
    register,
    strategies_for,
)
from autoshard.strategies.dimmap import DimMap
from autoshard.strategies.rules.embedding import vocab_parallel_embedding
from autoshard.strategies.validate import build_node

aten = torch.ops.aten


def spec(text: str) -> ShardingSpec:
    return ShardingSpec.parse(text)


def strs(strategies: list[OpStrategy]) -> list[str]:
    return [str(s) for s in strategies]


def graph(op: Any, *inputs: tuple[tuple[int, ...], torch.dtype, str], **kwargs: Any) -> fx.Node:
    """A node of ``op`` on meta tensors; each input is ``(shape, dtype, kind)`` with kind ``"param"`` (a
    placeholder) or ``"act"`` (produced by an op, so it may arrive Partial)."""
    g = fx.Graph()
    args = []
    for i, (shape, dtype, kind) in enumerate(inputs):
        node = g.placeholder(f"in{i}")
        node.meta["val"] = torch.empty(shape, dtype=dtype, device="meta")
        if kind == "act":
            node = g.call_function(aten.clone.default, (node,))
            node.meta["val"] = torch.empty(shape, dtype=dtype, device="meta")
        args.append(node)
    out = g.call_function(op, tuple(args), kwargs)
    out.meta["val"] = op(*(a.meta["val"] for a in args), **kwargs)
    return out


F32 = torch.float32

# -- the record -----------------------------------------------------------------------------------------------


def test_strategy_prints_in_plan_notation() -> None:
    one = OpStrategy((spec("S(0)"), spec("R")), (spec("S(0)"),), (spec("S(0)"), spec("P")), 2)
    two = OpStrategy((spec("(S(0), R)"), None), (spec("(S(0), P)"),), (spec("(S(0), R)"), None), 2)
    assert str(one) == "S(0), R -> S(0)"
    assert str(two) == "(S(0), R), - -> (S(0), P)"
    assert str(OpStrategy((), (spec("R"),), (), 1)) == "-> R"


def test_strategy_validates() -> None:
    with pytest.raises(ValueError, match="input_grads"):
        OpStrategy((spec("R"),), (spec("R"),), (), 1)
    with pytest.raises(ValueError, match="work_divisor"):
        OpStrategy((), (spec("R"),), (), 0)
    with pytest.raises(ValueError, match="mesh rank"):
        OpStrategy((spec("R"),), (spec("(R, R)"),), (None,), 1)


# -- dim maps ----------------------------------------------------------------------------------------------------


def test_dim_map_choices_for_mm() -> None:
    dm = DimMap.parse("mk,kn->mn", linear_in=({0}, {1}))
    assert str(dm) == "mk,kn->mn"
    assert [str(c) for c in dm.choices()] == [
        "R, R -> R", "S(0), R -> S(0)", "R, S(1) -> S(1)", "S(1), S(0) -> P", "P, R -> P", "R, P -> P",
    ]  # fmt: skip
    assert [c.splits_work for c in dm.choices()] == [False, True, True, True, False, False]


def test_dim_map_unsplittable_free_and_letterless() -> None:
    softmax = DimMap.parse("ab->ab", unsplittable="b")
    assert [str(c) for c in softmax.choices()] == ["R -> R", "S(0) -> S(0)"]
    arange = DimMap.parse("->a", free_out="a")  # created locally: the output may be split alone
    assert [str(c) for c in arange.choices()] == ["-> R", "-> S(0)"]
    broadcast = DimMap.parse("a1,ab->ab")  # the size-1 dim of the first operand carries no letter
    assert "S(0), S(0) -> S(0)" in [str(c) for c in broadcast.choices()]
    assert "R, S(1) -> S(1)" in [str(c) for c in broadcast.choices()]
    with pytest.raises(ValueError, match="repeats"):
        DimMap.parse("aa->a")


# -- expansion over the mesh -----------------------------------------------------------------------------------


def test_mm_on_a_2d_mesh_is_the_product_of_per_axis_choices() -> None:
    node, _ = build_node(aten.mm.default, (torch.randn(4, 8), torch.randn(8, 4)))
    # 6 choices per axis, 36 combinations; every one divides (each dim is 4 or 8, split at most 4 ways)
    strategies = strategies_for(node, (2, 2), drop_dominated=False)
    assert len(strategies) == 36
    assert "(S(0), S(1)), (R, S(0)) -> (S(0), P)" in strs(strategies)  # axis 0 splits m, axis 1 splits k
    assert "(S(0), S(0)), (R, R) -> (S(0), S(0))" in strs(strategies)  # two axes split one dim, outer first


def test_shards_must_divide() -> None:
    node, _ = build_node(aten.mm.default, (torch.randn(1, 6), torch.randn(6, 2)))
    got = strs(strategies_for(node, (4,), drop_dominated=False))
    # m = 1 and n = 2 cannot be split 4 ways, k = 6 cannot either: replicate and the two Partial pass-throughs
    assert got == ["R, R -> R", "P, R -> P", "R, P -> P"]


def test_a_node_feeding_two_roles_gets_one_spec() -> None:
    x = torch.randn(4, 8)
    node, _ = build_node(aten.mul.Tensor, (x, x))
    assert len(node.all_input_nodes) == 1
    # R, S(0), S(1); "P in one factor only" would need x both P and R: dropped
    assert strs(strategies_for(node, (2,), drop_dominated=False)) == [
        "R -> R",
        "S(0) -> S(0)",
        "S(1) -> S(1)",
    ]


def test_partial_only_on_floating_tensors() -> None:
    node, _ = build_node(aten.add.Tensor, (torch.arange(8), torch.arange(8)))
    assert strs(strategies_for(node, (2,), drop_dominated=False)) == ["R, R -> R", "S(0), S(0) -> S(0)"]


def test_input_grads_are_derived_per_axis() -> None:
    node, _ = build_node(aten.linear.default, (torch.randn(2, 4, 8), torch.randn(4, 8), torch.randn(4)))
    grads = {
        str(s): ", ".join(str(g) for g in s.input_grads)
        for s in strategies_for(node, (2,), drop_dominated=False)
    }
    assert grads["R, R, R -> R"] == "R, R, R"
    assert grads["S(0), R, R -> S(0)"] == "S(0), P, P"  # batch split: weight and bias grads are partial sums
    assert grads["R, S(0), S(0) -> S(2)"] == "P, S(0), S(0)"  # column split: the input grad is Partial
    assert grads["S(2), S(1), R -> P"] == "S(2), S(1), P"  # row split
    assert grads["P, R, R -> P"] == "R, P, P"  # Partial in: its grad arrives replicated


def test_integer_inputs_have_no_grad_and_work_divisor_counts_splitting_axes() -> None:
    node, _ = build_node(aten.embedding.default, (torch.randn(16, 8), torch.randint(0, 16, (4, 2))))
    by_name = {str(s): s for s in strategies_for(node, (2, 2), drop_dominated=False)}
    s = by_name["(R, R), (S(0), S(1)) -> (S(0), S(1))"]
    assert s.input_grads[1] is None and str(s.input_grads[0]) == "(P, P)"
    assert s.work_divisor == 4
    assert by_name["(R, R), (R, R) -> (R, R)"].work_divisor == 1
    assert by_name["(P, R), (R, R) -> (P, R)"].work_divisor == 1  # Partial pass-through splits no work


# -- strategy counts on LLaMA-3-8B shapes (the planner's speed depends on them) ---------------------------------

B, S, H, HEADS, HD, V = 8, 4096, 4096, 32, 128, 128256


def test_linear_counts_on_llama_shapes() -> None:
    node = graph(aten.linear.default, ((B, S, H), F32, "act"), ((H, H), F32, "param"))
    # per axis: R, S(b), S(s), S(n), S(k) -> P, P(x); P(w) is dropped (a weight placeholder is never Partial)
    assert len(strategies_for(node, (8,))) == 6
    # 36 combinations minus (S(b), S(b)): batch 8 cannot split 64 ways
    assert len(strategies_for(node, (8, 8))) == 35


def test_sdpa_counts_on_llama_shapes() -> None:
    q = ((B, HEADS, S, HD), F32, "act")
    node = graph(aten.scaled_dot_product_attention.default, q, q, q, ((B, 1, S, S), torch.bool, "act"))
    # per axis: R, S(batch), S(heads), S(query length), P(v), ring (context parallel: q, k, v split along S)
    assert len(strategies_for(node, (8,))) == 6
    # 25 minus (S(b), S(b)) and (S(h), S(h)): 8 and 32 do not split 64 ways; plus a ring on either axis with
    # R, S(b), S(h) or P(v) on the other (no second ring, no query split beside a ring)
    assert len(strategies_for(node, (8, 8))) == 23 + 8
    causal = graph(aten.scaled_dot_product_attention.default, q, q, q, is_causal=True)
    assert len(strategies_for(causal, (8,))) == 5  # no query-length split under an implicit causal mask; ring


def test_embedding_counts_on_llama_shapes() -> None:
    node = graph(aten.embedding.default, ((V, H), F32, "param"), ((B, S), torch.int64, "param"))
    # per axis: R, S(b), S(s), S(h), S(v) -> P (vocab parallel); P(weight) dropped (a placeholder)
    assert len(strategies_for(node, (8,))) == 5
    assert len(strategies_for(node, (8, 8))) == 24  # minus (S(b), S(b))


def test_placeholder_specs() -> None:
    g = fx.Graph()
    for name, shape in (("w", (4, 8)), ("row", (1, 8)), ("odd", (3,))):
        g.placeholder(name).meta["val"] = torch.empty(shape, device="meta")
    w, row, odd = g.nodes
    assert strs(strategies_for(w, (2,))) == ["-> R", "-> S(0)", "-> S(1)"]
    assert len(strategies_for(w, (2, 2))) == 9  # {R, S(0), S(1)} per axis, all divide
    assert strs(strategies_for(row, (2,))) == ["-> R", "-> S(1)"]  # a dim of size 1 is never sharded
    assert strs(strategies_for(odd, (2,))) == ["-> R"]


# -- registry ------------------------------------------------------------------------------------------------------


def test_unknown_op_falls_back_to_replicate_with_one_warning() -> None:
    node, _ = build_node(aten.digamma.default, (torch.rand(4, 8) + 1,))
    node.meta["nn_module_stack"] = {"a": ("model", object), "b": ("model.layers.0.mlp", object)}
    assert not has_rule(aten.digamma.default)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = strategies_for(node, (2, 2))
    assert strs(got) == ["(R, R) -> (R, R)"] and got[0].work_divisor == 1
    assert len(caught) == 1 and issubclass(caught[0].category, UnsupportedOpWarning)
    assert "aten.digamma.default" in str(caught[0].message)
    assert "model.layers.0.mlp" in str(caught[0].message)
    node.meta["autoshard_module"] = "model.norm"  # capture's own key wins
    with pytest.warns(UnsupportedOpWarning, match="model.norm"):
        strategies_for(node, (2,))
    assert missing_rules(node.graph.owning_module or _module(node.graph)) == ["aten.digamma.default"]


def _module(g: fx.Graph) -> fx.GraphModule:
    return fx.GraphModule(torch.nn.Module(), g)


def test_registry_keys() -> None:
    assert has_rule(aten.mm.default) and has_rule(aten.mm.default.overloadpacket) is False
    assert has_rule("transformers::grouped_mm_fallback.default")  # registered by name: no transformers import
    with pytest.raises(ValueError, match="already has rule"):
        register(aten.mm.default)(lambda node, mesh: [])


def test_output_and_scalar_nodes() -> None:
    node, _ = build_node(aten.sym_size.int, (torch.randn(4, 8), 0))
    (only,) = strategies_for(node, (2,))
    assert only.inputs == (None,) and only.outputs == (None,) and only.input_grads == (None,)
    output = next(n for n in node.graph.nodes if n.op == "output")
    with pytest.raises(ShardingError, match="graph output"):
        strategies_for(output, (2,))


def test_getitem_follows_its_producer() -> None:
    topk, _ = build_node(aten.topk.default, (torch.randn(4, 8), 2))
    with topk.graph.inserting_after(topk):
        indices = topk.graph.call_function(__import__("operator").getitem, (topk, 1))
    indices.meta["val"] = topk.meta["val"][1]
    produced = []
    for s in strategies_for(topk, (2,)):
        if s.outputs[1] not in produced:
            produced.append(s.outputs[1])
    got = strategies_for(indices, (2,))
    assert [s.outputs[0] for s in got] == produced == [s.inputs[0] for s in got]
    assert all(s.input_grads == (None,) for s in got)  # integer indices carry no gradient


# -- local calls: what codegen emits ---------------------------------------------------------------------------


def _local(
    op: Any, args: tuple[Any, ...], strategy: str, mesh: tuple[int, ...], coord: tuple[int, ...]
) -> Any:
    node, _values = build_node(op, args)
    (s,) = [s for s in strategies_for(node, mesh, drop_dominated=False) if str(s) == strategy]
    local_args = fx.node.map_arg(node.args, lambda n: n.name)  # hooks never read tensor values
    return local_call(node, s, mesh, coord, local_args, dict(node.kwargs))


def test_view_sizes_are_localised() -> None:
    call = _local(aten.view.default, (torch.randn(2, 8, 32), [2, 8, -1, 8]), "S(2) -> S(2)", (2,), (1,))
    assert call.target is aten.view.default and call.args == ("in0", [2, 8, 2, 8])


def test_arange_is_created_piecewise() -> None:
    call = _local(aten.arange.start_step, (0, 16, 2), "-> S(0)", (4,), (3,))
    assert (call.target, call.args) == (aten.arange.start_step, (12, 16, 2))


def test_row_parallel_bias_is_added_once() -> None:
    x, w, b = torch.randn(2, 8), torch.randn(4, 8), torch.randn(4)
    first = _local(aten.linear.default, (x, w, b), "S(1), S(1), R -> P", (2,), (0,))
    second = _local(aten.linear.default, (x, w, b), "S(1), S(1), R -> P", (2,), (1,))
    assert first.args == ("in0", "in1", "in2") and second.args == ("in0", "in1", None)


def test_vocab_parallel_embedding_masks_foreign_ids() -> None:
    weight = torch.arange(8.0).repeat_interleave(2).view(8, 2)  # row r holds (r, r)
    ids = torch.tensor([[0, 5, 3, 7]])
    low, high = vocab_parallel_embedding(weight[:4], ids, 0), vocab_parallel_embedding(weight[4:], ids, 4)
    assert low[..., 0].tolist() == [[0.0, 0.0, 3.0, 0.0]] and high[..., 0].tolist() == [[0.0, 5.0, 0.0, 7.0]]
    assert torch.equal(low + high, torch.nn.functional.embedding(ids, weight))
