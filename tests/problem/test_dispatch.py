"""All-to-all token dispatch is priced from tokens x top-k (autoshard.problem.dispatch), on a tiny Mixtral."""

from __future__ import annotations

import pytest
import torch

import autoshard
from autoshard.capture import capture
from autoshard.capture.dispatch import routed_experts
from autoshard.problem.costs import CostOptions
from autoshard.problem.dispatch import dispatch_seconds, dispatch_steps
from autoshard.problem.graph import describe
from autoshard.strategies import strategies_for
from autoshard.strategies.rules.dispatch import dispatch_axis

transformers = pytest.importorskip("transformers")

TOKENS, HIDDEN, EXPERTS, TOP_K = 16, 32, 4, 2


def _captured():  # type: ignore[no-untyped-def]
    config = transformers.MixtralConfig(
        vocab_size=64, hidden_size=HIDDEN, intermediate_size=32, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, num_local_experts=EXPERTS, num_experts_per_tok=TOP_K, use_cache=False,
        router_jitter_noise=0.0,
    )  # fmt: skip
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = transformers.MixtralForCausalLM(config).eval()
    return capture(model, (torch.zeros(2, TOKENS // 2, dtype=torch.long),), blocks=None)


def test_all_to_all_volume_is_tokens_times_top_k_and_only_for_the_dispatching_strategy() -> None:
    cap = _captured()
    [node] = [n for n in cap.graph_module.graph.nodes if n.target is routed_experts]
    infos = {i.name: i for i in describe(cap.graph_module)}
    info = infos[node.name]
    inputs = tuple(infos[s] for s in info.inputs)
    cluster = autoshard.load_cluster("a100x8", mesh=(4, 2))
    rows = TOKENS // 8 * TOP_K * HIDDEN * 4  # tokens per device (split 4 x 2) x top-k x hidden x float32
    priced = 0
    for strategy in strategies_for(node, (4, 2)):
        forward, backward = dispatch_steps(info, strategy, cluster, inputs)
        axis = dispatch_axis(strategy)
        if axis is None:
            assert (
                forward == backward == ()
                and dispatch_seconds(info, strategy, cluster, inputs, CostOptions()) == 0
            )
            continue
        hidden = strategy.inputs[0]
        assert hidden is not None
        if any(str(p) == "R" for p in hidden.placements):  # tokens split on the dispatch axis only
            continue
        priced += 1
        assert [(s.kind, s.mesh_axis, s.nbytes) for s in forward] == [
            ("all_to_all", axis, EXPERTS * 8), ("all_to_all", axis, rows), ("all_to_all", axis, rows)
        ]  # fmt: skip
        assert [s.nbytes for s in backward] == [rows, rows]
        seconds = sum(cluster.collective_time(s.kind, s.nbytes, axis=axis) for s in (*forward, *backward))
        assert dispatch_seconds(info, strategy, cluster, inputs, CostOptions()) == pytest.approx(seconds)
        assert dispatch_seconds(info, strategy, cluster, inputs, CostOptions(training=False)) < seconds
    assert priced >= 1
