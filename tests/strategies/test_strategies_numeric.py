"""Every registered rule, proven numerically: each strategy's forward and backward on a simulated mesh.

One example (or a few) per registered op; the harness splits the inputs per each strategy, runs the rule's
local call per device, reassembles outputs and gradients and compares them with the whole op in float64.
Meshes (2,), (4,) and (2, 2): every strategy on (2,) and a sample on the others in the default run, every
strategy everywhere under ``-m slow``.  A registered op without an example fails
:func:`test_every_registered_op_has_an_example`.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import pytest
import torch
from coverage_rules import coverage_examples

from autoshard.strategies import registry
from autoshard.strategies.validate import build_node, check_rule

aten = torch.ops.aten
F64 = torch.float64
_GEN = torch.Generator().manual_seed(1234)

X = (4, 2, 8)  # a shape every test mesh can split along several dims


def f(*shape: int) -> torch.Tensor:
    return torch.randn(shape, generator=_GEN, dtype=F64)


def pos(*shape: int) -> torch.Tensor:
    return torch.rand(shape, generator=_GEN, dtype=F64) + 0.5


def unit(*shape: int) -> torch.Tensor:
    return torch.rand(shape, generator=_GEN, dtype=F64) * 0.8 + 0.1


def i(high: int, *shape: int) -> torch.Tensor:
    return torch.randint(0, high, shape, generator=_GEN)


def mask(*shape: int) -> torch.Tensor:
    return torch.rand(shape, generator=_GEN) > 0.5


def perm(n: int) -> torch.Tensor:
    return torch.randperm(n, generator=_GEN)


def rows_perm(rows: int, n: int, k: int) -> torch.Tensor:
    """Per row, ``k`` distinct column indices (scatter without duplicate writes)."""
    return torch.stack([torch.randperm(n, generator=_GEN)[:k] for _ in range(rows)])


Example = tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]


def ex(op: Callable[..., Any], *args: Any, **kwargs: Any) -> Example:
    return (op, args, kwargs)


_UNARY = [
    "abs",
    "exp",
    "log",
    "log1p",
    "expm1",
    "sqrt",
    "rsqrt",
    "tanh",
    "sigmoid",
    "relu",
    "gelu",
    "silu",
    "sin",
    "cos",
    "erf",
    "reciprocal",
    "sign",
    "floor",
    "ceil",
    "round",
    "trunc",
    "isnan",
    "isinf",
    "leaky_relu",
    "hardtanh",
    "elu",
    "softplus",
    "mish",
    "hardswish",
    "hardsigmoid",
    "sgn",
    "square",
    "exp2",
    "log2",
    "nan_to_num",
    "relu6",
    "tan",
    "atan",
    "relu_",
    "sigmoid_",
    "tanh_",
    "neg",
    "clone",
    "contiguous",
    "alias",
    "detach",
    "lift_fresh_copy",
    "positive",
    "detach_",
    "neg_",
]


def _pointwise() -> list[Example]:
    y, m = f(2, 8), mask(4, 1, 8)
    out = [ex(getattr(aten, name).default, pos(*X)) for name in _UNARY]
    out += [
        ex(aten.erfinv.default, unit(*X)),
        ex(aten.bitwise_not.default, i(9, *X)),
        ex(aten.logical_not.default, mask(*X)),
        ex(aten.clamp_min.default, f(*X), 0.1),
        ex(aten.clamp_max.default, f(*X), 0.2),
        ex(aten.clamp.default, f(*X), -0.5, 0.5),
        ex(aten.clamp_.default, f(*X), -0.5, 0.5),
        ex(aten.clamp.Tensor, f(*X), f(8), None),
        ex(aten._to_copy.default, f(*X), dtype=torch.float32),
        ex(aten.to.dtype, f(*X), torch.float32),
        ex(aten.to.device, f(*X), torch.device("cpu"), F64),
        ex(aten.to.dtype_layout, f(*X), dtype=F64, layout=torch.strided, device=torch.device("cpu")),
        ex(aten.type_as.default, f(*X), f(3).float()),
        ex(aten.to.other, f(*X), f(3).float()),
        ex(aten.dropout.default, f(*X), 0.0, True),
        ex(aten.native_dropout.default, f(*X), 0.0, False),
        ex(aten.mul.Tensor, f(*X), y),
        ex(aten.mul.Tensor, f(*X), f(4, 1, 8)),
        ex(aten.mul.Scalar, f(*X), 3.0),
        ex(aten.mul_.Tensor, f(*X), y),
        ex(aten.mul_.Scalar, f(*X), 3.0),
        ex(aten.div.Tensor, f(*X), pos(2, 8)),
        ex(aten.div.Scalar, f(*X), 3.0),
        ex(aten.div_.Tensor, f(*X), pos(8)),
        ex(aten.div_.Scalar, f(*X), 3.0),
        ex(aten.div.Tensor_mode, f(*X), pos(2, 8), rounding_mode="floor"),
        ex(aten.div.Scalar_mode, f(*X), 0.3, rounding_mode="trunc"),
        ex(aten.add.Tensor, f(*X), y),
        ex(aten.add.Tensor, f(*X), 0),
        ex(aten.add.Tensor, f(*X), 1.5),
        ex(aten.add.Scalar, f(*X), 2.0),
        ex(aten.sub.Tensor, f(*X), f(4, 1, 8), alpha=2),
        ex(aten.sub.Scalar, f(*X), 2.0),
        ex(aten.rsub.Tensor, f(*X), y),
        ex(aten.rsub.Scalar, f(*X), 1.0),
        ex(aten.add_.Tensor, f(*X), y),
        ex(aten.add_.Scalar, f(*X), 1.0),
        ex(aten.sub_.Tensor, f(*X), y),
        ex(aten.sub_.Scalar, f(*X), 1.0),
        ex(aten.where.self, m, f(*X), y),
        ex(aten.where.ScalarOther, m, f(*X), 0.0),
        ex(aten.where.ScalarSelf, m, 0.0, f(*X)),
        ex(aten.where.Scalar, m, 1.0, 0.0),
        ex(aten.masked_fill.Scalar, f(*X), m, 0.0),
        ex(aten.masked_fill.Scalar, f(*X), m, -1e4),
        ex(aten.masked_fill.Tensor, f(*X), m, f()),
        ex(aten.masked_fill_.Scalar, f(*X), m, 0.0),
        ex(aten.masked_fill_.Tensor, f(*X), m, f()),
        ex(aten.pow.Tensor_Scalar, f(*X), 2),
        ex(aten.pow.Tensor_Tensor, pos(*X), y),
        ex(aten.pow.Scalar, 2.0, f(*X)),
        ex(aten.max.other, f(*X), y),
        ex(aten.min.other, f(*X), y),
        ex(aten.floor_divide.default, f(*X), pos(8)),
        ex(aten.floor_divide.Scalar, f(*X), 0.3),
        ex(aten.remainder.Tensor, f(*X), pos(8)),
        ex(aten.remainder.Scalar, f(*X), 0.3),
        ex(aten.remainder.Scalar_Tensor, 2.0, pos(*X)),
        ex(aten.fmod.Tensor, f(*X), pos(8)),
        ex(aten.fmod.Scalar, f(*X), 0.3),
        ex(aten.atan2.default, f(*X), y),
    ]
    for name in ("maximum", "minimum", "fmax", "fmin"):
        out.append(ex(getattr(aten, name).default, f(*X), y))
    for name in ("eq", "ne", "lt", "le", "gt", "ge"):
        out += [ex(getattr(aten, name).Tensor, f(*X), y), ex(getattr(aten, name).Scalar, f(*X), 0.1)]
    for name in ("__and__", "__or__", "__xor__"):
        out += [ex(getattr(aten, name).Tensor, mask(*X), m), ex(getattr(aten, name).Scalar, mask(*X), True)]
    for name in ("bitwise_and", "bitwise_or", "bitwise_xor"):
        op = getattr(aten, name)
        out += [
            ex(op.Tensor, i(9, *X), i(9, 8)),
            ex(op.Scalar, i(9, *X), 3),
            ex(op.Scalar_Tensor, 3, i(9, *X)),
        ]
    for name in ("logical_and", "logical_or", "logical_xor"):
        out.append(ex(getattr(aten, name).default, mask(*X), m))
    return out


def _reductions() -> list[Example]:
    return [
        ex(aten.sum.dim_IntList, f(*X), [1]),
        ex(aten.sum.dim_IntList, f(*X), [0, 2], True),
        ex(aten.sum.default, f(*X)),
        ex(aten.mean.dim, f(*X), [-1], True),
        ex(aten.mean.dim, f(*X), [0, 2]),
        ex(aten.mean.default, f(*X)),
        ex(aten.amax.default, f(*X), [1]),
        ex(aten.amin.default, f(*X), [2], True),
        ex(aten.max.dim, f(*X), 2),
        ex(aten.min.dim, f(*X), 0, True),
        ex(aten.max.default, f(*X)),
        ex(aten.min.default, f(*X)),
        ex(aten.argmax.default, f(*X), 2),
        ex(aten.argmin.default, f(*X)),
        ex(aten.prod.dim_int, pos(*X), 1),
        ex(aten.prod.default, pos(4, 2)),
        ex(aten.var.correction, f(*X), [2]),
        ex(aten.var.dim, f(*X), [2]),
        ex(aten.std.correction, f(*X), [0], keepdim=True),
        ex(aten.std.dim, f(*X), [2]),
        ex(aten.any.dim, mask(*X), 1),
        ex(aten.any.dims, mask(*X), [0, 2]),
        ex(aten.any.default, mask(*X)),
        ex(aten.all.dim, mask(*X), 1),
        ex(aten.all.dims, mask(*X), [0, 2]),
        ex(aten.all.default, mask(*X)),
        ex(aten.logsumexp.default, f(*X), [2]),
        ex(aten.var_mean.correction, f(*X), [2]),
        ex(aten.norm.ScalarOpt_dim, f(*X), 2, [2]),
        ex(aten.softmax.int, f(*X), -1),
        ex(aten._softmax.default, f(*X), 1, False),
        ex(aten.log_softmax.int, f(*X), 0),
        ex(aten._log_softmax.default, f(*X), -1, False),
        ex(aten.cumprod.default, pos(*X), 1),
        ex(aten.cumsum.default, f(*X), 2),
        ex(aten.cumsum.default, mask(4, 8), -1),
        ex(aten.diff.default, i(9, 4, 8), 1, -1, i(9, 4, 1)),
        ex(aten.diff.default, f(*X), 1, 0, None, f(1, 2, 8)),
        ex(aten.layer_norm.default, f(*X), [8], f(8), f(8), 1e-5, False),
        ex(aten.layer_norm.default, f(*X), [2, 8], f(2, 8), None),
        ex(aten.native_layer_norm.default, f(*X), [8], f(8), f(8), 1e-5),
        ex(aten.rms_norm.default, f(*X), [8], f(8), 1e-6),
        ex(aten._fused_rms_norm.default, f(*X), [8], f(8), 1e-6),
    ]


def _matmuls() -> list[Example]:
    return [
        ex(aten.mm.default, f(4, 8), f(8, 4)),
        ex(aten.bmm.default, f(4, 4, 8), f(4, 8, 4)),
        ex(aten.addmm.default, f(4), f(4, 8), f(8, 4)),
        ex(aten.addmm.default, f(4, 4), f(4, 8), f(8, 4), beta=0.5, alpha=2.0),
        ex(aten.baddbmm.default, f(4, 4, 4), f(4, 4, 8), f(4, 8, 4)),
        ex(aten.linear.default, f(2, 4, 8), f(4, 8), f(4)),
        ex(aten.linear.default, f(4, 8), f(4, 8)),
        ex(aten.matmul.default, f(2, 4, 8), f(8, 4)),
        ex(aten.matmul.default, f(4, 2, 4, 8), f(4, 1, 8, 4)),
        ex(aten.matmul.default, f(8), f(2, 8, 4)),
        ex(aten.matmul.default, f(4, 8), f(8)),
    ]


def _attention() -> list[Example]:
    sdpa = aten.scaled_dot_product_attention.default
    q, k, v = f(2, 4, 8, 4), f(2, 4, 8, 4), f(2, 4, 8, 4)
    return [
        ex(sdpa, q, k, v),
        ex(sdpa, q, k, v, torch.tril(torch.ones(8, 8, dtype=torch.bool)).expand(2, 1, 8, 8), scale=0.3),
        ex(sdpa, q, k, v, f(8, 8)),
        ex(sdpa, q, k, v, is_causal=True),
        ex(sdpa, q, f(2, 2, 8, 4), f(2, 2, 8, 4), enable_gqa=True),
    ]


def _shapes() -> list[Example]:
    return [
        ex(aten.view.default, f(4, 8), [4, 2, 4]),
        ex(aten.view.default, f(4, 2, 4), [4, -1]),
        ex(aten.view.default, f(1, 8), [8]),
        ex(aten.reshape.default, f(2, 4, 8), [8, 8]),
        ex(aten._unsafe_view.default, f(4, 8), [2, 2, 8]),
        ex(aten.unflatten.int, f(4, 8), 1, [2, 4]),
        ex(aten.flatten.using_ints, f(2, 4, 8), 0, 1),
        ex(aten.unsqueeze.default, f(4, 8), 1),
        ex(aten.unsqueeze_.default, f(4, 8), 0),
        ex(aten.squeeze.default, f(4, 1, 8)),
        ex(aten.squeeze.dim, f(4, 1, 8), 1),
        ex(aten.squeeze.dims, f(4, 1, 8), [1]),
        ex(aten.squeeze_.dim, f(4, 1, 8), 1),
        ex(aten.permute.default, f(2, 4, 8), [2, 0, 1]),
        ex(aten.transpose.int, f(2, 4, 8), 0, 2),
        ex(aten.t.default, f(4, 8)),
        ex(aten.movedim.int, f(2, 4, 8), 0, 2),
        ex(aten.swapaxes.default, f(2, 4, 8), 0, 1),
        ex(aten.expand.default, f(4, 1, 8), [2, 4, 4, 8]),
        ex(aten.expand.default, f(4, 1, 8), [-1, 4, -1]),
        ex(aten.repeat.default, f(4, 8), [2, 1, 1]),
        ex(aten.repeat.default, f(4, 8), [1, 2]),
        ex(aten.slice.Tensor, f(4, 8), 1, 0, 4),
        ex(aten.slice.Tensor, f(4, 8), 1, 0, 9223372036854775807),
        ex(aten.select.int, f(4, 8), 0, 1),
        ex(aten.unbind.int, f(4, 2, 8), 1),
        ex(aten.narrow.default, f(4, 8), 1, 2, 4),
        ex(aten.split.Tensor, f(4, 8), 4, 1),
        ex(aten.split_with_sizes.default, f(4, 8), [2, 6], 1),
        ex(aten.chunk.default, f(4, 8), 2, -1),
        ex(aten.tensor_split.sections, f(4, 8), 2, 1),
        ex(aten.flip.default, f(4, 8), [1]),
        ex(aten.constant_pad_nd.default, f(4, 8), [1, 1]),
        ex(aten.pad.default, f(4, 8), [0, 0, 1, 0], "constant", 2.0),
        ex(aten.cat.default, [f(4, 8), f(4, 8)], 1),
        ex(aten.cat.default, [f(4, 8), f(2, 8)], 0),
        ex(aten.stack.default, [f(4, 8), f(4, 8)], 1),
        ex(aten.tril.default, f(2, 8, 8)),
        ex(aten.triu.default, f(8, 8), 1),
    ]


def _creation() -> list[Example]:
    return [
        ex(aten.arange.default, 8),
        ex(aten.arange.start, 2, 10),
        ex(aten.arange.start_step, 0, 16, 2),
        ex(aten.zeros.default, [4, 8], dtype=F64),
        ex(aten.ones.default, [4, 8], dtype=F64),
        ex(aten.full.default, [4, 8], 3.0, dtype=F64),
        ex(aten.empty.memory_format, [4, 8], dtype=F64),
        ex(aten.new_zeros.default, f(3), [4, 8]),
        ex(aten.new_ones.default, f(3), [4, 8]),
        ex(aten.new_ones.default, i(3, 4, 1), [], dtype=torch.bool),
        ex(aten.new_full.default, f(3), [4, 8], 2.0),
        ex(aten.new_empty.default, f(3), [4, 8]),
        ex(aten.scalar_tensor.default, 2.0, dtype=F64),
        ex(aten.zeros_like.default, f(*X)),
        ex(aten.ones_like.default, f(*X)),
        ex(aten.empty_like.default, i(4, *X)),
        ex(aten.full_like.default, f(*X), 2.0),
        ex(aten.fill.Scalar, f(*X), 2.0),
        ex(aten.fill_.Scalar, f(*X), 2.0),
        ex(aten.zero_.default, f(*X)),
    ]


def _indexing() -> list[Example]:
    ids = i(4, 4, 8)
    return [
        ex(aten.embedding.default, f(16, 8), i(16, 4, 2)),
        ex(aten.embedding.default, f(16, 8), i(16, 8), 3),
        ex(aten.index.Tensor, f(4, 8), [i(4, 2, 4)]),
        ex(aten.index.Tensor, f(4, 8), [None, i(8, 4)]),
        ex(aten.index.Tensor, ids, [torch.arange(4).view(4, 1, 1, 1), torch.arange(8).view(1, 1, 8, 1)]),
        ex(aten.index.Tensor, f(4, 2, 8), [i(4, 4), None, i(8, 4)]),
        ex(aten.index.Tensor, f(4, 8), [mask(4)]),
        ex(aten.index.Tensor_hacked_twin, f(4, 8), [i(4, 4)]),
        ex(aten._unsafe_index.Tensor, f(4, 8), [None, i(8, 4)]),
        ex(aten.index_put.default, f(4, 8), [perm(4)], f(4, 8)),
        ex(aten.index_put.default, f(4, 8), [None, perm(8)], f(8)),
        ex(aten.index_put_.default, i(9, 8), [perm(8)], torch.arange(8)),
        ex(aten.index_put.hacked_twin, f(4, 8), [perm(4)], f(4, 8)),
        ex(aten.index_put_.hacked_twin, f(4, 8), [perm(4)], f(4, 8)),
        ex(aten._unsafe_index_put.default, f(4, 8), [i(4, 6)], f(6, 8), True),
        ex(aten.gather.default, f(4, 8), 1, i(8, 4, 4)),
        ex(aten.gather.default, f(4, 8), 0, i(4, 2, 8)),
        ex(aten.scatter.src, f(4, 8), 1, rows_perm(4, 8, 4), f(4, 4)),
        ex(aten.scatter.value, f(4, 8), 1, rows_perm(4, 8, 4), 2.0),
        ex(aten.scatter_add.default, f(4, 8), 1, i(8, 4, 4), f(4, 4)),
        ex(aten.scatter.reduce, f(4, 8), 1, rows_perm(4, 8, 4), f(4, 4), reduce="multiply"),
        ex(aten.scatter_reduce.two, f(4, 8), 1, i(8, 4, 4), f(4, 4), "amax"),
        ex(aten.scatter_.src, f(4, 8), 1, rows_perm(4, 8, 4), f(4, 4)),
        ex(aten.scatter_add_.default, f(4, 8), 1, i(8, 4, 4), f(4, 4)),
        ex(aten.index_select.default, f(4, 8), 1, i(8, 4)),
        ex(aten.index_add.default, f(4, 8), 0, i(4, 6), f(6, 8)),
        ex(aten.index_add_.default, f(4, 8), 1, i(8, 4), f(4, 4), alpha=2.0),
    ]


def _with_ignored(t: torch.Tensor) -> torch.Tensor:
    t = t.clone()
    t.view(-1)[::3] = -100
    return t


def _losses() -> list[Example]:
    logits = f(8, 6)
    return [
        ex(aten.cross_entropy_loss.default, logits, _with_ignored(i(6, 8))),
        ex(aten.cross_entropy_loss.default, logits, _with_ignored(i(6, 8)), pos(6), 1, -100, 0.1),
        ex(aten.cross_entropy_loss.default, logits, i(6, 8), None, 2),
        ex(aten.cross_entropy_loss.default, logits, i(6, 8), None, 0),
        ex(aten.cross_entropy_loss.default, f(4, 6, 2), _with_ignored(i(6, 4, 2))),
        ex(aten.cross_entropy_loss.default, logits, f(8, 6).softmax(-1)),
        ex(aten.nll_loss.default, logits.log_softmax(-1), _with_ignored(i(6, 8))),
        ex(aten.nll_loss_nd.default, logits.log_softmax(-1), i(6, 8), pos(6)),
        ex(aten.nll_loss2d.default, f(2, 6, 4, 4), i(6, 2, 4, 4), None, 2),
        ex(aten.mse_loss.default, f(*X), f(*X)),
        ex(aten.mse_loss.default, f(*X), f(*X), 2),
        ex(aten.l1_loss.default, f(*X), f(*X), 0),
    ]


def _moe() -> list[Example]:
    return [
        ex(aten.topk.default, f(4, 8), 2),
        ex(aten.topk.default, f(4, 8), 2, 0),
        ex(aten.sort.default, f(4, 8)),
        ex(aten.sort.stable, f(4, 8), stable=True, dim=0),
        ex(aten.argsort.default, f(4, 8)),
        ex(aten.argsort.stable, f(4, 8), stable=True),
        ex(aten.histc.default, unit(4, 8), 4, 0, 1),
        ex(aten.histc.default, unit(4, 8), 4),
        ex(aten.one_hot.default, i(4, 4, 2), 4),
        ex(aten.one_hot.default, torch.tensor([[0, 3], [1, 2], [3, 3], [2, 0]]), -1),
        ex(aten._grouped_mm.default, *_grouped_inputs(torch.float32, 16)),
        ex(aten._local_scalar_dense.default, f(1)),
        ex(aten.item.default, f(1)),
    ]


def _grouped_inputs(dtype: torch.dtype, width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sorted-by-expert rows (16 of them, every row routed) for 4 experts; one expert gets no row."""
    offs = torch.tensor([3, 9, 9, 16], dtype=torch.int32)
    return f(16, width).to(dtype), f(4, width, width).to(dtype), offs


EXAMPLES: list[Example] = (
    _pointwise() + _reductions() + _matmuls() + _attention() + _shapes() + _creation() + _indexing()
)
EXAMPLES += _losses() + _moe() + coverage_examples()

# Registry keys that are checked elsewhere: getitem needs a tuple-valued producer (test below); metadata ops
# compute no tensor; the transformers op needs transformers (its own test).
_ELSEWHERE = {"aten::sym_size.int", "aten::sym_size.default", "aten::sym_numel.default", "aten::sym_stride.int",
              "aten::sym_stride.default", "aten::sym_storage_offset.default", "aten::_assert_tensor_metadata.default",
              "aten::_assert_scalar.default", "aten::sym_constrain_range_for_size.default",
              "transformers::grouped_mm_fallback.default", operator.getitem}  # fmt: skip


def _key(op: Callable[..., Any]) -> object:
    return registry._key(op)


def _id(example: Example) -> str:
    op, args, _kwargs = example
    shapes = [tuple(a.shape) if isinstance(a, torch.Tensor) else a for a in args]
    return f"{op}{shapes}"[:90]


def test_every_registered_op_has_an_example() -> None:
    covered = {_key(op) for op, _, _ in EXAMPLES}
    missing = [t for t in registry.registered_targets() if t not in covered and t not in _ELSEWHERE]
    assert not missing, f"registered ops without a numeric example: {missing}"


def _assert_ok(report: Any) -> None:
    assert report.checks, f"no strategy checked: {report}"
    assert report.ok, str(report)


@pytest.fixture
def slow_only() -> None:
    """Marks the exhaustive checks (they run in CI; deselect locally with -m "not slow")."""


@pytest.mark.parametrize("example", EXAMPLES, ids=_id)
def test_rule(example: Example) -> None:
    """Every strategy on mesh (2,); a sample of 4 (first and last included) on (4,) and on (2, 2)."""
    op, args, kwargs = example
    _assert_ok(check_rule(op, args, (2,), kwargs=kwargs))
    _assert_ok(check_rule(op, args, (4,), kwargs=kwargs, max_strategies=4))
    _assert_ok(check_rule(op, args, (2, 2), kwargs=kwargs, max_strategies=4))


@pytest.mark.slow
@pytest.mark.parametrize("mesh", [(4,), (2, 2)], ids=str)
def test_rule_every_strategy(mesh: tuple[int, ...], slow_only: None) -> None:
    reports = [check_rule(op, args, mesh, kwargs=kwargs) for op, args, kwargs in EXAMPLES]
    failed = [str(r) for r in reports if not r.ok or not r.checks]
    assert not failed, "\n".join(failed)


@pytest.mark.parametrize("mesh", [(2,), (4,), (2, 2)], ids=str)
def test_getitem_of_tuple_outputs(mesh: tuple[int, ...]) -> None:
    """getitem's strategies are the producer's specs of that element; each one checks out."""
    topk, _ = build_node(aten.topk.default, (f(4, 8), 2))
    graph = topk.graph
    with graph.inserting_after(topk):
        item = graph.call_function(operator.getitem, (topk, 0))
    item.meta["val"] = topk.meta["val"][0]
    report = check_rule(item, [topk.meta["val"]], mesh)
    _assert_ok(report)
    produced = {str(s.outputs[0]) for s in registry.strategies_for(topk, mesh)}
    assert {c.strategy.split(" -> ")[1] for c in report.checks} == produced


@pytest.mark.parametrize("mesh", [(2,), (4,), (2, 2)], ids=str)
def test_grouped_mm_fallback(mesh: tuple[int, ...]) -> None:
    """transformers' grouped matmul (fp32 Mixtral experts): token, N, K and expert splits, in float64."""
    pytest.importorskip("transformers.integrations.moe")
    op = torch.ops.transformers.grouped_mm_fallback.default
    report = check_rule(op, _grouped_inputs(F64, 8), mesh, max_strategies=None if len(mesh) == 1 else 12)
    _assert_ok(report)
    assert any("S(0), R -> P" in c.strategy for c in report.checks) or len(mesh) > 1  # expert parallel


# -- the harness catches wrong rules ------------------------------------------------------------------------------


def _wrong(op: Callable[..., Any], args: tuple[Any, ...], spec: str) -> Any:
    """Check a hand-made (wrong) strategy on a 1-D mesh of 2."""
    from autoshard.placement import ShardingSpec
    from autoshard.strategies.strategy import OpStrategy
    from autoshard.strategies.validate import check_strategy

    node, values = build_node(op, args)
    ins, outs, grads = (tuple(ShardingSpec.parse(s) for s in part.split(";")) for part in spec.split("|"))
    return check_strategy(node, values, OpStrategy(ins, outs, grads, 2), (2,))


@pytest.mark.parametrize(
    ("op", "args", "spec", "stage"),
    [
        (aten._softmax.default, (f(4, 8), 1, False), "S(1)|S(1)|S(1)", "forward"),  # split softmax dim
        (aten.gelu.default, (f(4, 8),), "P|P|R", "forward"),  # Partial through a nonlinear op
        (aten.sum.dim_IntList, (f(4, 8), [1]), "S(1)|S(0)|S(1)", "forward"),  # a reduced dim is not kept
        (aten.mm.default, (f(4, 8), f(8, 4)), "S(1);S(0)|P|S(1);R", "backward"),  # wrong grad claim
        (aten.mul.Tensor, (f(4, 8), f(8)), "S(0);R|S(0)|S(0);R", "backward"),  # broadcast grad is Partial
    ],
    ids=["softmax-dim", "gelu-partial", "sum-kept", "mm-grad", "mul-broadcast-grad"],
)
def test_harness_rejects_wrong_strategies(
    op: Callable[..., Any], args: tuple[Any, ...], spec: str, stage: str
) -> None:
    check = _wrong(op, args, spec)
    assert not check.ok
    assert (check.forward_ok, check.backward_ok) == ((False, None) if stage == "forward" else (True, False))
