"""The K/V transfers of context parallelism, as a plan lists them (``Plan.ring_transfers``).

Input: a :class:`~autoshard.problem.build.BuiltProblem` and the chosen strategy of every decision node.
Output: one :class:`~autoshard.plans.RingTransfer` per ring-attention node and pass (forward, backward), in
the terms :func:`autoshard.problem.context.ring_seconds` prices them:

- forward: ``n - 1`` hops per device of its local K and V blocks on an axis of ``n`` devices, together the
  time of a ring all-gather of ``n`` such blocks; grouped-query K/V copies travel as one head per run of
  copies, under the amp recipe in autocast's 16-bit dtype (:func:`autoshard.problem.attention.ring_block_bytes`,
  the rule the emitted ring follows);
- backward: ``n`` hops of K, V, dK and dV (the last brings the gradients home), ``n / (n - 1)`` times the
  all-gather of ``2n`` blocks;
- recomputation: a block recomputed in backward (full recomputation re-runs attention) runs its forward hops
  again, listed with the forward's (:func:`autoshard.problem.costs.timed` prices them in the backward).

These are point-to-point sends around the ring, not collectives of the solver's edges: their time overlaps
the attention blocks computed meanwhile, and what compute does not hide is priced in the node's compute
(``Plan.compute_time``), never in ``Plan.communication_time``.  The report lists them beside the collectives
so that every byte the run sends is named; :mod:`autoshard.codegen.context` sends exactly these hops.

Pure: functions of the problem's records and the cluster.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from autoshard.cluster import Cluster
from autoshard.plans import RingTransfer
from autoshard.problem.attention import ring_block_bytes
from autoshard.problem.autocast import ring_itemsize
from autoshard.problem.build import BuiltProblem
from autoshard.problem.context import ring_axis_of
from autoshard.problem.costs import recomputed, repeats
from autoshard.strategies import OpStrategy

__all__ = ["ring_transfers"]


def ring_transfers(
    built: BuiltProblem, chosen: Mapping[str, OpStrategy], names: Iterable[str]
) -> tuple[RingTransfer, ...]:
    """The ring hops of every attention node among ``names`` (the plan's decision nodes) whose strategy
    rings over an axis of more than one device; ``chosen`` maps template nodes to their strategy."""
    cluster, out = built.cluster, []
    for name in names:
        info, strategy = built.infos[name], chosen[built.template[name]]
        axis = ring_axis_of(built.infos, info, strategy)
        if axis is None or cluster.mesh_shape[axis] == 1:
            continue
        n = cluster.mesh_shape[axis]
        k, v = (built.infos[info.inputs[i]].outputs[info.input_outputs[i]] for i in (1, 2))
        if k is None or v is None:
            continue
        opts, blocks = built.options, (1 if name in built.runs else built.multiplicity[name])
        specs = (strategy.inputs[1], strategy.inputs[2])
        block = ring_block_bytes(info, (k, v), specs, cluster.mesh_shape, opts.precision)
        copies = blocks * repeats(opts, parameter=False, backward=False)
        training = opts.training and info.requires_grad
        runs = copies  # forward runs: once, and again in backward where recomputed (the first k blocks)
        if training and recomputed(info, opts.recompute):
            runs += round(blocks * opts.recompute_share) * repeats(opts, parameter=False, backward=False)
        hop = Cluster.collective_time  # the hops reorder nothing (as ring_seconds prices them)
        forward = hop(cluster, "all_gather", n * block, axis)
        size = ring_itemsize(info, k.itemsize, opts.precision)
        out.append(
            RingTransfer("forward", axis, (n - 1) * runs, int(block), name, info.module, forward * runs, size)
        )
        if training:
            backward = n / (n - 1) * hop(cluster, "all_gather", 2 * n * block, axis)
            out.append(
                RingTransfer(
                    "backward", axis, n * copies, int(2 * block), name, info.module, backward * copies, size
                )
            )
    return tuple(out)
