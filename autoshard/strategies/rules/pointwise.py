"""Pointwise ops: every output element depends on the same element of each (broadcast) input.

The dim map comes from shapes: output dim ``i`` gets letter ``i``; an input dim aligned to it from the right
shares the letter unless it is a size-1 broadcast dim.  Any letter may be split.  ``Partial`` passes through
where the op is linear: ``neg(x)``, ``x * y`` in each factor alone, ``x / y`` in ``x``, ``x + y`` and
``where(c, x, y)`` in both together, ``x + c`` only when the scalar ``c`` is 0, casts and copies in ``x``.

Example: ``add(x[B,S,H], b[H])`` on mesh (2,) gives ``R, R -> R``, ``S(0), R -> S(0)``, ``S(1), R -> S(1)``,
``S(2), S(0) -> S(2)`` and ``P, P -> P``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import fx

from autoshard.strategies.dimmap import DimMap, broadcast_letters, fresh_letters, strategies_from_map
from autoshard.strategies.local import bind
from autoshard.strategies.registry import register
from autoshard.strategies.strategy import OpStrategy, tensor_meta

aten = torch.ops.aten

LinearGroups = Callable[[dict[str, Any]], list[list[str]]]
"""Given the bound arguments, the groups of tensor arguments (by schema name) that may be Partial together."""


def pointwise_strategies(
    node: fx.Node,
    mesh_shape: tuple[int, ...],
    linear: LinearGroups = lambda b: [],
    *,
    ignore: Iterable[str] = (),
) -> list[OpStrategy]:
    """Strategies of a broadcasting pointwise op; ``ignore`` names tensor arguments used only for dtype."""
    bound = bind(node.target, node.args, node.kwargs)
    skip = set(ignore)
    metas = {k: t for k, v in bound.items() if k not in skip and (t := tensor_meta(v)) is not None}
    names = list(metas)
    roles = [bound[k] for k in names]
    out = tensor_meta(node)
    assert out is not None, f"pointwise op {node} must return one tensor"
    shapes = [tuple(t.shape) for t in metas.values()]
    letters, out_letters = broadcast_letters(shapes, tuple(out.shape))
    groups = tuple(
        frozenset(names.index(k) for k in group) for group in linear(bound) if all(k in names for k in group)
    )
    return strategies_from_map(node, roles, DimMap(letters, (out_letters,), linear_in=groups), mesh_shape)


def _ops(packet: str, overloads: Sequence[str]) -> list[torch._ops.OpOverload]:
    """The named overloads of ``aten.<packet>`` that exist and return a tensor (not the scalar ``int`` forms)."""
    p = getattr(aten, packet)
    ops = [getattr(p, o) for o in overloads if hasattr(p, o)]
    return [op for op in ops if [str(r.type) for r in op._schema.returns] == ["Tensor"]]


def _is_zero(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and v == 0


# -- nonlinear: no Partial -------------------------------------------------------------------------------------

_UNARY = [
    "abs", "exp", "log", "log1p", "expm1", "sqrt", "rsqrt", "tanh", "sigmoid", "relu", "gelu", "silu", "sin",
    "cos", "erf", "reciprocal", "sign", "floor", "ceil", "round", "trunc", "logical_not", "bitwise_not",
    "isnan", "isinf", "leaky_relu", "hardtanh", "elu", "softplus", "mish", "hardswish", "hardsigmoid",
    "sgn", "square", "exp2", "log2", "nan_to_num", "clamp_min", "clamp_max", "relu6", "tan", "atan", "erfinv",
]  # fmt: skip
_BINARY = [
    "eq", "ne", "lt", "le", "gt", "ge", "__and__", "__or__", "__xor__", "bitwise_and", "bitwise_or",
    "bitwise_xor", "logical_and", "logical_or", "logical_xor", "maximum", "minimum", "floor_divide",
    "remainder", "fmod", "atan2", "pow", "clamp", "fmax", "fmin",
]  # fmt: skip
_NONLINEAR = [
    op
    for name in _UNARY + _BINARY
    for op in _ops(
        name,
        ["default", "Tensor", "Scalar", "Tensor_Scalar", "Tensor_Tensor", "Scalar_Tensor"]
        if name in _BINARY
        else ["default"],
    )
]
_NONLINEAR += _ops("div", ["Tensor_mode", "Scalar_mode"]) + _ops("max", ["other"]) + _ops("min", ["other"])
_NONLINEAR += [aten.relu_.default, aten.sigmoid_.default, aten.tanh_.default, aten.clamp_.default]


@register(*_NONLINEAR)
def nonlinear_pointwise(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    """Broadcasting pointwise ops that are not linear in any input: split any dim, never Partial."""
    return pointwise_strategies(node, mesh_shape)


# -- linear in the first tensor --------------------------------------------------------------------------------

_IDENTITY = [
    aten.neg.default, aten.clone.default, aten.contiguous.default, aten.alias.default, aten.detach.default,
    aten.lift_fresh_copy.default, aten._to_copy.default, aten.to.dtype, aten.to.device, aten.to.dtype_layout,
    aten.positive.default, aten.detach_.default, aten.neg_.default,
]  # fmt: skip


@register(*_IDENTITY)
def identity_like(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    """Copies, casts and negation: any split; Partial passes through unless the cast narrows the float type
    (rounding each addend is not rounding their sum: HF's RMSNorm casts a float64 residual to float32)."""
    return pointwise_strategies(node, mesh_shape, lambda b: [] if _narrows(node) else [["self"]])


def _narrows(node: fx.Node) -> bool:
    x = node.args[0] if node.args else None
    src, out = tensor_meta(x) if isinstance(x, fx.Node) else None, tensor_meta(node)
    if src is None or out is None or not (src.dtype.is_floating_point and out.dtype.is_floating_point):
        return False
    return torch.finfo(out.dtype).eps > torch.finfo(src.dtype).eps


@register(aten.type_as.default, aten.to.other)
def cast_like(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    """``x.type_as(other)``: like a cast; ``other`` only lends its dtype (unconstrained, no gradient)."""
    return pointwise_strategies(node, mesh_shape, lambda b: [["self"]], ignore=("other",))


@register(aten.copy_.default, aten.copy.default)
def copy(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    """``self.copy_(src)`` (slice assignment): the result is ``src`` broadcast to ``self``'s shape, so the
    two share letters; linear in ``src`` alone (``self``'s values are overwritten)."""
    return pointwise_strategies(node, mesh_shape, lambda b: [["src"]])


@register(aten.dropout.default, aten.native_dropout.default)
def dropout(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    """Any split (each device draws its own mask: same distribution); Partial only when it is the identity."""
    if node.target is aten.native_dropout.default:
        return _native_dropout(node, mesh_shape)
    return pointwise_strategies(
        node, mesh_shape, lambda b: [["input"]] if b["p"] == 0 or b["train"] is False else []
    )


def _native_dropout(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    """``(out, mask)`` share the input's letters; never Partial (a random mask per addend)."""
    x = node.args[0]
    val = tensor_meta(x) if isinstance(x, fx.Node) else None
    assert isinstance(x, fx.Node) and val is not None
    dims = tuple(fresh_letters(val.dim()))
    return strategies_from_map(node, (x,), DimMap((dims,), (dims, dims)), mesh_shape)


@register(*_ops("mul", ["Tensor", "Scalar"]), aten.mul_.Tensor, aten.mul_.Scalar)
def mul(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    """``x * y``: linear in each factor alone."""
    return pointwise_strategies(node, mesh_shape, lambda b: [["self"], ["other"]])


@register(*_ops("div", ["Tensor", "Scalar"]), aten.div_.Tensor, aten.div_.Scalar)
def div(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    """``x / y``: linear in the numerator."""
    return pointwise_strategies(node, mesh_shape, lambda b: [["self"]])


def _sum_groups(b: dict[str, Any]) -> list[list[str]]:
    if isinstance(b["other"], fx.Node):
        return [["self", "other"]]
    return [["self"]] if _is_zero(b["other"]) else []


@register(
    *_ops("add", ["Tensor", "Scalar"]),
    *_ops("sub", ["Tensor", "Scalar"]),
    *_ops("rsub", ["Tensor", "Scalar"]),
    aten.add_.Tensor,
    aten.add_.Scalar,
    aten.sub_.Tensor,
    aten.sub_.Scalar,
)
def add(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    """``x ± y``: linear in both together; ``x + c`` is linear only for ``c == 0``."""
    return pointwise_strategies(node, mesh_shape, _sum_groups)


def _where_groups(b: dict[str, Any]) -> list[list[str]]:
    tensors = [k for k in ("self", "other") if isinstance(b[k], fx.Node)]
    scalars_zero = all(_is_zero(b[k]) for k in ("self", "other") if not isinstance(b[k], fx.Node))
    return [tensors] if tensors and scalars_zero else []


@register(aten.where.self, aten.where.ScalarOther, aten.where.ScalarSelf, aten.where.Scalar)
def where(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    """``where(c, x, y)``: linear in ``x`` and ``y`` together (a scalar branch must be 0)."""
    return pointwise_strategies(node, mesh_shape, _where_groups)


@register(
    aten.masked_fill.Scalar, aten.masked_fill.Tensor, aten.masked_fill_.Scalar, aten.masked_fill_.Tensor
)
def masked_fill(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    """``x.masked_fill(m, v)``: linear in ``x`` (with a tensor ``v``, in both) when a scalar ``v`` is 0."""

    def groups(b: dict[str, Any]) -> list[list[str]]:
        if isinstance(b["value"], fx.Node):
            return [["self", "value"]]
        return [["self"]] if _is_zero(b["value"]) else []

    return pointwise_strategies(node, mesh_shape, groups)
