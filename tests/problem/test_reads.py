"""Strategies that agree on what a price reads share it (problem/reads.py), and a build cache's versioned
entries (``BuildCache.latest``) are made again exactly when what they read changes.

A LLaMA on a (2, 2, 2) mesh (three axes of one size: many strategies differ only by which axis splits a
dim) is priced strategy by strategy: every strategy's ``compute_parts``, ``node_memory`` and
``optimizer_time`` equal those of the first strategy with its key, and some keys do stand for several
strategies (so the sharing is exercised).
"""

from __future__ import annotations

from collections import defaultdict

import pytest

import autoshard
from autoshard import zoo
from autoshard.capture import capture
from autoshard.problem.build import _graph_of
from autoshard.problem.costs import CostOptions, compute_parts, node_memory, operand_bytes, optimizer_time
from autoshard.problem.reads import compute_key, memory_key
from autoshard.problem.shared import BuildCache

MESH = (2, 2, 2)


@pytest.fixture(scope="module")
def graph():
    case = zoo.build("llama-tiny", layers=2, batch=8, seq=32, device="meta")
    captured = capture(case.model, case.args, case.kwargs)
    return _graph_of(captured, MESH), autoshard.load_cluster("a100x8", mesh=MESH)


def test_strategies_with_one_compute_key_price_the_same(graph) -> None:
    g, cluster = graph
    shared = 0
    for name in g.variables:
        info = g.infos[name]
        if info.kind != "op":
            continue
        inputs = tuple(g.infos[s] for s in info.inputs)
        sizes = operand_bytes(info, inputs)
        first: dict[tuple, tuple] = {}
        for strategy in g.strategies[name]:
            parts = compute_parts(info, strategy, cluster, True, inputs, sizes)
            key = compute_key(strategy, MESH)
            if key in first:
                shared += 1
                assert parts == first[key], (name, str(strategy))
            first.setdefault(key, parts)
    assert shared > 100  # the axes of one size make many strategies alike


def test_strategies_with_one_memory_key_hold_the_same(graph) -> None:
    g, cluster = graph
    opts = CostOptions()
    groups: dict[tuple[str, object], list] = defaultdict(list)
    for name in g.variables:
        for strategy in g.strategies[name]:
            groups[name, memory_key(strategy, MESH)].append(strategy)
    assert any(len(s) > 1 for (name, _), s in groups.items() if g.infos[name].kind == "parameter")
    for (name, _), strategies in groups.items():
        info = g.infos[name]
        figures = {
            (
                optimizer_time(info, s, cluster, opts),
                node_memory(info, s, cluster, opts, True),
                node_memory(info, s, cluster, opts, False),
            )
            for s in strategies
        }
        assert len(figures) == 1, name


def test_a_versioned_entry_is_made_again_when_its_version_changes(graph) -> None:
    _, cluster = graph
    cache = BuildCache(cluster, None)
    made: list[int] = []

    def make() -> list[int]:
        made.append(len(made))
        return [len(made)]

    first = cache.latest("edge of", "e", (1, 0.5), make)
    assert cache.latest("edge of", "e", (1, 0.5), make) is first  # the same version: the same object
    again = cache.latest("edge of", "e", (1, 0.0), make)
    assert again is not first and again == [2]
    assert cache.latest("edge of", "e", (1, 0.5), make) == [3]  # one entry per key: the older one is gone
    assert cache.latest("edge of", "f", (1, 0.5), make) == [4]  # keys apart
