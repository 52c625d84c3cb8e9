"""The routed-experts node (:func:`autoshard.capture.dispatch.routed_experts`): how a MoE layer's tokens reach
its experts.

Operands ``(hidden (T, H), gate_up (E, H, 2I), down (E, I, H), top_k_index (T, k), top_k_weights (T, k))``,
output ``(T, H)``.  Per mesh axis:

- replicate;
- **tokens**: ``hidden``, the routing and the output split by token, every expert on every device;
- **experts, all-gather dispatch** (Megatron's ``allgather`` token dispatcher): the tokens whole on the axis,
  the experts split; each device runs its experts' rows and leaves zeros elsewhere, so the output is Partial
  (gathered tokens in, the Partial reduced out: both priced as redistributions of ``T × H``);
- **experts, all-to-all dispatch** (GShard; Megatron's ``alltoall`` dispatcher): tokens and experts both split;
  each device sends its tokens' rows to their experts' devices and gets the results back
  (:func:`autoshard.codegen.dispatch.all_to_all_routed_experts`), the output stays token-split.  The two
  all-to-alls run inside the node, priced by :mod:`autoshard.problem.dispatch`.  At most one axis dispatches
  this way, and then no other axis splits the experts;
- **FFN dim** inside every expert (``down`` split on its ``I`` dim, the matching gate and up columns taken from
  a whole ``gate_up``): the output is Partial.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import fx

from autoshard.capture.dispatch import combine_rows, route_rows, routed_experts
from autoshard.placement import Partial, Replicate, Shard
from autoshard.strategies.local import LocalCall, LocalContext, default_call
from autoshard.strategies.registry import register
from autoshard.strategies.rules.moe import windowed_expert_mlp
from autoshard.strategies.strategy import AxisChoice, OpStrategy, expand, tensor_meta

__all__ = ["dispatch_axis", "windowed_routed_experts"]


def dispatch_axis(strategy: OpStrategy) -> int | None:
    """The mesh axis an all-to-all strategy dispatches tokens over (tokens and experts split on it), else None."""
    hidden, gate_up = strategy.inputs[0], strategy.inputs[1]
    if hidden is None or gate_up is None:
        return None
    return next(
        (
            a
            for a, (h, w) in enumerate(zip(hidden.placements, gate_up.placements, strict=True))
            if isinstance(h, Shard) and h.dim == 0 and isinstance(w, Shard) and w.dim == 0
        ),
        None,
    )


def _one_dispatch(strategy: OpStrategy) -> bool:
    axis = dispatch_axis(strategy)
    gate_up = strategy.inputs[1]
    if axis is None or gate_up is None:
        return True
    split = [a for a, p in enumerate(gate_up.placements) if isinstance(p, Shard) and p.dim == 0]
    return split == [axis]


def windowed_routed_experts(
    hidden: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    index: torch.Tensor,
    weights: torch.Tensor,
    act: Callable[[torch.Tensor], torch.Tensor],
    use_aten: bool,
    n_experts: int,
    expert_start: int,
    ffn_start: int,
) -> torch.Tensor:
    """:func:`~autoshard.capture.dispatch.routed_experts` of this device's tokens on its window of experts
    (``gate_up``/``down`` hold experts ``expert_start:``, zeros for rows routed elsewhere) and of the FFN dim."""
    k = index.shape[-1]
    perm, offs = route_rows(index, n_experts)
    y = windowed_expert_mlp(hidden[perm // k], gate_up, down, offs, act, use_aten, 0, expert_start, ffn_start)
    return combine_rows(y, weights, perm, k).to(hidden.dtype)


def _local(ctx: LocalContext) -> LocalCall:
    _, gate_up, down = ctx.node.args[:3]
    assert isinstance(gate_up, fx.Node) and isinstance(down, fx.Node)
    val = tensor_meta(gate_up)
    assert val is not None
    n_experts = int(val.shape[0])
    ffn_start, _ = ctx.in_range(down, 1)
    axis = dispatch_axis(ctx.strategy)
    if axis is not None:
        from autoshard.codegen.dispatch import all_to_all_routed_experts, zigzag_expert_order

        kwargs: dict[str, Any] = {"n_experts": n_experts, "axis": axis, "ffn_start": ffn_start}
        if ctx.zigzag_axis == axis:  # experts stored zigzag on the ring's axis, like every split there
            kwargs["expert_order"] = zigzag_expert_order(n_experts, ctx.mesh_shape[axis])
        return LocalCall(all_to_all_routed_experts, tuple(ctx.args[:7]), kwargs)
    if ctx.strategy.work_divisor == 1:
        return default_call(ctx)
    expert_start, _ = ctx.in_range(gate_up, 0)
    return LocalCall(windowed_routed_experts, (*ctx.args[:7], n_experts, expert_start, ffn_start))


@register(routed_experts, local_args=_local)
def routed_experts_rule(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    """Replicate, tokens, experts by all-gather or all-to-all dispatch, FFN dim (module doc)."""
    hidden, gate_up, down, index, weights = node.args[:5]
    r, p, s0 = Replicate(), Partial(), Shard(0)
    choices = [
        AxisChoice((r, r, r, r, r), (r,), False),
        AxisChoice((s0, r, r, s0, s0), (s0,), True),  # tokens
        AxisChoice((r, s0, s0, r, r), (p,), True),  # experts, tokens gathered (all-gather dispatch)
        AxisChoice((s0, s0, s0, s0, s0), (s0,), True),  # experts, tokens sent (all-to-all dispatch)
        AxisChoice((r, r, Shard(1), r, r), (p,), True),  # FFN dim inside each expert
    ]
    roles = (hidden, gate_up, down, index, weights)
    return [s for s in expand(node, roles, choices, mesh_shape) if _one_dispatch(s)]
