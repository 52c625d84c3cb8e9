"""Recomputation's extra costs that sit on edges and on memory (the per-node compute is in ``costs``).

Input: :class:`~autoshard.problem.graph.NodeInfo` records, a strategy, :class:`~autoshard.problem.costs.
CostOptions` whose ``recompute`` is the policy under which the problem is built.  Output: whether a forward
move is re-issued in backward, and a node's memory including the recompute working set.  The builder
(``build``), the plan reader (``extract``) and the fan-out pricing (``fanout``) call the same two functions,
and codegen (:mod:`autoshard.codegen.recompute`) emits what they price.
"""

from __future__ import annotations

from autoshard.cluster import Cluster
from autoshard.problem.costs import CostOptions, Recompute, node_memory
from autoshard.problem.graph import NodeInfo
from autoshard.strategies import OpStrategy

__all__ = ["node_memory_total", "reissued"]


def reissued(producer: NodeInfo, consumer: NodeInfo, opts: CostOptions) -> bool:
    """Whether backward re-runs the move ``producer -> consumer``: the recomputed region is a whole block, and
    a move between block nodes is inside it (codegen/recompute.py leaves moves from outside out of it)."""
    training = opts.training and opts.recompute is not Recompute.NONE
    return training and producer.block is not None and consumer.block is not None


def node_memory_total(
    info: NodeInfo, strategy: OpStrategy, cluster: Cluster, opts: CostOptions, keeps: bool, count: int
) -> float:
    """Bytes per device of ``count`` copies, plus the recompute working set (one block's re-run activations).

    With ``opts.recompute_share < 1`` only that share of the copies drops what recomputation re-runs; the
    other blocks keep it."""
    total = node_memory(info, strategy, cluster, opts, keeps) * count
    if not keeps and info.block is not None and opts.recompute is not Recompute.NONE:
        dropped = node_memory(info, strategy, cluster, opts, False)
        kept = node_memory(info, strategy, cluster, opts, True)
        total += (kept - dropped) * count * (1.0 - opts.recompute_share)  # the blocks not recomputed
        total += kept  # the working set
    return total
