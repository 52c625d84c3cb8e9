"""Fuse a grouped-GEMM expert MLP into one node, so expert parallelism keeps it whole on the expert's device.

transformers (5.x, ``experts_implementation="grouped_mm"``) runs the experts of Mixtral, Qwen3-MoE and
DeepSeek-V3 as::

    h = grouped_mm(x_sorted, gate_up_proj.T, offs)     # (T*k, 2I): rows sorted by expert, offs = row ends
    gate, up = h.chunk(2, -1)
    y = grouped_mm(act(gate) * up, down_proj.T, offs)  # (T*k, H)

Split over experts, each device computes the rows routed to its experts and zeros elsewhere; between the two
matmuls those rows are *complete* on their device -- no communication is needed -- but per op the planner
sees a Partial ``h`` feeding a nonlinear activation and must all-reduce it.  :func:`fuse_expert_mlps` replaces
the chain by one call of :func:`expert_mlp`, whose rule (``autoshard.strategies.rules.moe``) offers the
token split, the expert split (expert parallelism: one reduction of ``y`` per MoE layer, Megatron's
all-gather token dispatcher: tokens gathered over the expert axis going in, the Partial output
reduce-scattered or all-reduced coming out) and replication.

When the chain sits in transformers' grouped-GEMM experts forward, :mod:`autoshard.capture.dispatch` then
fuses the routing around it too, which lets expert parallelism dispatch tokens by all-to-all instead.

Reads ``meta["val"]``; the new node takes the second matmul's meta.  ``capture.flops`` prices it as the two
matmuls.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import fx

__all__ = ["GROUPED_MM_NAMES", "expert_mlp", "fuse_expert_mlps", "plan_fuses_experts"]

aten = torch.ops.aten
GROUPED_MM_NAMES = ("transformers::grouped_mm_fallback", "aten::_grouped_mm")


def _grouped(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor, use_aten: bool) -> torch.Tensor:
    if use_aten:
        return aten._grouped_mm.default(x, w, offs)
    return torch.ops.transformers.grouped_mm_fallback.default(x, w, offs)


class _ExpertMLP:
    """``grouped_mm(act(gate) * up, down, offs)`` with ``gate, up = grouped_mm(x, gate_up, offs).chunk(2, -1)``.

    A callable object rather than a function so that the node's target prints the same in every process
    (``autoshard.capture.experts.expert_mlp``, as plan files and reports name it), not with a memory address.
    """

    __name__ = "expert_mlp"
    __qualname__ = "expert_mlp"

    def __call__(
        self,
        x: torch.Tensor,
        gate_up: torch.Tensor,
        down: torch.Tensor,
        offs: torch.Tensor,
        act: Callable[[torch.Tensor], torch.Tensor],
        use_aten: bool,
    ) -> torch.Tensor:
        gate, up = _grouped(x, gate_up, offs, use_aten).chunk(2, -1)
        return _grouped(act(gate) * up, down, offs, use_aten)

    def __repr__(self) -> str:
        return "autoshard.capture.experts.expert_mlp"


expert_mlp = _ExpertMLP()


def _operands(node: fx.Node) -> tuple[object, object, object]:
    """``(x, w, offs)`` of a grouped matmul, whether ``offs`` came by position or by keyword."""
    args = (*node.args, None, None, None)
    return args[0], args[1], node.kwargs.get("offs", args[2])


def _is_grouped(node: object) -> bool:
    if not (
        isinstance(node, fx.Node)
        and node.op == "call_function"
        and isinstance(node.target, torch._ops.OpOverload)
        and node.target._schema.name in GROUPED_MM_NAMES
    ):
        return False
    extra = {k: v for k, v in node.kwargs.items() if k != "offs" and v is not None}
    return isinstance(_operands(node)[2], fx.Node) and not extra and len(node.args) <= 3


def _only_user(node: fx.Node) -> fx.Node | None:
    return next(iter(node.users)) if len(node.users) == 1 else None


def _chain(first: fx.Node) -> tuple[list[fx.Node], fx.Node, Callable[..., torch.Tensor]] | None:
    """``(nodes to drop, second matmul, activation)`` when ``first`` starts the expert chain, else None."""
    chunk = _only_user(first)
    if (
        chunk is None
        or chunk.target is not aten.chunk.default
        or tuple(chunk.args[1:]) not in ((2, -1), (2, 1))
    ):
        return None
    items = list(chunk.users)
    if len(items) != 2 or any(n.target is not operator.getitem for n in items):
        return None
    items.sort(key=lambda n: int(n.args[1]))  # type: ignore[arg-type]  # getitem's index
    gate, up = items
    act = _only_user(gate)
    mul = _only_user(act) if act is not None else None
    if act is None or mul is None or mul.target is not aten.mul.Tensor or set(mul.args) != {act, up}:
        return None
    if len(act.args) != 1 or act.kwargs or _only_user(up) is not mul:
        return None
    second = _only_user(mul)
    if second is None or not _is_grouped(second):
        return None
    if _operands(second)[0] is not mul or _operands(second)[2] is not _operands(first)[2]:
        return None
    target = act.target
    assert callable(target)
    return [mul, act, up, gate, chunk, first], second, target


def fuse_expert_mlps(gm: fx.GraphModule, *, recompile: bool = True) -> fx.GraphModule:
    """Replace each grouped-GEMM expert chain by one :func:`expert_mlp` node (module doc)."""
    graph = gm.graph
    for first in [n for n in graph.nodes if _is_grouped(n)]:
        if first.graph is not graph or not first.users:
            continue
        found = _chain(first)
        if found is None:
            continue
        dead, second, act = found
        x, gate_up, offs = _operands(first)
        down = _operands(second)[1]
        use_aten = first.target is aten._grouped_mm.default
        with graph.inserting_before(second):
            fused = graph.call_function(expert_mlp, (x, gate_up, down, offs, act, use_aten))
        fused.meta = dict(second.meta)
        second.replace_all_uses_with(fused)
        graph.erase_node(second)
        for node in dead:
            graph.erase_node(node)
    graph.lint()
    if recompile:
        gm.recompile()
    return gm


def plan_fuses_experts(nodes: Iterable[Any]) -> bool:
    """Whether a plan (its ``nodes`` rows, each with a ``target``) was made on a graph with fused expert MLPs:
    codegen must capture the model the same way (``capture(..., fuse_experts=...)``)."""
    return any(str(getattr(n, "target", "")).endswith(("expert_mlp", "routed_experts")) for n in nodes)
