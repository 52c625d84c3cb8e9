"""ZeRO-1's all-gathers of updated optimizer shards that no gradient all-reduce already pays for.

Input: a :class:`~autoshard.problem.build.BuiltProblem`, every node's chosen strategy and the plan's
collectives (:mod:`autoshard.problem.extract`).  Output: :func:`zero_gathers`, the collectives
``Plan.optimizer_gathers`` lists (phase ``optimizer``), which the report names beside the sharded state.

Why: with ``CostOptions.shard_optimizer`` (the default) a parameter's Adam state is split over every mesh axis
on which the parameter is replicated (``problem.costs``: memory and update time at ``numel / devices``), and
the runtime (:class:`~autoshard.runtime.zero.ZeroOptimizer`) all-gathers the updated chunks over those axes
after the update.  On an axis where the gradient arrives ``Partial`` that gather is half of the all-reduce the
parameter's edge already pays (reduce-scatter + all-gather).  On an axis where the gradient arrives
replicated -- every device of the axis computed the whole gradient: a fully replicated plan, a norm weight
beside tensor parallelism -- the runtime slices the gradient instead of reducing it, and the gather is priced
nowhere: a replicated plan claimed sharded optimizer state with no collective at all (new-user trial).

Known gap, not closed here: the solver's objective (and so the plan's step, which equals it) does not hold
these seconds.  Pricing them needs the parameter's edges to know whether any consumer yields a ``Partial``
gradient on the axis (a property of all its consumers together, fan-out groups included), or the runtime to
leave the state whole on such axes, which the node's memory then has to know.  Until then they are listed and
timed, and the report says they are not in the step.

The gather runs once per step after backward, outside any overlap.  On the unreduced axes, innermost first,
each axis multiplies the gathered piece by its size; the piece starts at the ZeRO chunk (the local piece over
every replicated axis) and the buffer priced is the gathered one
(:meth:`~autoshard.cluster.Cluster.collective_time`'s convention).

Example::

    for c in zero_gathers(built, pick, collectives):
        print(c)            # "optimizer all_gather(axis=0, 8.0 MiB) for p_fc1_weight"
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from autoshard.placement import Replicate
from autoshard.plans import Collective
from autoshard.problem.build import BuiltProblem
from autoshard.strategies import OpStrategy

__all__ = ["zero_gathers"]

_REDUCING = frozenset({"all_reduce", "reduce_scatter"})


def zero_gathers(
    built: BuiltProblem, pick: Mapping[str, OpStrategy], collectives: Sequence[Collective]
) -> tuple[Collective, ...]:
    """One all-gather per parameter (per layer of a repeated block) and mesh axis on which the parameter is
    replicated and its gradient is not reduced (module docstring); ``()`` without training or without
    ``shard_optimizer``."""
    opts = built.options
    if not (opts.training and opts.shard_optimizer):
        return ()
    mesh = tuple(built.cluster.mesh_shape)
    reduced: dict[str, set[int]] = {}
    for c in collectives:
        if c.phase == "backward" and c.kind in _REDUCING:
            reduced.setdefault(c.tensor, set()).add(c.mesh_axis)
    out: list[Collective] = []
    for name, info in built.infos.items():
        meta = info.outputs[0] if info.outputs else None
        if info.kind != "parameter" or not info.requires_grad or meta is None or built.template[name] != name:
            continue
        spec = pick[name].outputs[0]
        if spec is None:
            continue
        replicated = [a for a, p in enumerate(spec.placements) if isinstance(p, Replicate) and mesh[a] > 1]
        split = math.prod(mesh[a] for a, p in enumerate(spec.placements) if not isinstance(p, Replicate))
        unreduced = [a for a in replicated if a not in reduced.get(name, set())]
        if not unreduced:
            continue
        piece = meta.nbytes / split / math.prod(mesh[a] for a in replicated)  # this device's ZeRO chunk
        count = built.multiplicity.get(name, 1)
        layers: Sequence[int | None] = range(count) if count > 1 else (None,)
        for axis in sorted(unreduced, reverse=True):  # innermost first
            piece *= mesh[axis]
            seconds = built.cluster.collective_time("all_gather", piece, axis=axis)
            out += [
                Collective("all_gather", int(piece), "optimizer", axis, name, name, info.fqn, seconds, layer)
                for layer in layers
            ]
    return tuple(out)
