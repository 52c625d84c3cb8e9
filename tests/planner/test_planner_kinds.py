"""Every kind of ``allow=`` / ``forbid=`` holds on every tensor and every mesh axis (the table in
autoshard/steering.py), checked on a Hugging Face LLaMA built from a config on a 2 x 2 x 2 mesh.

The check is independent of the classifier: the model's dims all differ (batch 6, sequence 8192, hidden
2560, 20 heads of 128, 4 KV heads, FFN 6912, vocabulary 32000, and batch x sequence 49152), so a split's kind
is read from the size of the dim it splits; fsdp is read on the weight-to-op edges, pp refuses stages.
New-user trial: ``--forbid dp --forbid tp --forbid fsdp`` gave "TP 4 x CP 2": heads split inside attention
(and the reshapes around it) escaped the tp mask."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

import autoshard
from autoshard import zoo
from autoshard.annotations import pin_problem
from autoshard.capture import capture
from autoshard.errors import AnnotationError
from autoshard.placement import Shard, ShardingSpec
from autoshard.problem.build import BuiltProblem, build_problem
from autoshard.problem.costs import CostOptions
from autoshard.problem.graph import NodeInfo
from autoshard.report.labels import parse_label
from autoshard.search.problem import pairwise_form
from autoshard.steering import no_gather
from autoshard.strategies import OpStrategy

transformers = pytest.importorskip("transformers")

B, S, H, HEADS, KV, FFN, VOCAB = 6, 8192, 2560, 20, 4, 6912, 32000
ROLE = {B: ("dp",), S: ("seq",), B * S: ("dp", "seq")}  # any other size is a feature dim: tp
MESH = (2, 2, 2)


@functools.cache
def _llama():
    config = transformers.LlamaConfig(
        hidden_size=H, intermediate_size=FFN, num_hidden_layers=2, num_attention_heads=HEADS,
        num_key_value_heads=KV, vocab_size=VOCAB, max_position_embeddings=S, use_cache=False,
        attn_implementation="sdpa", bos_token_id=0, eos_token_id=VOCAB - 1,
    )  # fmt: skip
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    ids = torch.zeros(B, S, dtype=torch.long, device="meta")
    return model, ids, capture(model, (ids,), {}, blocks="auto")


@functools.cache
def _built() -> BuiltProblem:
    _, _, captured = _llama()
    return build_problem(captured, autoshard.load_cluster("a100x8", mesh=MESH), CostOptions())


def _kinds_by_size(info: NodeInfo, strategy: OpStrategy, infos) -> set[str]:
    """The kinds of the splits ``strategy`` makes, read from the sizes of the dims it splits."""
    attention = "scaled_dot_product" in info.target
    operands = [
        (infos[src].outputs[k], spec, infos[src].kind)
        for src, k, spec in zip(info.inputs, info.input_outputs, strategy.inputs, strict=False)
    ]
    operands += [(meta, spec, info.kind) for meta, spec in zip(info.outputs, strategy.outputs, strict=False)]
    found: set[str] = set()
    for meta, spec, kind in operands:
        for p in spec.placements if spec is not None and meta is not None else ():
            if isinstance(p, Shard):
                roles = ("tp",) if kind in ("parameter", "buffer") else ROLE.get(meta.shape[p.dim], ("tp",))
                found |= {("cp" if attention else "sp") if r == "seq" else r for r in roles}
    return found


@pytest.mark.parametrize("kind", ["dp", "tp", "sp", "cp", "ep"])
def test_no_strategy_left_splits_a_forbidden_kind_on_any_axis(kind: str) -> None:
    """Not only the plan chosen: every strategy the search may still pick, at every op and input."""
    built = _built()
    pinned = pin_problem(built, None, frozenset({kind}))
    left, removed = [], 0
    for k, name in enumerate(built.variables):
        info, mask = built.infos[name], pinned.problem.allowed[k]
        if info.kind not in ("op", "user_input"):
            continue  # where a weight is stored: fsdp's (tested below), not a split it computes on
        for j, s in enumerate(built.strategies[name]):
            if mask is not None and not mask[j]:
                removed += 1
            elif kind in _kinds_by_size(info, s, built.infos):
                left.append(f"{info.op} {name}: {s}")
    assert left == []
    assert (removed > 0) == (kind != "ep")  # a dense model has no expert to split


def test_forbidding_tp_keeps_sequence_and_batch_splits() -> None:
    """The mask removes what it must and no more: attention can still ring, matmuls still split by batch
    or sequence (only integer bookkeeping built from shapes alone is masked beyond that)."""
    built = _built()
    pinned = pin_problem(built, None, frozenset({"tp"}))
    kept: dict[str, set[str]] = {}
    for k, name in enumerate(built.variables):
        info, mask = built.infos[name], pinned.problem.allowed[k]
        for j, s in enumerate(built.strategies[name]):
            if info.kind == "op" and (mask is None or mask[j]):
                kept.setdefault(info.op, set()).update(_kinds_by_size(info, s, built.infos))
    assert {"dp", "cp"} <= kept["scaled_dot_product_attention"]
    assert {"dp", "sp"} <= kept["linear"] and "tp" not in kept["linear"]


def test_dp_tp_fsdp_forbidden_leaves_a_context_parallel_plan() -> None:
    """The trial's command on 2 x 2 x 2: the answer splits by sequence only, attention included."""
    model, ids, captured = _llama()
    cluster = autoshard.load_cluster("a100x8", mesh=MESH)
    plan = autoshard.plan(
        model, cluster, (ids,), captured=captured, forbid=["dp", "tp", "fsdp"], memory_limit=float("inf")
    )
    headline = plan.summary().splitlines()[0]
    assert "CP" in headline and not any(k in headline for k in ("TP", "DP", "FSDP")), headline
    infos = _built().infos
    found = set()
    for node in plan.nodes:
        info = infos.get(node.name)
        label = parse_label(node.strategy)
        if info is None or info.kind not in ("op", "user_input"):
            continue
        ins, outs = ([_spec(x) for x in side] for side in (label.inputs, label.outputs))
        found |= _kinds_by_size(info, OpStrategy(tuple(ins), tuple(outs), (None,) * len(ins), 1), infos)
    assert found <= {"sp", "cp"} and "cp" in found
    assert plan.param_placements and all(set(p) == {"R"} for p in plan.param_placements.values())


def _spec(placements: tuple[str, ...] | None) -> ShardingSpec | None:
    return ShardingSpec.parse(placements) if placements is not None else None


def test_pp_forbidden_refuses_stages_in_one_line() -> None:
    model, ids, captured = _llama()
    cluster = autoshard.load_cluster("a100x8", mesh=MESH)
    for steer in ({"forbid": ["pp"]}, {"allow": ["dp", "tp"]}):
        with pytest.raises(AnnotationError, match=r"pipeline=2 asks for pipeline stages but pp is forbidden"):
            autoshard.plan(model, cluster, (ids,), captured=captured, pipeline=2, **steer)
    with pytest.raises(AnnotationError, match="'stage' annotation asks for pipeline stages"):
        autoshard.plan(model, cluster, (ids,), annotations={"model.layers.1": "stage"}, forbid=["pp"])


def test_a_pin_against_a_forbidden_kind_names_the_kind_to_allow() -> None:
    built = _built()
    with pytest.raises(
        AnnotationError, match=r"= 'ring' contradicts forbidding .*; drop the annotation or allow cp$"
    ):
        pin_problem(built, {"model.layers.*.self_attn": "ring"}, frozenset({"cp", "tp"}), "model.layers", 0)


@functools.cache
def _mixtral_built() -> BuiltProblem:
    """Mixtral-tiny's problem, built once for both kinds (pin_problem leaves it as it is: see the fsdp test)."""
    case = zoo.build("mixtral-tiny", device="meta")
    captured = capture(case.model, case.args, dict(case.kwargs), blocks="auto")
    return build_problem(captured, autoshard.load_cluster("a100x8", mesh=MESH), CostOptions())


@pytest.mark.parametrize(("kind", "split", "kept"), [("ep", {0}, {1, 2}), ("tp", {1, 2}, {0})])
def test_expert_weights_split_by_expert_are_ep_and_inside_an_expert_tp(kind, split, kept) -> None:
    """Mixtral (tiny, 4 experts): forbidding ep keeps the stacked expert weights whole along the experts
    (their dim 0 at the routed-experts op), forbidding tp keeps them whole inside each expert; the other
    split stays allowed."""
    built = _mixtral_built()
    pinned = pin_problem(built, None, frozenset({kind}))
    seen: set[int] = set()
    for k, name in enumerate(built.variables):
        info, mask = built.infos[name], pinned.problem.allowed[k]
        if info.op != "routed_experts":
            continue
        weights = [j for j, src in enumerate(info.inputs) if len(built.infos[src].outputs[0].shape) == 3]
        assert len(weights) == 2
        for j, s in enumerate(built.strategies[name]):
            dims = {p.dim for w in weights for p in s.inputs[w].placements if isinstance(p, Shard)}
            if mask is None or mask[j]:
                assert not dims & split, s
                seen |= dims
    assert kept & seen  # the other split is still offered


def test_fsdp_forbidden_prices_every_gather_of_a_weight_inf() -> None:
    """fsdp is read on the weight-to-op edges: infinite exactly where the op uses the weight other than as
    stored (a gather), on every axis; any other kind leaves the edges as priced."""
    built = _built()
    pairs = pairwise_form(pin_problem(built, None, frozenset({"fsdp"})).problem).pairs
    checked = 0
    for use in built.edges:
        if built.infos[use.producer].kind != "parameter":
            continue
        u, v = built.index(use.producer), built.index(use.consumer)
        src, dst = built.strategies[built.variables[u]], built.strategies[built.variables[v]]
        cost = pairs[(u, v)] if u < v else pairs[(v, u)].T
        for a, b in np.ndindex(cost.shape):
            assert np.isinf(cost[a, b]) != no_gather(src[a], dst[b], use.position)
        checked += 1
    assert checked >= 9  # every weight of a layer and those outside the layers
    assert pin_problem(built, None, frozenset({"tp"})).problem.edges is built.problem.edges
