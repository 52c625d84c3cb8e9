"""Work shared by every build of one capture on one cluster: what no recomputation policy changes.

The planner builds one capture several times on one cluster: once per recomputation policy (none,
selective, full), twice more at ``recompute_share`` 0 for the per-block search (:mod:`autoshard.problem.mix`),
again for a context-parallel layout, and the pipeline search once per policy on each stage's sub-mesh.
The redistribution tables of every edge and fan-out group, the buffers FSDP gathers, and each (node,
strategy)'s forward compute, hidden casts, dispatch, optimizer time and memory with and without keeping its
output do not depend on the policy.  A :class:`BuildCache` keeps them (the strategies, labels and weighted
uses, which depend on the mesh alone, are kept per capture and mesh by the builder); the builder
(:mod:`autoshard.problem.build`, :mod:`autoshard.problem.arrays`) composes each build's arrays from them with
the same float operations as pricing one strategy at a time, so a problem built from the cache is the
problem built without it, bit for bit (``tests/problem/test_shared.py``).

What keys what (so nothing that changes a price can hit a stale entry):

- the capture (its ``GraphModule``, held weakly, and its repeated-block record) and the cluster (profile,
  mesh, a :class:`~autoshard.problem.context.ZigzagCluster`'s axis: compared with ``==``, which tells the
  two classes apart) are the cache's own: :func:`build_cache` hands out one per pair;
- a zigzag cluster differs from its plain cluster only in ``collective_time`` on its axis (a reordering
  copy added), so its cache rests on the plain cluster's (``BuildCache.base``; the layout search builds
  up to one per mesh axis): the kinds in :data:`COLLECTIVE_FREE` and each node's compute, casts,
  optimizer and memory figures come from there (problem/arrays.py prices only its dispatch and output
  reduction again), its spec ids are the plain cache's (one interning), and its layout graphs are the
  plain ones with the moves on its axis repriced (problem/pricing.py).  Edge and fan-out tables are
  priced again (a raised move price changes shortest paths), from the plain cache's spec pairs (which
  specs each table prices, problem/pairs.py) and the plain price table's layout plans: only shortest
  paths are asked again.  A node with no all-to-all and no returned output keeps the plain figures
  whole.  Gathered FSDP sizes are the plain cache's, the path the runtime gathers on
  (problem/extras.runtime_steps).
  ``tests/problem/test_shared.py`` checks such a build against one sharing nothing, bit for bit;
- ``CostOptions.training``, ``shard_optimizer`` and ``precision`` change stored per-node figures and key
  them (:func:`node_key`); ``training`` also keys the fan-out elements and edge tables, and
  ``overlap.prefetch`` the gathered-buffer nodes;
- ``recompute``, ``recompute_share``, ``microbatches``, the rest of ``overlap`` and ``cp_layout`` are applied
  per build to the stored figures: safe to vary between builds that share a cache.  Two kinds of entry hold
  such a composed figure, versioned by every option field it reads (:meth:`BuildCache.latest`, one per key:
  made again whenever the version differs): an edge's weighted matrix and its ``Edge`` (``"edge of"``:
  weight, rerun share, ``microbatches``, ``training``, ``overlap.overlap_grad_sync``) and a fan-out group's
  node (``"fanout node"``: rerun share, ``microbatches``; ``training`` and ``precision`` key it), so
  consecutive builds that price them alike share them (LLaMA-3-70B's light policy builds 0.03 -> 0.013 s).

Entries are never changed in place: a build composes new arrays from them (per-node figures and price
tables are read-only arrays).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import torch.fx as fx

from autoshard.cluster import Cluster
from autoshard.problem.costs import CostOptions, StepCache

__all__ = ["COLLECTIVE_FREE", "BuildCache", "build_cache", "node_key"]

T = TypeVar("T")


class BuildCache:
    """Figures of one capture on one cluster that every build reuses (module docstring: what keys them).

    ``steps`` is the :class:`StepCache` the built problems carry: the interned spec ids stored here are
    its ids, so a cache is bound to one."""

    def __init__(
        self, cluster: Cluster, blocks: object, steps: StepCache | None = None, base: BuildCache | None = None
    ) -> None:
        self.cluster = cluster
        self.blocks = blocks  # the capture's BlockInfo: a capture re-cut differently is another graph
        self.base = base  # a zigzag cluster's: the plain cluster's cache (module docstring)
        if base is not None:
            assert steps is None, "a zigzag cluster's cache interns its specs with its plain cluster's"
            steps = StepCache(cluster, specs=base.steps)
        self.steps: StepCache = steps if steps is not None else StepCache(cluster)
        self._entries: dict[tuple[str, Any], Any] = {}
        self.hits = 0  # entries served from the cache (tests and benchmarks read it)

    def get(self, kind: str, key: Any, make: Callable[[], T]) -> T:
        """The entry ``(kind, key)``, made by ``make()`` the first time; a kind no collective prices
        (:data:`COLLECTIVE_FREE`) comes from the plain cluster's cache when this one has it."""
        if self.base is not None and kind in COLLECTIVE_FREE:
            return self.base.get(kind, key, make)
        full = (kind, key)
        found: Any = self._entries.get(full)
        if found is None and full not in self._entries:
            found = self._entries[full] = make()
        else:
            self.hits += 1
        return found

    def latest(self, kind: str, key: Any, version: Any, make: Callable[[], T]) -> T:
        """The entry ``(kind, key)`` made for ``version`` (what it reads of the build's options), made again
        and kept in its place when the version differs: one per key, so a priced matrix that builds alike
        share (consecutive policies mostly are) costs no memory of its own beyond the problems'."""
        full = (kind, key)
        found = self._entries.get(full)
        if found is not None and found[0] == version:
            self.hits += 1
            return found[1]
        value = make()
        self._entries[full] = (version, value)
        return value


#: Entry kinds whose figures no collective prices (a local output's bytes, the spec pairs of edge and
#: fan-out tables: the mesh and the spec ids alone), served to a zigzag cluster's cache by its plain
#: cluster's.  Per-node figures share their collective-free part the same way (problem/arrays.py
#: ``node_parts``); edge and fan-out tables are priced again (a zigzag axis raises some move prices, and
#: with them shortest paths).
COLLECTIVE_FREE = frozenset({"largest output", "edge pairs", "fanout pairs"})


def node_key(opts: CostOptions) -> tuple[bool, bool, object]:
    """The option fields per-node figures depend on (the others are applied per build)."""
    return (opts.training, opts.shard_optimizer, opts.precision)


#: One cache per (capture, cluster); dropped with the capture's graph.
_CACHES: weakref.WeakKeyDictionary[fx.GraphModule, dict[Cluster, BuildCache]] = weakref.WeakKeyDictionary()


def build_cache(gm: fx.GraphModule, blocks: object, cluster: Cluster, steps: StepCache | None) -> BuildCache:
    """The cache of ``gm`` on ``cluster``; a new one when the capture's blocks differ or the caller brings
    its own :class:`StepCache` (then bound to it, so the ids it interns stay consistent).  A zigzag
    cluster's cache (no :class:`StepCache` of the caller's) rests on its plain cluster's."""
    from autoshard.problem.context import plain_cluster

    per_cluster = _CACHES.setdefault(gm, {})
    found = per_cluster.get(cluster)
    plain = plain_cluster(cluster)
    base = build_cache(gm, blocks, plain, None) if plain != cluster and steps is None else None
    stale = found is not None and base is not None and found.base is not base
    if found is None or stale or found.blocks != blocks or (steps is not None and found.steps is not steps):
        found = per_cluster[cluster] = BuildCache(cluster, blocks, steps, base)
    return found
