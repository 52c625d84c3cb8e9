"""Op coverage of a captured model: every op kind, how often it runs, its share of the FLOPs, its rule.

Input: a :class:`~autoshard.capture.Captured` (``META_FLOPS`` and ``META_BLOCK`` set by capture).  Output: one
:class:`OpCoverage` per op kind, largest FLOPs first, and :func:`replicated_shares` -- the share of the
forward FLOPs that runs replicated on every device because its op has no rule (the replicate-only
fallback).  Nodes of repeated blocks count once per block of the model, not once per captured block, so the
shares are the whole model's even when capture cut the stack to two blocks.

The planner records :func:`replicated_shares` in ``Plan.replicated_ops`` and warns with it; ``autoshard ops
MODEL`` prints :func:`op_coverage`.

Example::

    for row in op_coverage(capture(model, args)):
        print(row)      # "aten.linear.default  x14  91.2%  rule strategies.rules.matmul.linear"
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from torch import fx

from autoshard.capture.meta import META_BLOCK, META_CAUSAL_MASK, META_FLOPS, Captured
from autoshard.strategies.registry import _is_scalar_node, lookup
from cost_models.compute import causal_share

__all__ = ["FALLBACK", "OpCoverage", "op_coverage", "replicated_shares"]

FALLBACK = "fallback: replicated"


@dataclass(frozen=True, slots=True)
class OpCoverage:
    """One op kind of a model: ``count`` nodes, ``flops`` forward FLOPs (all blocks), their ``share`` of the
    model's forward FLOPs, and the rule that shards it (or :data:`FALLBACK`)."""

    op: str
    count: int
    flops: int
    share: float
    rule: str

    @property
    def replicated(self) -> bool:
        return self.rule == FALLBACK

    def __str__(self) -> str:
        return f"{self.op:<48} x{self.count:<5} {self.share:>7.2%}  {self.rule}"


def _rule_name(node: object) -> str:
    entry = lookup(node.target)  # type: ignore[attr-defined]
    if entry is not None:
        return entry.name.removeprefix("autoshard.")
    return FALLBACK


def op_coverage(captured: Captured, *, causal: bool = False) -> tuple[OpCoverage, ...]:
    """Every op kind of ``captured`` with count, FLOPs, FLOPs share and rule (largest FLOPs first).

    ``causal``: an attention whose explicit mask capture proved causal counts the triangle it runs with its
    query rows whole, as the planner prices it (:mod:`autoshard.problem.attention`), not the full square."""
    blocks = captured.blocks
    weight = blocks.num_blocks / blocks.captured_blocks if blocks is not None else 1.0
    counts: dict[str, float] = defaultdict(float)
    flops: dict[str, float] = defaultdict(float)
    rules: dict[str, str] = {}
    for node in captured.graph_module.graph.nodes:
        if node.op != "call_function" or _is_scalar_node(node):
            continue
        op = str(node.target)
        w = weight if node.meta.get(META_BLOCK) is not None else 1.0
        counts[op] += w
        flops[op] += w * _flops(node, causal)
        rules[op] = _rule_name(node)
    total = sum(flops.values()) or 1.0
    rows = [
        OpCoverage(op, round(counts[op]), round(flops[op]), flops[op] / total, rules[op]) for op in counts
    ]
    return tuple(sorted(rows, key=lambda r: (-r.flops, -r.count, r.op)))


def _flops(node: fx.Node, causal: bool) -> float:
    """The node's counted forward FLOPs, at the causal triangle's share where asked and proven causal."""
    flops = int(node.meta.get(META_FLOPS, 0) or 0)
    if not causal or not node.meta.get(META_CAUSAL_MASK):
        return flops
    q, k = (getattr(a, "meta", {}).get("val") for a in node.args[:2])
    if q is None or k is None or q.dim() < 2 or k.dim() < 2:
        return flops
    return flops * causal_share(int(q.shape[-2]), int(k.shape[-2]))


def replicated_shares(captured: Captured) -> dict[str, float]:
    """Op kind -> share of the forward FLOPs it runs replicated (ops without a rule only)."""
    return {r.op: r.share for r in op_coverage(captured) if r.replicated}
