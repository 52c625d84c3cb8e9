"""Attention over a mask proven causal is priced as the kernel the emitted program runs: the causal triangle,
mask unread, where the query rows stay whole or ring; the full square with the mask where only q's rows split;
an unproven mask at the square everywhere."""

from __future__ import annotations

import dataclasses
import functools

import pytest

from autoshard import zoo
from autoshard.capture import capture
from autoshard.placement import Shard
from autoshard.problem.attention import causal_attention
from autoshard.problem.build import BuiltProblem, build_problem
from autoshard.problem.costs import CostOptions, node_compute
from autoshard.runtime.verify import cluster_for
from cost_models.compute import attention_time, causal_share
from cost_models.profile import load_profile

SEQ = 2048  # long enough that attention is compute-bound on an H100


def test_the_causal_share_counts_the_visible_pairs() -> None:
    assert causal_share(1, 1) == 1.0 and causal_share(4, 4) == pytest.approx(10 / 16)
    assert causal_share(SEQ, SEQ) == pytest.approx((SEQ + 1) / (2 * SEQ))
    assert causal_share(2, 4) == pytest.approx(3 / 8)  # top-left aligned: query i sees keys 0..i
    assert causal_share(4, 2) == pytest.approx((1 + 2 + 2 + 2) / 8)
    p = load_profile("h100x8")
    full, causal = (attention_time(4096, SEQ, SEQ, 64, "bfloat16", p, causal=c) for c in (False, True))
    assert causal == pytest.approx(full * causal_share(SEQ, SEQ), rel=1e-3)


@functools.cache
def _built() -> BuiltProblem:
    case = zoo.build("llama-tiny", layers=1, batch=2, seq=SEQ, device="meta")
    cluster = cluster_for("h100x8", 2)
    return build_problem(capture(case.model, case.args, case.kwargs), cluster, CostOptions())


def _kind(strategy: object, rank: int = 4) -> str:
    """Which dim of the (B, H, S, E) output the strategy splits on the one axis: batch, heads, rows or none."""
    out = strategy.outputs[0]  # type: ignore[attr-defined]
    split = next((p.dim for p in out.placements if isinstance(p, Shard)), None)
    ring = isinstance(strategy.inputs[1].placements[0], Shard) and strategy.inputs[1].placements[0].dim == 2  # type: ignore[attr-defined]
    return {None: "whole", 0: "batch", 1: "heads", rank - 2: "ring" if ring else "rows"}.get(split, "other")


def test_proven_attention_is_priced_at_the_triangle_where_it_runs_causal() -> None:
    built = _built()
    (name,) = [n for n, i in built.infos.items() if "scaled_dot" in i.target]
    info = built.infos[name]
    assert info.causal_mask
    inputs = tuple(built.infos[i] for i in info.inputs)
    mask = next(m for src in inputs for m in src.outputs if m is not None and m.dtype == "bool")
    seen = set()
    for strategy in built.strategies[name]:
        kind = _kind(strategy)
        seen.add(kind)
        share, unread = causal_attention(info, strategy, inputs, (2,))
        proven = node_compute(info, strategy, built.cluster, built.options, inputs)
        square = node_compute(
            dataclasses.replace(info, causal_mask=False), strategy, built.cluster, built.options, inputs
        )
        if kind == "rows":  # each piece needs its rows of the mask: the kernel computes the whole square
            assert (share, unread) == (1.0, 0.0) and proven == square
            continue
        assert share == pytest.approx((SEQ + 1) / (2 * SEQ))
        assert unread == mask.nbytes / (1 if kind in ("whole", "heads") else 2)  # the (B, 1, S, S) mask
        if kind != "ring":  # compute-bound: the FLOP term (beyond the ramp τ) is the triangle's share
            tau = built.cluster.profile.compute.efficiency_half_time
            assert proven[0] - tau == pytest.approx((square[0] - tau) * share, rel=1e-9)
            assert proven[1] / proven[0] == pytest.approx(square[1] / square[0])  # backward: the same ratio
    assert {"whole", "batch", "heads", "rows", "ring"} <= seen
