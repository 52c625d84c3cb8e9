"""``allow=`` / ``forbid=`` hold on every tensor (autoshard/steering.py): forbidding ``dp`` leaves no
activation split by batch, not only the inputs; forbidding ``fsdp`` gathers no weight, tied ones included."""

from __future__ import annotations

import functools

import numpy as np
import pytest

import autoshard
from autoshard import zoo
from autoshard.annotations import pin_problem
from autoshard.capture import capture
from autoshard.problem.build import BuiltProblem, build_problem
from autoshard.problem.costs import CostOptions
from autoshard.report.labels import parse_label, shard_dim
from autoshard.search.problem import pairwise_form
from autoshard.steering import batch_dims, no_gather

BATCH, SEQ = 8, 80  # no other dim of gpt2 is 8 or 8 x 80 = 640 (hidden 768, heads 12, head dim 64, ffn 3072)


@functools.cache
def _gpt2():
    case = zoo.build("gpt2", layers=2, batch=BATCH, seq=SEQ)
    return case, capture(case.model, case.args, dict(case.kwargs), blocks="auto")


def _plan(**options) -> autoshard.Plan:
    case, captured = _gpt2()
    cluster = autoshard.load_cluster("a100x8", mesh=(8,))
    return autoshard.plan(case.model, cluster, case.args, case.kwargs, captured=captured, **options)


def _batch_splits(plan: autoshard.Plan) -> list[str]:
    """Nodes whose output is split on a dim of the batch's size (or batch x sequence, once flattened)."""
    _, captured = _gpt2()
    shapes = {
        n.name: tuple(n.meta["val"].shape)
        for n in captured.graph_module.graph.nodes
        if n.op == "call_function" and hasattr(n.meta.get("val"), "shape")
    }
    out = []
    for node in plan.nodes:
        spec, shape = parse_label(node.strategy).output, shapes.get(node.name)
        dims = {shard_dim(p) for p in spec or ()} - {None}
        if shape and any(shape[d] in (BATCH, BATCH * SEQ) for d in dims if d is not None):
            out.append(f"{node.name} {node.strategy}")
    return out


def test_the_free_plan_splits_the_batch() -> None:
    """The control: left free, this plan is data parallel on activations deep inside the model."""
    assert len(_batch_splits(_plan())) > 10


@pytest.mark.parametrize("steer", [{"allow": ["tp"]}, {"forbid": ["dp"]}])
def test_no_activation_is_split_by_batch_without_dp(steer) -> None:
    plan = _plan(**steer)
    assert _batch_splits(plan) == []
    assert plan.unpinned_step_time is not None and plan.predicted_step_time >= plan.unpinned_step_time
    assert "DP" not in plan.summary().splitlines()[0]


def test_allow_tp_gathers_no_weight_tied_ones_included() -> None:
    """gpt2 ties lm_head.weight to transformer.wte.weight: its uses go through a fan-out node."""
    plan = _plan(allow=["tp"])
    _, captured = _gpt2()
    placeholders = {n.name for n in captured.graph_module.graph.nodes if n.op == "placeholder"}
    weights = placeholders - set(captured.user_inputs)
    assert [c for c in plan.collectives if c.kind == "all_gather" and c.tensor in weights] == []
    assert "FSDP" not in plan.summary()
    built = _built()
    pinned = pin_problem(built, None, frozenset({"fsdp"}))
    pairs = pairwise_form(pinned.problem).pairs
    tied = [e for e in built.edges if built.infos[e.producer].fqn == "transformer.wte.weight"]
    assert len(tied) == 2  # the embedding and lm_head, through a fan-out node
    for use in tied:
        u, v = built.index(use.producer), built.index(use.consumer)
        src, dst = built.strategies[built.variables[u]], built.strategies[built.variables[v]]
        cost = pairs[(u, v)] if u < v else pairs[(v, u)].T
        for a, b in np.ndindex(cost.shape):
            assert np.isinf(cost[a, b]) != no_gather(src[a], dst[b], use.position)


def _built() -> BuiltProblem:
    _, captured = _gpt2()
    return build_problem(captured, autoshard.load_cluster("a100x8", mesh=(8,)), CostOptions())


def test_batch_dims_follow_flattens_transposes_and_the_mask() -> None:
    """Dim 0 of (B, S, H), of (B*S, H) after a view, of (B, heads, S, d) after a transpose; the causal
    mask built from shapes alone carries it too (found backwards from attention)."""
    built = _built()
    dims = batch_dims(built.infos, built.strategies, built.template)
    by_op: dict[str, set[int]] = {}
    for (name, _), ds in dims.items():
        by_op.setdefault(built.infos[name].op, set()).update(ds)
    assert by_op["placeholder"] == {0}
    assert by_op["scaled_dot_product_attention"] == {0}
    assert by_op["addmm"] == {0}  # GPT-2's Conv1D on (B*S, H)
    sdpa = next(i for i in built.infos.values() if i.op == "scaled_dot_product_attention")
    mask = [src for src in sdpa.inputs if len(built.infos[src].outputs[0].shape) == 4][-1]
    assert dims.get((mask, 0)) == frozenset({0})
