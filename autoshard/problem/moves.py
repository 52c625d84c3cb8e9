"""Redistribution on an edge: which steps turn the producer's spec into the consumer's, forward and backward.

Input: a producer :class:`~autoshard.problem.graph.NodeInfo`, the two strategies of an edge and
:class:`~autoshard.problem.costs.CostOptions`.  Output: :class:`EdgeSteps` (the steps of
:mod:`autoshard.redistribute`) and their seconds; :class:`StepCache` memoises plans and times per
(src, dst, shape, itemsize).  Split from :mod:`autoshard.problem.costs` along the seam between what a node
costs on its own (compute, memory, optimizer: there) and what moving a tensor between two nodes costs (here).

The backward of an edge ``u → v`` redistributes the gradient ``v``'s strategy yields
(``OpStrategy.input_grads``) to the dual of ``u``'s output spec (:func:`dual_spec`: ``S(d) → S(d)``,
``P → R``, ``R → R``); a model output left ``Partial`` is reduced before it is returned
(:func:`output_fix_steps`).  Both move the tensor at the bytes per element
:func:`~autoshard.problem.autocast.moved_itemsize` gives (under amp, its producer's autocast dtype; a
parameter's gather and its gradient's reduction in the recipe's gather and reduce dtypes).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from autoshard.cluster import Cluster
from autoshard.errors import AutoshardError
from autoshard.placement import Partial, Replicate, ShardingSpec
from autoshard.problem.autocast import moved_itemsize
from autoshard.problem.graph import NodeInfo
from autoshard.problem.pricing import PriceTable
from autoshard.redistribute import Step, plan_redistribute, redistribute_time
from autoshard.strategies import OpStrategy

if TYPE_CHECKING:
    from autoshard.problem.costs import CostOptions
    from cost_models.memory import PrecisionPolicy

__all__ = [
    "COLLECTIVE_KINDS",
    "EdgeSteps",
    "StepCache",
    "dual_spec",
    "edge_steps",
    "output_fix_steps",
    "steps_time",
]


@functools.lru_cache(maxsize=4096)
def dual_spec(spec: ShardingSpec) -> ShardingSpec:
    """The spec a tensor's gradient must reach: shards stay, ``P`` becomes ``R``, ``R`` stays ``R``."""
    return ShardingSpec(tuple(Replicate() if isinstance(p, Partial) else p for p in spec.placements))


@dataclass(frozen=True, slots=True)
class EdgeSteps:
    """The redistribution an edge needs under one (producer, consumer) strategy pair."""

    forward: tuple[Step, ...]
    backward: tuple[Step, ...]
    feasible: bool = True


_INFEASIBLE = EdgeSteps((), (), feasible=False)


class StepCache:
    """Memoised redistribution plans and their times, keyed by (src, dst, shape, itemsize).

    Specs are interned to small integers once, so the hot loop of the cost builder hashes ints, not
    placement objects; many edges of a transformer share shapes and spec pairs and so share entries.
    """

    def __init__(self, cluster: Cluster, specs: StepCache | None = None) -> None:
        """``specs``: a cache whose spec ids this one shares (a zigzag cluster's with its plain cluster's, so
        the build caches' entries that hold ids mean the same specs: problem/shared.py)."""
        self.cluster = cluster
        self.mesh_shape = cluster.mesh_shape
        self._ids: dict[ShardingSpec, int] = {} if specs is None else specs._ids
        self._specs: list[ShardingSpec] = [] if specs is None else specs._specs
        # id(spec) -> (spec, its id): the builders intern the same spec objects ~10^5 times per plan, and a
        # spec equal to a key but not that key object costs a comparison of torch's placements (~1-5 us);
        # the spec is held, so its id() cannot be reused while it is a key here
        self._by_object: dict[int, tuple[ShardingSpec, int]] = {} if specs is None else specs._by_object
        self._steps: dict[tuple, tuple[Step, ...] | None] = {}
        self._times: dict[tuple, float] = {}
        self.prices = PriceTable.for_cluster(cluster)  # whole edge matrices at once (the builder's hot path)

    def spec(self, spec_id: int) -> ShardingSpec | None:
        """The spec an :meth:`intern` id names (None for -1)."""
        return None if spec_id < 0 else self._specs[spec_id]

    def intern(self, spec: ShardingSpec | None) -> int:
        """A small integer naming ``spec`` (-1 for None)."""
        if spec is None:
            return -1
        seen = self._by_object.get(id(spec))
        if seen is not None and seen[0] is spec:
            return seen[1]
        found = self._ids.get(spec)
        if found is None:
            found = self._ids[spec] = len(self._specs)
            self._specs.append(spec)
        self._by_object[id(spec)] = (spec, found)
        return found

    def get(self, src: ShardingSpec, dst: ShardingSpec, shape: tuple[int, ...], itemsize: int):
        """The steps turning ``src`` into ``dst``, or None when no plan exists (the pair is forbidden)."""
        key = (self.intern(src), self.intern(dst), shape, itemsize)
        if key not in self._steps:
            try:
                # priced with the cluster: the cheapest path differs from the fewest bytes on mixed links
                self._steps[key] = plan_redistribute(
                    src, dst, shape, itemsize, self.mesh_shape, cluster=self.cluster
                )
            except AutoshardError:
                self._steps[key] = None
        return self._steps[key]

    def time(self, src_id: int, dst_id: int, shape: tuple[int, ...], itemsize: int) -> float:
        """Seconds of the redistribution between two interned specs; inf when impossible, 0 for None."""
        if src_id < 0 or dst_id < 0:
            return 0.0
        key = (src_id, dst_id, shape, itemsize)
        found = self._times.get(key)
        if found is None:
            try:
                found = redistribute_time(
                    self._specs[src_id], self._specs[dst_id], shape, itemsize, self.cluster
                )
            except AutoshardError:
                found = math.inf  # this conversion cannot be done: the pair is forbidden
            self._times[key] = found
        return found


def edge_steps(
    producer: NodeInfo,
    which: int,
    src: OpStrategy,
    dst: OpStrategy,
    position: int,
    opts: CostOptions,
    cache: StepCache,
) -> EdgeSteps:
    """Forward and backward redistribution on the edge ``producer → consumer`` (consumer input ``position``)."""
    meta = producer.outputs[which] if which < len(producer.outputs) else None
    have = src.outputs[which] if which < len(src.outputs) else None
    want = dst.inputs[position]
    if meta is None or have is None or want is None:
        return EdgeSteps((), ())
    size = moved_itemsize(producer, which, opts.precision)
    fwd = cache.get(have, want, meta.shape, size)
    if fwd is None:
        return _INFEASIBLE
    if not (opts.training and producer.requires_grad):
        return EdgeSteps(fwd, ())
    grad = dst.input_grads[position]
    if grad is None:
        return EdgeSteps(fwd, ())
    back = moved_itemsize(producer, which, opts.precision, gradient=True)
    bwd = cache.get(grad, dual_spec(have), meta.shape, back)
    if bwd is None:
        return _INFEASIBLE
    return EdgeSteps(fwd, bwd)


def output_fix_steps(
    info: NodeInfo, strategy: OpStrategy, cache: StepCache, precision: PrecisionPolicy | None = None
) -> tuple[Step, ...]:
    """A model output left ``Partial`` is reduced before it is returned (``P → R`` on those axes), at the
    bytes ``precision`` (``CostOptions.precision``) moves it in."""
    fixed: list[Step] = []
    for which, (meta, spec) in enumerate(zip(info.outputs, strategy.outputs, strict=False)):
        if meta is None or spec is None or not spec.partial_axes():
            continue
        target = dual_spec(spec)
        steps = cache.get(spec, target, meta.shape, moved_itemsize(info, which, precision))
        fixed.extend(steps or ())
    return tuple(fixed)


COLLECTIVE_KINDS = frozenset({"all_gather", "all_reduce", "reduce_scatter", "all_to_all"})


def steps_time(steps: tuple[Step, ...], cluster: Cluster) -> float:
    """Seconds of a step list; local steps (slices, zeroing) are free."""
    return math.fsum(
        cluster.collective_time(s.kind, s.nbytes, axis=s.mesh_axis)
        for s in steps
        if s.kind in COLLECTIVE_KINDS
    )
