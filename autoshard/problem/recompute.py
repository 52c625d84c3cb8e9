"""Recomputation's extra costs that sit on edges and on memory (the per-node compute is in ``costs``).

Input: :class:`~autoshard.problem.graph.NodeInfo` records, a strategy, :class:`~autoshard.problem.costs.
CostOptions` whose ``recompute`` is the policy under which the problem is built.  Output: whether a forward
move is re-issued in backward, and a node's memory including the recompute working set.  The builder
(``build``), the plan reader (``extract``) and the fan-out pricing (``fanout``) call the same two functions,
and codegen (:mod:`autoshard.codegen.recompute`) emits what they price.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from autoshard.cluster import Cluster
from autoshard.problem.costs import CostOptions, Recompute, node_memory
from autoshard.problem.graph import NodeInfo
from autoshard.strategies import OpStrategy

Bytes = float | np.ndarray  # one strategy's, or one per strategy of a node

__all__ = [
    "memory_total",
    "node_memory_total",
    "rebuilds",
    "recompute_blocks",
    "recomputed_layers",
    "regathered",
    "reissued",
    "rerun_share",
]


def reissued(producer: NodeInfo, consumer: NodeInfo, opts: CostOptions) -> bool:
    """Whether backward re-runs the move ``producer -> consumer``: the recomputed region is a whole block, and
    a move between block nodes is inside it (codegen/recompute.py leaves moves from outside out of it).  A
    pipeline stage's input that the previous layer made (``NodeInfo.after_block``) counts as a block node, so
    a stage re-runs the moves into its first layer as the whole model does between layers."""
    training = opts.training and opts.recompute is not Recompute.NONE
    inside = producer.block is not None or producer.after_block
    return training and inside and consumer.block is not None


def regathered(producer: NodeInfo, consumer: NodeInfo, opts: CostOptions) -> bool:
    """Whether backward gathers a parameter again (FSDP's reshard after forward,
    ``OverlapPolicy.reshard_after_forward``; run by :mod:`autoshard.runtime.reshard`): the forward move of a
    parameter is re-run in backward unless a recomputed block re-issues it anyway (:func:`reissued`).  Only
    moves that gather cost anything: a weight read in its own layout or sliced moves nothing."""
    return (
        opts.training
        and opts.overlap.reshard_after_forward
        and producer.kind == "parameter"
        and producer.requires_grad
        and not reissued(producer, consumer, opts)
    )


def rerun_share(producer: NodeInfo, consumer: NodeInfo, opts: CostOptions) -> float:
    """Share of a move's layer copies whose forward backward runs again: the recomputed blocks re-issue it
    (``recompute_share`` of them), and under FSDP's reshard after forward the other blocks re-gather it."""
    if reissued(producer, consumer, opts):
        rest = regathered(producer, consumer, replace(opts, recompute=Recompute.NONE))
        return 1.0 if rest else opts.recompute_share
    return 1.0 if regathered(producer, consumer, opts) else 0.0


def node_memory_total(
    info: NodeInfo, strategy: OpStrategy, cluster: Cluster, opts: CostOptions, keeps: bool, count: int
) -> float:
    """Bytes per device of ``count`` copies, plus the recompute working set (one block's re-run activations:
    ``kept - dropped``, so none for a parameter, whose state is held either way).

    With ``opts.recompute_share < 1`` only that share of the copies drops what recomputation re-runs; the
    other blocks keep it."""
    kept = node_memory(info, strategy, cluster, opts, True)
    dropped = kept if keeps else node_memory(info, strategy, cluster, opts, False)
    return float(memory_total(info, kept, dropped, opts, keeps, count))


def memory_total(
    info: NodeInfo, kept: Bytes, dropped: Bytes, opts: CostOptions, keeps: bool, count: int
) -> Bytes:
    """:func:`node_memory_total` from ``node_memory`` with and without keeping the output: floats for one
    strategy or arrays over a node's strategies alike (the builder composes every policy from them)."""
    total = (kept if keeps else dropped) * count
    if rebuilds(info, opts, keeps):
        total = total + (kept - dropped) * count * (1.0 - opts.recompute_share)  # the blocks not recomputed
        # the working set: what re-running one block re-materialises, the output it did not keep (a
        # parameter's state is held whether or not the block recomputes: kept == dropped, nothing)
        total = total + (kept - dropped)
    return total


def rebuilds(info: NodeInfo, opts: CostOptions, keeps: bool) -> bool:
    """Whether backward re-runs a node to rebuild an output it did not keep: a block's node under
    recomputation (its working set, ``kept - dropped``, counts once: :func:`memory_total`)."""
    return not keeps and info.block is not None and opts.recompute is not Recompute.NONE


def recompute_blocks(opts: CostOptions, num_blocks: int) -> int | None:
    """How many of the repeated blocks ``Plan.recompute`` applies to (the first ones); None when all."""
    return None if opts.recompute_share >= 1.0 else round(opts.recompute_share * num_blocks)


def recomputed_layers(layers: list, opts: CostOptions, num_blocks: int) -> list:
    """The ``(layer, path)`` pairs backward recomputes: all, or the first ``k`` under a share (problem/mix)."""
    k = recompute_blocks(opts, num_blocks)
    return (
        layers if k is None else [(layer, path) for layer, path in layers if layer is not None and layer < k]
    )
