"""Mixture-of-experts routing and expert compute: ``topk``, ``sort``, ``histc``, ``one_hot``, grouped matmuls.

- ``topk``/``sort``/``argsort``: the dim they rank along stays whole, other dims are batch-like; values and
  indices share a layout.
- ``histc``: counts add up, so any split of the input gives a Partial histogram (only with a fixed range:
  ``min < max``; with ``min == max`` the range comes from the data and must be seen whole).
- ``one_hot``: batch-like over the input dims; the class dim whole (its size is localised to the global
  ``num_classes`` so ``-1`` cannot infer a different size per device).
- Grouped matmul ``out[T, N] = x[T, K] @ w[e(t), K, N]``, rows sorted by expert and ``offs`` the cumulative
  row counts (``transformers::grouped_mm_fallback`` and ``aten._grouped_mm`` with 2-D ``x``, 3-D ``w``).  Per
  mesh axis: split tokens ``T`` (``S(0)`` of x and out), split ``N`` (Megatron column split inside each
  expert), split ``K`` (Partial out), split **experts** (``w`` ``S(0)``; each device multiplies only the rows
  routed to its experts and leaves zeros elsewhere, so the output is Partial -- expert parallelism whose
  all-to-all the planner sees as the Partial's reduction), or pass Partial through ``x`` or ``w``.  The
  ``local_args`` hook turns ``offs`` into the device's window of rows and experts (:func:`windowed_grouped_mm`).
- The fused expert MLP (:func:`autoshard.capture.experts.expert_mlp`, two grouped matmuls around the gated
  activation): token split; expert split with the output Partial -- expert parallelism with one reduction
  per MoE layer; or a split of the FFN dim inside every expert (Partial output).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import fx

from autoshard.capture.experts import expert_mlp
from autoshard.placement import Partial, Replicate, Shard
from autoshard.strategies.dimmap import DimMap, Letters, fresh_letters, strategies_from_map
from autoshard.strategies.local import LocalCall, LocalContext, bind, default_call, with_arg
from autoshard.strategies.registry import register, replicate_strategy
from autoshard.strategies.strategy import AxisChoice, OpStrategy, expand, tensor_meta

aten = torch.ops.aten


def _ndim(node: object) -> int:
    val = tensor_meta(node) if isinstance(node, fx.Node) else None
    assert val is not None, f"{node} must be a tensor"
    return val.dim()


@register(aten.topk.default, aten.sort.default, aten.sort.stable, aten.argsort.default, aten.argsort.stable)
def rank(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    """The ranked dim whole (topk's output dim has its own letter), other dims batch-like."""
    b = bind(node.target, node.args, node.kwargs)
    x = b["self"]
    n = _ndim(x)
    dim = int(b["dim"]) % max(n, 1)
    letters = fresh_letters(n + 1)
    k = letters.pop()
    out: Letters = tuple(k if d == dim else c for d, c in enumerate(letters)) if n else ()
    n_out = 1 if node.target in (aten.argsort.default, aten.argsort.stable) else 2
    dm = DimMap((tuple(letters),), (out,) * n_out, unsplittable=frozenset({k, *letters[dim : dim + 1]}))
    return strategies_from_map(node, (x,), dm, mesh_shape)


@register(aten.histc.default)
def histc(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    """Any split of the input gives a Partial histogram when the bin range is fixed."""
    b = bind(node.target, node.args, node.kwargs)
    x = b["self"]
    letters = tuple(fresh_letters(_ndim(x) + 1))
    fixed = b["min"] < b["max"]
    dm = DimMap(
        (letters[:-1],), ((letters[-1],),), unsplittable=frozenset(letters if not fixed else letters[-1:])
    )
    return strategies_from_map(node, (x,), dm, mesh_shape)


def _one_hot_local(ctx: LocalContext) -> LocalCall:
    args, kwargs = with_arg(ctx.node.target, ctx.args, ctx.kwargs, "num_classes", ctx.global_out_shape()[-1])
    return LocalCall(ctx.target, args, kwargs)


@register(aten.one_hot.default, local_args=_one_hot_local)
def one_hot(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    x = node.args[0]
    letters = tuple(fresh_letters(_ndim(x) + 1))
    dm = DimMap((letters[:-1],), (letters,), unsplittable=frozenset(letters[-1:]))
    return strategies_from_map(node, (x,), dm, mesh_shape)


# -- grouped matmul -------------------------------------------------------------------------------------------------

_GROUPED_MM_FALLBACK = "transformers::grouped_mm_fallback.default"


def windowed_grouped_mm(
    x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor, row_start: int, expert_start: int, use_aten: bool
) -> torch.Tensor:
    """A grouped matmul over a window of rows (``x`` holds global rows ``row_start:``) and of experts
    (``w`` holds experts ``expert_start:``); rows routed to other experts come out zero.

    ``offs`` is the global cumulative row count per expert.
    """
    rows, n_experts = x.shape[0], w.shape[0]
    bounds = torch.cat([offs.new_zeros(1), offs]).to(torch.int64) - row_start
    lo = int(bounds[expert_start].clamp(0, rows))
    ends = bounds[expert_start + 1 : expert_start + 1 + n_experts].clamp(0, rows)
    hi = int(ends[-1])
    if hi <= lo:  # no row of this window is routed to these experts
        return x.new_zeros(rows, w.shape[-1])
    local_offs = (ends - lo).to(offs.dtype)
    if use_aten:
        mid = aten._grouped_mm.default(x[lo:hi], w, local_offs)
    else:
        mid = torch.ops.transformers.grouped_mm_fallback.default(x[lo:hi], w, local_offs)
    return torch.cat([mid.new_zeros(lo, mid.shape[1]), mid, mid.new_zeros(rows - hi, mid.shape[1])])


def _grouped_mm_local(ctx: LocalContext) -> LocalCall:
    x, w = ctx.node.args[:2]
    assert isinstance(x, fx.Node) and isinstance(w, fx.Node)
    row_start, _ = ctx.in_range(x, 0)
    expert_start, _ = ctx.in_range(w, 0)
    x_spec, w_spec = ctx.input_spec(x), ctx.input_spec(w)
    assert x_spec is not None and w_spec is not None
    split_rows = any(isinstance(p, Shard) and p.dim == 0 for p in x_spec.placements)
    split_experts = any(isinstance(p, Shard) and p.dim == 0 for p in w_spec.placements)
    if not (split_rows or split_experts):
        return default_call(ctx)
    b = ctx.bound()
    use_aten = ctx.node.target is aten._grouped_mm.default
    return LocalCall(
        windowed_grouped_mm,
        (b["self"] if use_aten else b["input"], b["mat2"] if use_aten else b["weight"], b["offs"],
         row_start, expert_start, use_aten),
    )  # fmt: skip


@register(_GROUPED_MM_FALLBACK, aten._grouped_mm.default, local_args=_grouped_mm_local)
def grouped_mm(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    """Token, ``N``, ``K`` or expert split, or Partial through one operand (module doc)."""
    x, w = node.args[:2]
    b = bind(node.target, node.args, node.kwargs)
    offs = b.get("offs")
    if not (isinstance(offs, fx.Node) and _ndim(x) == 2 and _ndim(w) == 3) or b.get("bias") is not None:
        return [replicate_strategy(node, mesh_shape)]
    r, p = Replicate(), Partial()
    choices = [
        AxisChoice((r, r, r), (r,), False),
        AxisChoice((Shard(0), r, r), (Shard(0),), True),  # tokens
        AxisChoice((r, Shard(2), r), (Shard(1),), True),  # N: column split inside each expert
        AxisChoice((Shard(1), Shard(1), r), (p,), True),  # K: row split inside each expert
        AxisChoice((r, Shard(0), r), (p,), True),  # experts
        AxisChoice((p, r, r), (p,), False),
        AxisChoice((r, p, r), (p,), False),
    ]
    return expand(node, (x, w, offs), choices, mesh_shape)


# -- fused expert MLP (capture.experts) -------------------------------------------------------------------------------


def windowed_expert_mlp(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    offs: torch.Tensor,
    act: Callable[[torch.Tensor], torch.Tensor],
    use_aten: bool,
    row_start: int,
    expert_start: int,
    ffn_start: int = 0,
) -> torch.Tensor:
    """:func:`~autoshard.capture.experts.expert_mlp` over a window of rows, of experts (zeros elsewhere) and of
    the FFN dim: ``down`` holds FFN rows ``ffn_start:``, and the matching gate and up columns are taken from
    the whole ``gate_up`` (the output is then this window's Partial term)."""
    ffn = down.shape[1]
    if ffn * 2 != gate_up.shape[-1]:  # gate columns [s, s+f), up columns [I+s, I+s+f)
        half = gate_up.shape[-1] // 2
        gate_up = torch.cat(
            [
                gate_up[..., ffn_start : ffn_start + ffn],
                gate_up[..., half + ffn_start : half + ffn_start + ffn],
            ],
            -1,
        )
    h = windowed_grouped_mm(x, gate_up, offs, row_start, expert_start, use_aten)
    gate, up = h.chunk(2, -1)
    return windowed_grouped_mm(act(gate) * up, down, offs, row_start, expert_start, use_aten)


def _expert_mlp_local(ctx: LocalContext) -> LocalCall:
    x, gate_up, down = ctx.node.args[:3]
    assert isinstance(x, fx.Node) and isinstance(gate_up, fx.Node) and isinstance(down, fx.Node)
    row_start, _ = ctx.in_range(x, 0)
    expert_start, _ = ctx.in_range(gate_up, 0)
    ffn_start, _ = ctx.in_range(down, 1)
    if ctx.strategy.work_divisor == 1:
        return default_call(ctx)
    return LocalCall(windowed_expert_mlp, (*ctx.args, row_start, expert_start, ffn_start))


@register(expert_mlp, local_args=_expert_mlp_local)
def expert_mlp_rule(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    """Per mesh axis: replicate; split the (sorted) token rows; split the experts -- expert parallelism: each
    device runs its experts' rows through the whole MLP, and the output is Partial (one reduction per MoE
    layer, where the tokens' other devices add zeros); or split the FFN dim inside every expert (Megatron's
    MLP: ``down`` row-split, the matching gate and up columns taken from a whole ``gate_up``, output
    Partial)."""
    x, gate_up, down, offs = node.args[:4]
    r, p = Replicate(), Partial()
    choices = [
        AxisChoice((r, r, r, r), (r,), False),
        AxisChoice((Shard(0), r, r, r), (Shard(0),), True),  # tokens
        AxisChoice((r, Shard(0), Shard(0), r), (p,), True),  # experts
        AxisChoice((r, r, Shard(1), r), (p,), True),  # FFN dim inside each expert
    ]
    return expand(node, (x, gate_up, down, offs), choices, mesh_shape)
