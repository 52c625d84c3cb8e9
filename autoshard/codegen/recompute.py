"""Emit the plan's activation recomputation: each repeated block of the emitted graph under
``torch.utils.checkpoint``.

Input: the emitted ``fx.GraphModule`` of one rank (:func:`~autoshard.codegen.lower.lower_graph` tags ops and
moves with ``META_BLOCK``) and ``Plan.recompute``.  Output: the same module, each block's nodes fused into a
submodule (``torch.fx.passes.utils.fuser_utils.fuse_by_partitions``) that runs under
``checkpoint(..., use_reentrant=False)``:

- ``"full"``: nothing inside a block is kept for backward; the block's forward runs again in backward;
- ``"selective"``: torchtitan's op-level selective activation checkpointing: a
  ``create_selective_checkpoint_contexts`` policy that saves the outputs of matmul-like ops (mm, addmm,
  bmm, fused attention, ring attention, grouped mm) and re-runs everything else.

What is inside a block: ops of that block (``META_BLOCK``), moves between block nodes (tagged by lower),
and untagged helpers (parameters, ``getitem``, ``detach``) whose users are all in that block.  Moves of
tensors made outside the blocks stay outside, so they are not re-run -- exactly what
:func:`autoshard.problem.costs.reissued` prices.  The submodules share the root's parameters (same tensor
objects), so gradients and state dicts are unchanged.

Example::

    module = checkpoint_blocks(module, "selective")   # module.fused_0 ... one per layer
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import fx, nn
from torch.fx.passes.utils.fuser_utils import fuse_by_partitions
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from autoshard.codegen import context
from autoshard.codegen.dispatch import META_DISPATCH
from autoshard.codegen.lower import META_BLOCK, META_STEPS, EdgeRecord

__all__ = ["SAVED_OPS", "Checkpointed", "checkpoint_blocks", "selective_policy"]

aten = torch.ops.aten
SAVED_OPS = frozenset(
    op
    for name in (
        "mm", "addmm", "bmm", "baddbmm", "convolution", "_grouped_mm",
        "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_cudnn_attention",
    )
    if (op := getattr(getattr(aten, name, None), "default", None)) is not None
) | {context.ring_op()}  # fmt: skip
"""Ops whose outputs the selective policy keeps (torchtitan's op-level save list, all matmuls saved)."""


def selective_policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    """Keep matmul-like outputs, re-run the rest (``create_selective_checkpoint_contexts`` policy)."""
    return CheckpointPolicy.MUST_SAVE if op in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


class Checkpointed(nn.Module):
    """Runs ``body`` under ``torch.utils.checkpoint`` (non-reentrant), with a selective policy or none."""

    def __init__(self, body: nn.Module, selective: bool) -> None:
        super().__init__()
        self.body = body
        self.selective = selective

    def forward(self, *args: Any) -> Any:
        context: Callable[[], Any] | None = (
            functools.partial(create_selective_checkpoint_contexts, selective_policy)
            if self.selective
            else None
        )
        if context is None:
            return checkpoint(self.body, *args, use_reentrant=False)
        return checkpoint(self.body, *args, use_reentrant=False, context_fn=context)


def _regions(gm: fx.GraphModule) -> dict[int, dict[fx.Node, int | None]]:
    """Block index -> its nodes in graph order (tagged ones, then helpers all of whose users are inside)."""
    region: dict[fx.Node, int | None] = {}
    for node in reversed(list(gm.graph.nodes)):
        if node.op in ("placeholder", "output"):
            region[node] = None
        elif META_BLOCK in node.meta:
            region[node] = node.meta[META_BLOCK]
        else:
            users = {region.get(u) for u in node.users}
            region[node] = users.pop() if len(users) == 1 else None
    out: dict[int, dict[fx.Node, int | None]] = {}
    for node in gm.graph.nodes:
        if region[node] is not None:
            out.setdefault(int(region[node]), {})[node] = None  # type: ignore[arg-type]
    return out


def checkpoint_blocks(gm: fx.GraphModule, policy: str, blocks: int | None = None) -> tuple[EdgeRecord, ...]:
    """Wrap every block of ``gm`` (in place) for ``policy`` ("none", "selective", "full"), or only the first
    ``blocks`` of them (``Plan.recompute_blocks``); returns the moves that backward runs again (their forward
    steps), for the collective count check."""
    if policy == "none":
        return ()
    if policy not in ("selective", "full"):
        raise ValueError(f"recompute policy {policy!r}: use none, selective or full")
    regions = _regions(gm)
    if blocks is not None:  # the first ``blocks`` layers, as priced (problem/mix.py)
        regions = {b: regions[b] for b in sorted(regions)[:blocks]}
    again = tuple(
        EdgeRecord(n.name, "recompute", n.meta[META_STEPS][0], ())
        for nodes in regions.values()
        for n in nodes
        if META_STEPS in n.meta
    ) + tuple(  # all-to-all token dispatch inside a routed-experts node (codegen.dispatch)
        EdgeRecord(n.name, "recompute", n.meta[META_DISPATCH], ())
        for nodes in regions.values()
        for n in nodes
        if n.meta.get(META_DISPATCH)
    )
    names = [f"block_{b}" for b in sorted(regions)]
    fuse_by_partitions(gm, [regions[b] for b in sorted(regions)], prefix="autoshard_block_")
    for k, name in enumerate(names):
        fused = f"autoshard_block_{k}"
        body = getattr(gm, fused)
        delattr(gm, fused)
        gm.add_submodule(name, Checkpointed(body, selective=policy == "selective"))
        for node in gm.graph.nodes:
            if node.op == "call_module" and node.target == fused:
                node.target = name
    gm.recompile()
    return again
