"""What a price reads of a strategy: strategies that agree on it share the price (issue 17: the builds).

A node's strategies often differ only where no price of its own looks: two mesh axes of one size swapped, a
``Partial`` where a ``Replicate`` was.  :func:`compute_key` names what
:func:`~autoshard.problem.costs.compute_parts` reads, :func:`memory_key` what ``node_memory`` and
``optimizer_time`` read, so :func:`autoshard.problem.arrays.node_parts` prices each key once and gives the
figures to every strategy with it.  Pure functions of the spec and the mesh.
"""

from __future__ import annotations

import functools

from autoshard.placement import Shard, ShardingSpec
from autoshard.strategies import OpStrategy

__all__ = ["compute_key", "memory_key"]


def compute_key(strategy: OpStrategy, mesh: tuple[int, ...]) -> tuple:
    """All :func:`~autoshard.problem.costs.compute_parts` reads of a strategy, so strategies with one key
    share its figures (70B on 16 x 8 x 8: 3,896 keys for 11,416 op strategies; axes 1 and 2 are both 8 wide,
    and ``R`` and ``P`` split nothing).  It reads a spec only through what one device holds: local bytes
    (``nbytes / _shards``: the product of the sizes of the axes that shard some dim), local shapes
    (``_local_shape``: per dim, ceiling divisions by those axes' sizes, which compose to one by their
    product), the mask's shards and which dims are split at all (``rows_split``, attention); and
    ``work_divisor``.  Per spec, each sharded dim and the product of the sizes of the axes on it (a dim split
    on an axis of size 1 is still listed) determine every one of those, so equal keys give the same floats
    (``tests/problem/test_shared.py`` prices every strategy alone against the shared arrays)."""
    outputs = tuple(_split(s, mesh) for s in strategy.outputs)
    return (strategy.work_divisor, tuple(_split(s, mesh) for s in strategy.inputs), *outputs)


@functools.lru_cache(maxsize=8192)
def _split(spec: ShardingSpec | None, mesh: tuple[int, ...]) -> tuple[tuple[int, int], ...] | None:
    """Per dim some mesh axis shards, the product of those axes' sizes (:func:`compute_key`)."""
    if spec is None:
        return None
    dims: dict[int, int] = {}
    for p, n in zip(spec.placements, mesh, strict=True):
        if isinstance(p, Shard):
            dims[p.dim] = dims.get(p.dim, 1) * n
    return tuple(sorted(dims.items()))


def memory_key(strategy: OpStrategy, mesh: tuple[int, ...]) -> object:
    """All :func:`~autoshard.problem.costs.node_memory` and :func:`~autoshard.problem.costs.optimizer_time`
    read of a strategy: its first output spec, only through ``_local_bytes`` (``nbytes / _shards``, or the
    bytes whole for no spec), so the sharded dims and their axes' products (:func:`compute_key`) determine
    it; ``()`` for a strategy with no output (70B: 3,706 keys for 9,862 first output specs)."""
    return _split(strategy.outputs[0], mesh) if strategy.outputs else ()
