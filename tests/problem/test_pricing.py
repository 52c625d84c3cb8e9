"""Whole-table redistribution prices equal the per-pair Dijkstra search, bit for bit."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

import autoshard
from autoshard.placement import Partial, Replicate, Shard, ShardingSpec
from autoshard.problem.costs import StepCache


def _all_specs(ndim: int, mesh_ndim: int) -> list[ShardingSpec]:
    options = [Replicate(), Partial(), *(Shard(d) for d in range(ndim))]
    return [ShardingSpec(tuple(p)) for p in itertools.product(options, repeat=mesh_ndim)]


@pytest.mark.parametrize(
    ("mesh", "nodes", "shape"),
    [
        ((2, 2, 2), 1, (4, 8, 6)),
        ((2, 4, 8), 8, (16, 6, 64)),
        ((2, 4), 1, (2, 3)),
        ((4, 2, 2, 2), 4, (8, 8)),
        ((2, 1, 4), 1, (1, 8, 1, 4)),  # dims of size 1 (dropped from the layout graph) and an axis of size 1
    ],
)
def test_table_equals_the_search_for_every_pair(
    mesh: tuple[int, ...], nodes: int, shape: tuple[int, ...]
) -> None:
    cluster = autoshard.load_cluster("a100x8", nodes=nodes, mesh=mesh)
    every = _all_specs(len(shape), len(mesh))
    specs: list[ShardingSpec | None] = [*every[:: max(1, len(every) // 80)], None]  # <= ~80 + 2 per side
    specs.append(ShardingSpec((Partial("max"), *(Replicate() for _ in mesh[1:]))))  # may only stay as it is
    cache = StepCache(cluster)
    ids = [cache.intern(s) for s in specs]
    table = cache.prices.pairwise(specs, specs, shape, 2)
    expected = np.array([[cache.time(a, b, shape, 2) for b in ids] for a in ids])
    assert np.isinf(expected).any() and (expected > 0).any()  # the case covers unfit specs and real moves
    same = (table == expected) | (np.isinf(table) & np.isinf(expected))
    assert same.all(), [(str(specs[i]), str(specs[j])) for i, j in zip(*np.nonzero(~same), strict=True)][:5]


def test_intern_names_equal_specs_alike_whichever_object_asks() -> None:
    """StepCache.intern answers a spec object it has met by identity: the same ids as by value, and a zigzag
    cluster's cache sharing the ids (``specs=``) answers alike."""
    from autoshard.problem.context import zigzag_cluster

    cluster = autoshard.load_cluster("a100x8", mesh=(2, 2, 2))
    specs = _all_specs(2, 3)[::5]
    twins = [ShardingSpec.parse(str(s)) for s in specs]  # equal, other objects
    cache = StepCache(cluster)
    ids = [cache.intern(s) for s in specs]
    assert ids == list(range(len(specs))) and [cache.intern(s) for s in twins] == ids
    assert [cache.intern(s) for s in specs] == ids and cache.intern(None) == -1
    zigzag = StepCache(zigzag_cluster(cluster, 2), specs=cache)
    assert [zigzag.intern(s) for s in (*twins, *specs)] == ids * 2
    assert all(cache.spec(k) is s for k, s in zip(ids, specs, strict=True))


def test_shapes_that_order_the_same_sizes_share_one_graph_and_keep_their_prices() -> None:
    cluster = autoshard.load_cluster("a100x8", mesh=(2, 2, 2))
    specs: list[ShardingSpec | None] = [*_all_specs(3, 3)[::7], None]
    cache = StepCache(cluster)
    ids = [cache.intern(s) for s in specs]
    for shape in ((4, 8, 6), (8, 6, 4)):
        table = cache.prices.pairwise(specs, specs, shape, 2)
        expected = np.array([[cache.time(a, b, shape, 2) for b in ids] for a in ids])
        same = (table == expected) | (np.isinf(table) & np.isinf(expected))
        assert same.all(), shape
    graphs = cache.prices._graphs  # one graph, on the dims sorted by size (the table is shared per cluster)
    assert ((4, 6, 8), 2) in graphs and ((4, 8, 6), 2) not in graphs and ((8, 6, 4), 2) not in graphs


def test_dims_of_size_one_share_the_graph_without_them_and_keep_their_prices() -> None:
    cluster = autoshard.load_cluster("a100x8", mesh=(2, 2, 2))
    cache = StepCache(cluster)
    for shape in ((1, 4, 1, 8), (8, 1, 4)):
        specs: list[ShardingSpec | None] = [*_all_specs(len(shape), 3)[::5], None]
        ids = [cache.intern(s) for s in specs]
        table = cache.prices.pairwise(specs, specs, shape, 2)
        expected = np.array([[cache.time(a, b, shape, 2) for b in ids] for a in ids])
        assert np.isinf(expected).any() and (expected > 0).any()
        same = (table == expected) | (np.isinf(table) & np.isinf(expected))
        assert same.all(), shape
    graphs = cache.prices._graphs  # one graph, on the dims of size > 1 sorted by size (shared per cluster)
    assert ((4, 8), 2) in graphs and not any(1 in shape for shape, _ in graphs)


def test_table_rows_grow_lazily_and_stay_consistent() -> None:
    cluster = autoshard.load_cluster("a100x8", nodes=2, mesh=(2, 2, 4))
    shape = (8, 16)
    specs = _all_specs(2, 3)
    cache = StepCache(cluster)
    first = cache.prices.pairwise(specs[:5], specs, shape, 4)
    whole = cache.prices.pairwise(specs, specs, shape, 4)
    assert np.array_equal(first, whole[:5])
    assert math.isfinite(whole[0, -1])


def test_fanout_element_tables_equal_the_pair_by_pair_prices() -> None:
    """Fan-out element costs come from whole price tables; they equal StepCache.time pair by pair, bit for bit."""
    from autoshard import zoo
    from autoshard.capture import capture
    from autoshard.problem.build import build_problem
    from autoshard.problem.costs import CostOptions, dual_spec
    from autoshard.problem.fanout import _element_cost, element_of

    case = zoo.build("llama-tiny")
    cluster = autoshard.load_cluster("a100x8", mesh=(2, 2, 2))
    opts = CostOptions()
    built = build_problem(capture(case.model, case.args, case.kwargs), cluster, opts)
    assert built.fanouts, "the tiny LLaMA shares tensors among consumers on this mesh"
    cache = built.cache
    for fan in built.fanouts[:2]:  # the per-pair search is slow: a few nodes, a few source strategies each
        producer = built.infos[fan.group.producer]
        src = built.strategies[fan.group.producer]
        elements = sorted(
            {
                element_of(producer, s, pos, opts, cache)
                for c, pos in fan.group.entries
                for s in built.strategies[c]
            }
        )
        table = _element_cost(producer, fan.group.which, src, elements, opts, cache)
        meta = producer.outputs[fan.group.which]
        assert meta is not None
        for a, s in list(enumerate(src))[:: max(1, len(src) // 6)]:
            have = s.outputs[fan.group.which]
            h, d = cache.intern(have), cache.intern(dual_spec(have)) if have is not None else -1
            for e, (want, grad) in enumerate(elements):
                t = cache.time(h, want, meta.shape, meta.itemsize)
                if producer.requires_grad:
                    t += cache.time(grad, d, meta.shape, meta.itemsize)
                assert table[a, e] == t or (math.isinf(t) and math.isinf(table[a, e]))


def test_warm_started_masks_equal_a_cold_search() -> None:
    """Each P-axis mask starts from the prices of the mask with one P axis fewer: the same table bit for bit
    as Bellman-Ford from scratch, for every mask and every start."""
    from autoshard.problem.pricing import _bellman_ford

    cluster = autoshard.load_cluster("a100x8", nodes=2, mesh=(2, 2, 4))
    shape = (8, 4, 16)
    cache = StepCache(cluster)
    graph = cache.prices._graph(shape, 2)
    starts = sorted(graph.index.values())
    for mask in itertools.product((False, True), repeat=3):
        rows, warm = cache.prices._distances(shape, 2, mask, graph, starts[::-1])
        cold = _bellman_ford(graph, mask, starts)
        assert np.array_equal(warm[[rows[s] for s in starts]], cold), mask


@pytest.mark.parametrize(("mesh", "nodes", "shape"), [((2, 2, 4), 2, (8, 4, 16)), ((2, 2, 2, 2), 2, (4, 8))])
def test_any_warm_start_mask_gives_the_cold_table(
    mesh: tuple[int, ...], nodes: int, shape: tuple[int, ...]
) -> None:
    """Whichever P axis the warm start leaves out (the planner drops the outermost, a speed choice), the
    table is the cold Bellman-Ford's bit for bit."""
    from autoshard.problem.pricing import _bellman_ford

    cluster = autoshard.load_cluster("a100x8", nodes=nodes, mesh=mesh)
    graph = StepCache(cluster).prices._graph(shape, 4)
    starts = sorted(graph.index.values())
    for mask in itertools.product((False, True), repeat=len(mesh)):
        cold = _bellman_ford(graph, mask, starts)
        for drop in (a for a, m in enumerate(mask) if m):
            fewer = tuple(m and a != drop for a, m in enumerate(mask))
            warm = _bellman_ford(graph, mask, starts, (fewer, _bellman_ford(graph, fewer, starts)))
            assert np.array_equal(warm, cold), (mask, drop)
