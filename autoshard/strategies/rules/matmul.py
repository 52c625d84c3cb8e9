"""Matrix products: ``mm``, ``bmm``, ``addmm``, ``baddbmm``, ``linear``, ``matmul``.

Each is a dim map: ``mm`` is ``"mk,kn->mn"``, ``bmm`` ``"bmk,bkn->bmn"``, ``linear`` ``"...k,nk->...n"`` with
bias ``"n"``.  Splitting ``m``/``n``/batch letters splits the output; splitting ``k`` makes it Partial; Partial
passes through either factor alone.  Megatron's column-parallel linear is ``R, S(0), S(0) -> S(-1)`` (weight
rows = output features), its row-parallel linear ``S(-1), S(1), R -> P``.

A bias is added once, not once per device: where the output is Partial the bias stays replicated and the
``local_args`` hook drops it on every device but the first of each Partial axis (``linear`` without bias,
``addmm`` with ``beta=0``) -- so Partial pieces still sum to the true output.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import fx

from autoshard.strategies.dimmap import DimMap, Letters, fresh_letters, strategies_from_map
from autoshard.strategies.local import LocalCall, LocalContext, bind, with_arg
from autoshard.strategies.registry import register
from autoshard.strategies.strategy import OpStrategy, tensor_meta

aten = torch.ops.aten


def _shape(node: object) -> tuple[int, ...]:
    val = tensor_meta(node) if isinstance(node, fx.Node) else None
    assert val is not None, f"{node} must be a tensor"
    return tuple(int(s) for s in val.shape)


def _broadcast_operand(
    shape: Sequence[int] | None, out_letters: Letters, out_shape: Sequence[int]
) -> Letters | None:
    """Letters of an operand broadcast against the output (aligned from the right)."""
    if shape is None:
        return None
    offset = len(out_shape) - len(shape)
    return tuple(
        out_letters[offset + d] if size == out_shape[offset + d] else None for d, size in enumerate(shape)
    )


def _first_on_partial_axes(ctx: LocalContext) -> bool:
    """Whether this device adds the bias: it is first along every axis on which the output is Partial."""
    return all(ctx.coord[a] == 0 for a in ctx.partial_axes_of_output())


def _linear_local(ctx: LocalContext) -> LocalCall:
    args, kwargs = ctx.args, ctx.kwargs
    if not _first_on_partial_axes(ctx):
        args, kwargs = with_arg(ctx.node.target, args, kwargs, "bias", None)
    return LocalCall(ctx.target, args, kwargs)


def _beta_local(ctx: LocalContext) -> LocalCall:
    args, kwargs = ctx.args, ctx.kwargs
    if not _first_on_partial_axes(ctx):
        args, kwargs = with_arg(ctx.node.target, args, kwargs, "beta", 0)
    return LocalCall(ctx.target, args, kwargs)


@register(aten.mm.default)
def mm(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    return strategies_from_map(
        node, node.args[:2], DimMap.parse("mk,kn->mn", linear_in=({0}, {1})), mesh_shape
    )


@register(aten.bmm.default)
def bmm(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    dm = DimMap.parse("bmk,bkn->bmn", linear_in=({0}, {1}))
    return strategies_from_map(node, node.args[:2], dm, mesh_shape)


@register(aten.addmm.default, aten.baddbmm.default, local_args=_beta_local)
def addmm(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    """``beta * bias + alpha * (a @ b)``, bias broadcast to the output."""
    b = bind(node.target, node.args, node.kwargs)
    bias, m1, m2 = b["self"], b["mat1" if "mat1" in b else "batch1"], b["mat2" if "mat2" in b else "batch2"]
    out_letters: Letters = ("m", "n") if node.target is aten.addmm.default else ("b", "m", "n")
    dm = DimMap(
        (
            _broadcast_operand(_shape(bias), out_letters, _shape(node)),
            ("m", "k") if len(out_letters) == 2 else ("b", "m", "k"),
            ("k", "n") if len(out_letters) == 2 else ("b", "k", "n"),
        ),
        (out_letters,),
        linear_in=(frozenset({1}), frozenset({2})),
    )
    return strategies_from_map(node, (bias, m1, m2), dm, mesh_shape)


@register(aten.linear.default, local_args=_linear_local)
def linear(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    """``x @ w.T + b``: ``"...k,nk,n->...n"`` (a 1-D weight drops ``n``)."""
    b = bind(node.target, node.args, node.kwargs)
    x, w, bias = b["input"], b["weight"], b["bias"]
    batch = tuple(fresh_letters(len(_shape(x)) - 1, avoid="kn"))
    w_letters: Letters = ("n", "k") if len(_shape(w)) == 2 else ("k",)
    out_letters = (*batch, "n") if len(w_letters) == 2 else batch
    bias_letters = (
        _broadcast_operand(_shape(bias), out_letters, _shape(node)) if isinstance(bias, fx.Node) else None
    )
    dm = DimMap(
        ((*batch, "k"), w_letters, bias_letters), (out_letters,), linear_in=(frozenset({0}), frozenset({1}))
    )
    return strategies_from_map(node, (x, w, bias if isinstance(bias, fx.Node) else None), dm, mesh_shape)


@register(aten.matmul.default)
def matmul(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    """``torch.matmul`` with its 1-D and broadcast-batch cases."""
    a, b = node.args[:2]
    sa, sb = _shape(a), _shape(b)
    out_shape = _shape(node)
    la: Letters = ("m", "k") if len(sa) >= 2 else ("k",)
    lb: Letters = ("k", "n") if len(sb) >= 2 else ("k",)
    tail = tuple(c for c in (la[0] if len(sa) >= 2 else None, lb[1] if len(sb) >= 2 else None) if c)
    batch = tuple(fresh_letters(len(out_shape) - len(tail), avoid="kmn"))
    out_letters = (*batch, *tail)
    la = (*(_broadcast_operand(sa[:-2], batch, out_shape[: len(batch)]) or ()), *la) if len(sa) > 2 else la
    lb = (*(_broadcast_operand(sb[:-2], batch, out_shape[: len(batch)]) or ()), *lb) if len(sb) > 2 else lb
    dm = DimMap((la, lb), (out_letters,), linear_in=(frozenset({0}), frozenset({1})))
    return strategies_from_map(node, (a, b), dm, mesh_shape)
