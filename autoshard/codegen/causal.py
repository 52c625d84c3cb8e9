"""Run attention over a mask proven causal as ``is_causal``, and drop the mask's construction once dead.

Hugging Face models build an explicit ``(B, 1, S, S)`` boolean mask in the graph and hand it to
``scaled_dot_product_attention``; an SDPA kernel given a mask computes the whole ``S × S`` square (on an H100
the emitted program's attention took 8.2 ms against eager's 4.2: benchmarks/results/gpu_h100_2026-11-24.md).
Where :mod:`autoshard.capture.causal` proved the mask causal (``META_CAUSAL_MASK``) and the strategy leaves
the query rows whole (:func:`autoshard.problem.attention.runs_causal`: replicated, batch or head splits),
:func:`causal_call` emits ``scaled_dot_product_attention(q, k, v, is_causal=True)`` without it, which is
what the plan priced.  Split query rows keep the mask (each piece needs its rows); a ring is
:func:`autoshard.codegen.context.context_sdpa`'s.

:func:`drop_dead` then removes what only built the mask: nodes with no users that are pure ATen ops,
``getitem``s, or ``redistribute`` nodes that run no collective (slices and copies).  A node that talks to
other ranks, draws random numbers or writes memory is kept, dead or not, so every rank still issues the
collectives the plan lists (:func:`autoshard.codegen.parallelize._check_collectives`) and the random stream
stays eager's.

Meta keys: reads ``META_CAUSAL_MASK`` (captured SDPA nodes) and ``META_STEPS`` (emitted ``redistribute``
nodes).

Example::

    lowered = lower_graph(cap, strategies, cluster, coord=(0,))   # calls both
    "is_causal = True" in lowered.graph.python_code("self").src     # a head-split HF LLaMA
"""

from __future__ import annotations

import dataclasses
import operator
from typing import TYPE_CHECKING

import torch
from torch import fx

from autoshard.capture.meta import META_CAUSAL_MASK
from autoshard.problem.attention import runs_causal
from autoshard.strategies.local import LocalCall, LocalContext, bind
from autoshard.strategies.strategy import tensor_meta

if TYPE_CHECKING:
    from autoshard.codegen.lower import LoweredGraph

__all__ = ["causal_call", "drop_dead"]

aten = torch.ops.aten


def causal_call(ctx: LocalContext) -> LocalCall | None:
    """``scaled_dot_product_attention(q, k, v, is_causal=True)`` on the local pieces where the node's mask is
    proven causal and its strategy runs it causal without a ring; None otherwise (run the node as given)."""
    node = ctx.node
    if not node.meta.get(META_CAUSAL_MASK):
        return None
    given = bind(node.target, node.args, node.kwargs)
    operands = [(ctx.input_spec(given[n]), _rank(given[n])) for n in ("query", "key", "value")]
    if not runs_causal(True, ctx.output_spec(), _rank(node), operands):
        return None
    local = ctx.bound()
    kwargs = {"is_causal": True, "scale": local["scale"], "enable_gqa": local["enable_gqa"]}
    return LocalCall(
        aten.scaled_dot_product_attention.default, (local["query"], local["key"], local["value"]), kwargs
    )


def _rank(node: object) -> int:
    meta = tensor_meta(node) if isinstance(node, fx.Node) else None
    return 0 if meta is None else len(meta.shape)


def drop_dead(lowered: LoweredGraph) -> LoweredGraph:
    """``lowered`` without its dead pure nodes (module doc), and without the records of the collective-free
    ``redistribute`` nodes it dropped."""
    from autoshard.codegen.collectives import redistribute
    from autoshard.codegen.lower import META_STEPS

    graph, dropped, erased = lowered.graph, set(), 0
    for node in reversed(list(graph.nodes)):  # consumers first: a chain goes in one pass
        if node.op != "call_function" or node.users:
            continue
        if node.target is redistribute:
            steps = node.meta.get(META_STEPS, ((), ()))
            if any(s.is_collective for phase in steps for s in phase):
                continue
            dropped.add(node.name)
        elif not _pure(node):
            continue
        graph.erase_node(node)
        erased += 1
    if erased:
        graph.lint()
    edges = tuple(e for e in lowered.edges if f"{e.producer}_to_{e.consumer}" not in dropped)
    return dataclasses.replace(lowered, edges=edges)


def _pure(node: fx.Node) -> bool:
    """An ATen op that writes nothing and draws no random numbers, or a ``getitem``."""
    if node.target is operator.getitem:
        return True
    if not isinstance(node.target, torch._ops.OpOverload):
        return False
    tags = node.target.tags
    return not node.target._schema.is_mutable and torch.Tag.nondeterministic_seeded not in tags
