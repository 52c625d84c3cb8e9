"""Builds of one capture on one cluster share their policy-free figures (problem/shared.py), and the problems
are the ones pricing every strategy one at a time gives, bit for bit.

A 4-layer LLaMA (collapsed to 2 blocks) on a 2 x 4 mesh is built under every recomputation policy, at
shares 1, 0.5 and 0, with 1 and 2 microbatches: a build that finds the cache warm equals a cold build, the
node arrays equal the scalar cost functions strategy by strategy (node_compute, node_memory_total,
dispatch_seconds, ...: what the builder called before it composed arrays), and a warm build prices nothing
again.  A routed-experts model and a zigzag cluster (ring attention priced per strategy) are checked too.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np
import pytest

import autoshard
from autoshard import zoo
from autoshard.capture import capture
from autoshard.problem import arrays, extras, fanout
from autoshard.problem.build import BuiltProblem, build_problem
from autoshard.problem.context import zigzag_cluster
from autoshard.problem.costs import (
    MEMORY_TIE_BREAK,
    CostOptions,
    Recompute,
    StepCache,
    node_compute,
    optimizer_time,
    output_fix_steps,
    steps_time,
)
from autoshard.problem.dispatch import dispatch_seconds
from autoshard.problem.pricing import PriceTable
from autoshard.problem.recompute import node_memory_total
from autoshard.problem.shared import build_cache

MESH = (2, 4)  # two axes split a dim together as three do, at a fifth of (2, 2, 2)'s strategies
OPTIONS = [  # the planner's five builds (three policies, two at share 0), a share between, microbatches
    CostOptions(),
    CostOptions(recompute=Recompute.SELECTIVE),
    CostOptions(recompute=Recompute.FULL),
    CostOptions(recompute=Recompute.SELECTIVE, recompute_share=0.0),
    CostOptions(recompute=Recompute.FULL, recompute_share=0.5, microbatches=2),
]


@pytest.fixture(scope="module")
def llama():  # type: ignore[no-untyped-def]
    case = zoo.build("llama-tiny", layers=4, batch=8, seq=32, device="meta")
    return capture(case.model, case.args, case.kwargs), autoshard.load_cluster("a100x8", mesh=MESH)


def _arrays(built: BuiltProblem) -> list[bytes | tuple]:
    p = built.problem
    out: list[bytes | tuple] = [p.names, p.strategy_labels or ()]
    out += [a.tobytes() for a in p.node_costs]
    out += [(e.u, e.v, e.cost.shape, e.cost.tobytes()) for e in p.edges]
    out += [a.tobytes() for a in p.memory or ()] + [a.tobytes() for a in p.peak or ()]
    return out


def _cold(captured, cluster, opts: CostOptions) -> BuiltProblem:  # type: ignore[no-untyped-def]
    """A build from an empty cache (a StepCache of its own binds a new one)."""
    return build_problem(captured, cluster, opts, cache=StepCache(cluster))


def _reference_nodes(built: BuiltProblem) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Node costs and memory priced strategy by strategy with the scalar cost functions."""
    opts, cluster, infos = built.options, built.cluster, built.infos
    outputs = Counter(built.template[name] for name, info in infos.items() if info.is_output)
    costs, memory = [], []
    for name in built.variables:
        info, count = infos[name], built.multiplicity[name]
        inputs = tuple(infos[s] for s in info.inputs)
        cost, mem = [], []
        for strat in built.strategies[name]:
            fwd, bwd = node_compute(info, strat, cluster, opts, inputs)
            per_microbatch = fwd + bwd + dispatch_seconds(info, strat, cluster, inputs, opts)
            fix = steps_time(output_fix_steps(info, strat, built.cache), cluster) if outputs[name] else 0.0
            if info.is_output:
                per_microbatch += fix
            extra = per_microbatch * opts.microbatches + optimizer_time(info, strat, cluster, opts)
            m = node_memory_total(info, strat, cluster, opts, built.keeps[name], count)
            late = fix * opts.microbatches * (outputs[name] - info.is_output)
            cost.append(extra * count + late + MEMORY_TIE_BREAK * m)
            mem.append(m)
        costs.append(np.array(cost))
        memory.append(np.array(mem))
    return costs, memory


def _node_arrays_match_scalar_pricing(built: BuiltProblem) -> None:
    costs, memory = _reference_nodes(built)
    n = len(built.variables)
    with_reserve = list(memory)
    with_reserve[0] = with_reserve[0] + built.cluster.profile.memory.runtime_reserve
    template = built.template
    diagonal = {template[e.producer] for e in built.edges if template[e.producer] == template[e.consumer]}
    for k, name in enumerate(built.variables):
        assert built.problem.memory is not None
        assert built.problem.memory[k].tobytes() == with_reserve[k].tobytes(), name
        if name not in diagonal:  # a node feeding its own copy also carries that edge's diagonal
            assert built.problem.node_costs[k].tobytes() == costs[k].tobytes(), name
    assert len(built.problem.node_costs) >= n


def test_every_policy_share_and_microbatch_count_equals_a_cold_build_and_scalar_pricing(llama) -> None:  # type: ignore[no-untyped-def]
    captured, cluster = llama
    warm = [build_problem(captured, cluster, o) for o in OPTIONS]  # each after the ones before it
    for opts, built in zip(OPTIONS, warm, strict=True):
        assert _arrays(built) == _arrays(_cold(captured, cluster, opts)), opts
        _node_arrays_match_scalar_pricing(built)


def test_a_warm_build_prices_nothing_again(llama, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    captured, cluster = llama
    build_problem(captured, cluster, CostOptions())
    shared = build_cache(captured.graph_module, captured.blocks, cluster, None)
    calls = Counter[str]()
    for module, name in (
        (arrays, "compute_parts"),
        (arrays, "spec_pairs"),
        (arrays, "optimizer_time"),
        (fanout, "spec_pairs"),
        (extras, "_gather_node"),
    ):
        real = getattr(module, name)
        monkeypatch.setattr(
            module, name, lambda *a, _real=real, _name=name, **k: (calls.update([_name]), _real(*a, **k))[1]
        )
    hits = shared.hits
    built = build_problem(captured, cluster, CostOptions(recompute=Recompute.FULL, recompute_share=0.25))
    assert not calls, calls
    assert shared.hits > hits and built.cache is shared.steps
    # the strategies, labels and redistribution tables are the first build's objects
    first = build_problem(captured, cluster, CostOptions())
    assert all(built.strategies[v] is first.strategies[v] for v in built.variables)


def test_a_cache_serves_one_cluster_and_capture(llama) -> None:  # type: ignore[no-untyped-def]
    captured, cluster = llama
    other = autoshard.load_cluster("h100x8", mesh=MESH)
    zig = zigzag_cluster(cluster, 1)
    gm, blocks = captured.graph_module, captured.blocks
    first = build_cache(gm, blocks, cluster, None)
    assert build_cache(gm, blocks, cluster, None) is first
    assert build_cache(gm, blocks, other, None) is not first
    assert build_cache(gm, blocks, zig, None) is not first
    steps = StepCache(cluster)  # a caller's own StepCache binds a cache to it (the pipeline search's)
    assert build_cache(gm, blocks, cluster, steps).steps is steps
    for c in (other, zig):  # built after the first cluster's: nothing of it leaks in
        for opts in (CostOptions(cp_layout="auto"), CostOptions(recompute=Recompute.SELECTIVE)):
            assert _arrays(build_problem(captured, c, opts)) == _arrays(_cold(captured, c, opts))
    inference = CostOptions(training=False)
    assert _arrays(build_problem(captured, cluster, inference)) == _arrays(
        _cold(captured, cluster, inference)
    )


@pytest.mark.slow
def test_routed_experts_share_their_dispatch_figures() -> None:
    case = zoo.build("mixtral-tiny", layers=4, batch=8, seq=16, device="meta")
    captured = capture(case.model, case.args, case.kwargs)
    cluster = autoshard.load_cluster("a100x8", mesh=(2, 4))
    for opts in (CostOptions(), CostOptions(recompute=Recompute.FULL, recompute_share=0.5, microbatches=2)):
        built = build_problem(captured, cluster, opts)
        assert _arrays(built) == _arrays(_cold(captured, cluster, opts))
        _node_arrays_match_scalar_pricing(built)


def test_a_zigzag_build_reuses_the_plain_clusters_figures_bit_for_bit(llama, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A zigzag cluster's cache rests on its plain cluster's: compute, memory and output sizes come from there,
    its layout graphs are the plain ones with the moves on its axis repriced, and the problem equals one built
    with nothing shared (its own spec ids, layout graphs priced move by move), bit for bit."""
    captured, cluster = llama
    gm, blocks = captured.graph_module, captured.blocks
    computed = Counter[str]()
    for module, name in ((arrays, "compute_parts"), (arrays, "spec_pairs"), (fanout, "spec_pairs")):
        real = getattr(module, name)
        monkeypatch.setattr(
            module,
            name,
            lambda *a, _real=real, _name=name, **k: (computed.update([_name]), _real(*a, **k))[1],
        )
    policies = [CostOptions(cp_layout="contiguous", recompute=r) for r in Recompute]
    for axis, opts in [(0, policies[0]), *((1, o) for o in policies)]:
        zig = zigzag_cluster(cluster, axis)
        warm = dataclasses.replace(opts, cp_layout="auto")
        build_problem(captured, cluster, warm)  # the plain cluster's cache is warm
        before = computed.copy()
        shared = build_problem(captured, zig, opts)
        # compute figures and the spec pairs of every table: the plain cluster's (only prices are asked)
        assert computed == before, "a zigzag build priced what the plain cluster's cache holds"
        assert build_cache(gm, blocks, zig, None).base is build_cache(gm, blocks, cluster, None)
        alone = StepCache(zig)
        alone.prices = PriceTable(zig)  # no plain cluster's graphs either
        assert _arrays(shared) == _arrays(build_problem(captured, zig, opts, cache=alone)), axis
        _node_arrays_match_scalar_pricing(shared)
        # FSDP gathers run on the plain cluster's paths whatever the layout (codegen lowers there): the
        # zigzag build's gather nodes are the plain build's own
        plain = build_problem(captured, cluster, opts)
        assert shared.extras is not None and plain.extras is not None
        assert shared.extras.gathers is plain.extras.gathers
