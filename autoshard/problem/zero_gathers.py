"""ZeRO-1's all-gathers of updated optimizer shards that no gradient all-reduce already pays for.

Input: a :class:`~autoshard.problem.build.BuiltProblem` and every node's chosen strategy.  Output:
:func:`zero_gathers`, the collectives ``Plan.optimizer_gathers`` lists (phase ``optimizer``), which the
plan's step pays (:mod:`autoshard.problem.extract`) and the report names beside the sharded state.  The
solver prices the same seconds from the same helpers (:mod:`autoshard.problem.zero_terms`), so the
objective holds them too.

Why: with ``CostOptions.shard_optimizer`` (the default) a parameter's Adam state is split over every mesh axis
on which the parameter is replicated (``problem.costs``: memory and update time at ``numel / devices``), and
the runtime (:class:`~autoshard.runtime.zero.ZeroOptimizer`) all-gathers the updated chunks over those axes
after the update.  On an axis where the gradient arrives ``Partial`` that gather is half of the all-reduce the
parameter's edge already pays (reduce-scatter + all-gather).  On an axis where the gradient arrives
replicated -- every device of the axis computed the whole gradient: a fully replicated plan, a norm weight
beside tensor parallelism -- the runtime slices the gradient instead of reducing it, and the gather is a
collective of its own, which these records price.

Which axes are reduced is a property of all the parameter's uses together: the runtime
(:func:`autoshard.runtime.grad_sync.defer_gradient_sync`) leaves the gradient ``Partial`` on an axis -- and
ZeRO reduce-scatters it there -- only when *every* use's gradient is ``Partial`` on it (:func:`reduced_axes`);
one use that yields a replicated gradient keeps the other uses' all-reduces and the axis is gathered.

The gather runs once per step after backward, outside any overlap.  Over the replicated axes, innermost
first, as the runtime gathers (:meth:`~autoshard.runtime.zero.FlatShard.gather`), each axis multiplies the
piece by its size; the piece starts at the ZeRO chunk (the local piece over every replicated axis) and the
buffer priced is the gathered one (:meth:`~autoshard.cluster.Cluster.collective_time`'s convention).  The
gather on an axis so has the same size whether or not the axes inside it are reduced (:func:`gather_pieces`),
which is what makes its price a sum of per-axis terms.  Prices are the plain cluster's (a zigzag layout
reorders the sequence, not a flat optimizer chunk).

Example::

    for c in zero_gathers(built, pick):
        print(c)            # "optimizer all_gather(axis=0, 8.0 MiB) for p_fc1_weight"
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from autoshard.placement import Partial, Replicate, Shard, ShardingSpec
from autoshard.plans import Collective
from autoshard.problem.context import plain_cluster
from autoshard.problem.graph import NodeInfo
from autoshard.strategies import OpStrategy

if TYPE_CHECKING:  # build imports the solver terms, which import this module's helpers
    from autoshard.problem.build import BuiltProblem

__all__ = ["gather_pieces", "param_uses", "partial_axes", "reduced_axes", "trainable", "zero_gathers"]


def trainable(info: NodeInfo) -> bool:
    """Whether ZeRO-1 steps this node: a parameter that needs a gradient and holds a tensor."""
    return (
        info.kind == "parameter" and info.requires_grad and bool(info.outputs) and info.outputs[0] is not None
    )


def gather_pieces(
    nbytes: float, spec: ShardingSpec | None, mesh: Sequence[int]
) -> tuple[tuple[int, float], ...]:
    """``(axis, gathered bytes)`` of every all-gather ZeRO-1 runs for a parameter of ``nbytes`` stored under
    ``spec``: one per replicated axis of size > 1, innermost first (module docstring)."""
    if spec is None:
        return ()
    replicated = [a for a, p in enumerate(spec.placements) if isinstance(p, Replicate) and mesh[a] > 1]
    split = math.prod(mesh[a] for a, p in enumerate(spec.placements) if isinstance(p, Shard))
    piece = nbytes / split / math.prod(mesh[a] for a in replicated)  # this device's ZeRO chunk
    out = []
    for axis in reversed(replicated):
        piece *= mesh[axis]
        out.append((axis, piece))
    return tuple(out)


def partial_axes(grad: ShardingSpec | None) -> frozenset[int]:
    """Mesh axes on which a use's gradient of the parameter arrives ``Partial`` (its edge reduces there)."""
    if grad is None:
        return frozenset()
    return frozenset(a for a, p in enumerate(grad.placements) if isinstance(p, Partial))


def param_uses(uses: Iterable, template: Mapping[str, str], infos: Mapping[str, NodeInfo]) -> dict[str, list]:
    """Per trainable parameter variable, its distinct uses ``(template consumer, input position)``."""
    out: dict[str, list[tuple[str, int]]] = {}
    for use in uses:
        tu, tv = template[use.producer], template[use.consumer]
        if tu == tv or not trainable(infos[tu]):
            continue
        entry = out.setdefault(tu, [])
        if (tv, use.position) not in entry:
            entry.append((tv, use.position))
    return out


def reduced_axes(grads: Iterable[ShardingSpec | None]) -> frozenset[int]:
    """Axes every use reduces (module docstring): the intersection of their ``Partial`` axes; none without
    a use."""
    sets = [partial_axes(g) for g in grads]
    return frozenset.intersection(*sets) if sets else frozenset()


def zero_gathers(
    built: BuiltProblem,
    pick: Mapping[str, OpStrategy],
    module: Callable[[str, int | None], str] | None = None,
) -> tuple[Collective, ...]:
    """One all-gather per parameter (per layer of a repeated block, per block of a further run) and mesh axis
    on which the parameter is replicated and its gradient is not reduced (module docstring); ``()`` without
    training or without ``shard_optimizer``.  ``module(fqn, layer)``: a layer's own path (the plan's
    :class:`~autoshard.problem.layers.LayerNamer`), else the shared node's."""
    opts = built.options
    if not (opts.training and opts.shard_optimizer):
        return ()
    mesh = tuple(built.cluster.mesh_shape)
    cluster = plain_cluster(built.cluster)
    uses = param_uses(built.edges, built.template, built.infos)
    out: list[Collective] = []
    for name, info in built.infos.items():
        # the variables and every block of a further run (its own parameters, its block 0's decision)
        if not trainable(info) or not (built.template[name] == name or name in built.runs):
            continue
        meta = info.outputs[0]
        assert meta is not None
        reduced = reduced_axes(pick[c].input_grads[pos] for c, pos in uses.get(built.template[name], ()))
        count = 1 if name in built.runs else built.multiplicity.get(name, 1)
        layers: Sequence[int | None] = range(count) if count > 1 else (None,)
        for axis, piece in gather_pieces(meta.nbytes, pick[name].outputs[0], mesh):
            if axis in reduced:
                continue
            seconds = cluster.collective_time("all_gather", piece, axis=axis)
            out += [
                Collective(
                    "all_gather",
                    int(piece),
                    "optimizer",
                    axis,
                    name,
                    name,
                    info.fqn if module is None else module(info.fqn, layer),
                    seconds,
                    layer,
                )
                for layer in layers
            ]
    return tuple(out)
