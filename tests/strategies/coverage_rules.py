"""Numeric examples for the coverage rules (convolutions, pooling, resampling, norms, complex views, copies).

Imported by ``test_strategies_numeric.py``, which runs every example through the harness on meshes (2,),
(4,) and (2, 2).  Shapes keep at least 4 along batch and channels so every test mesh can split them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

aten = torch.ops.aten
F64 = torch.float64
_GEN = torch.Generator().manual_seed(4321)

Example = tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]


def f(*shape: int) -> torch.Tensor:
    return torch.randn(shape, generator=_GEN, dtype=F64)


def pos(*shape: int) -> torch.Tensor:
    return torch.rand(shape, generator=_GEN, dtype=F64) + 0.5


def ex(op: Callable[..., Any], *args: Any, **kwargs: Any) -> Example:
    return (op, args, kwargs)


def _conv() -> list[Example]:
    return [
        ex(aten.conv1d.default, f(4, 4, 6), f(8, 4, 3), f(8), [1], [1]),
        ex(aten.conv1d.padding, f(4, 4, 6), f(8, 4, 3), None, [1], "same"),
        ex(aten.conv2d.default, f(4, 4, 5, 5), f(8, 4, 3, 3), f(8), [1, 1], [1, 1]),
        ex(aten.conv2d.default, f(4, 5, 5), f(8, 4, 3, 3)),  # unbatched input
        ex(aten.conv2d.default, f(4, 4, 5, 5), f(8, 2, 3, 3), None, [2, 2], [0, 0], [1, 1], 2),  # grouped
        ex(aten.conv2d.padding, f(4, 4, 5, 5), f(4, 4, 3, 3), f(4), [1, 1], "same"),
        ex(aten.conv3d.default, f(4, 4, 3, 3, 3), f(4, 4, 1, 1, 1), f(4)),
        ex(aten.conv1d.padding, f(4, 4, 6), f(4, 4, 1), f(4)),
        ex(aten.conv3d.padding, f(4, 4, 3, 3, 3), f(4, 4, 1, 1, 1), f(4)),
        ex(aten.conv_transpose1d.default, f(4, 4, 5), f(4, 8, 2), f(8), [2]),
        ex(aten.conv_transpose2d.input, f(4, 4, 3, 3), f(4, 8, 2, 2), f(8), [2, 2]),
        ex(aten.conv_transpose3d.input, f(4, 4, 2, 2, 2), f(4, 4, 2, 2, 2), None),
        ex(aten.convolution.default, f(4, 4, 5, 5), f(8, 4, 3, 3), f(8), [1, 1], [1, 1], [1, 1], False, [0, 0], 1),
        ex(aten.convolution.default, f(4, 4, 3, 3), f(4, 8, 2, 2), None, [2, 2], [0, 0], [1, 1], True, [0, 0], 1),
    ]  # fmt: skip


def _pool() -> list[Example]:
    x = f(4, 4, 6, 6)
    return [
        ex(aten.max_pool1d.default, f(4, 4, 6), [2]),
        ex(aten.max_pool2d.default, x, [2, 2]),
        ex(aten.max_pool3d.default, f(4, 4, 2, 4, 4), [2, 2, 2]),
        ex(aten.max_pool2d_with_indices.default, x, [3, 3], [2, 2], [1, 1]),
        ex(aten.max_pool3d_with_indices.default, f(4, 4, 2, 4, 4), [2, 2, 2]),
        ex(aten.max_pool1d_with_indices.default, f(4, 4, 6), [3], [2]),
        ex(aten.adaptive_max_pool1d.default, f(4, 4, 6), [3]),
        ex(aten.adaptive_max_pool2d.default, x, [3, 2]),
        ex(aten.adaptive_max_pool3d.default, f(4, 4, 2, 4, 4), [1, 2, 2]),
        ex(aten.avg_pool1d.default, f(4, 4, 6), [2]),
        ex(aten.avg_pool2d.default, x, [3, 3], [2, 2], [1, 1]),
        ex(aten.avg_pool3d.default, f(4, 4, 2, 4, 4), [2, 2, 2]),
        ex(aten.adaptive_avg_pool1d.default, f(4, 4, 6), [4]),
        ex(aten.adaptive_avg_pool2d.default, x, [1, 1]),
        ex(aten.adaptive_avg_pool3d.default, f(4, 4, 2, 4, 4), [1, 2, 2]),
        ex(aten._adaptive_avg_pool2d.default, x, [3, 3]),
        ex(aten._adaptive_avg_pool3d.default, f(4, 4, 2, 4, 4), [1, 1, 1]),
    ]


def _resample() -> list[Example]:
    x = f(4, 4, 3, 3)
    return [
        ex(aten.upsample_nearest1d.vec, f(4, 4, 3), None, [2.0]),
        ex(aten.upsample_nearest2d.vec, x, None, [2.0, 2.0]),
        ex(aten.upsample_nearest3d.vec, f(4, 4, 2, 2, 2), [4, 4, 4], None),
        ex(aten.upsample_nearest1d.default, f(4, 4, 3), [6]),
        ex(aten.upsample_nearest2d.default, x, [6, 5]),
        ex(aten.upsample_nearest3d.default, f(4, 4, 2, 2, 2), [3, 3, 3]),
        ex(aten._upsample_nearest_exact1d.vec, f(4, 4, 3), [5], None),
        ex(aten._upsample_nearest_exact2d.vec, x, [5, 5], None),
        ex(aten._upsample_nearest_exact3d.vec, f(4, 4, 2, 2, 2), [3, 3, 3], None),
        ex(aten.upsample_linear1d.vec, f(4, 4, 3), [5], False, None),
        ex(aten.upsample_bilinear2d.vec, x, [6, 6], True, None),
        ex(aten.upsample_bilinear2d.default, x, [5, 4], False),
        ex(aten.upsample_trilinear3d.vec, f(4, 4, 2, 2, 2), None, False, [2.0, 2.0, 2.0]),
        ex(aten.upsample_bicubic2d.vec, x, [5, 5], False, None),
        ex(aten._upsample_bilinear2d_aa.vec, x, [2, 2], False, None),
    ]


def _norms() -> list[Example]:
    x = f(4, 4, 3, 3)
    return [
        ex(aten.batch_norm.default, x, f(4), f(4), f(4), pos(4), False, 0.1, 1e-5, False),
        ex(aten.batch_norm.default, x, f(4), f(4), f(4), pos(4), True, 0.1, 1e-5, False),
        ex(aten.batch_norm.default, f(4, 4), None, None, None, None, True, 0.1, 1e-5, False),
        ex(aten.instance_norm.default, x, f(4), f(4), None, None, True, 0.1, 1e-5, False),
        ex(aten.instance_norm.default, x, None, None, f(4), pos(4), False, 0.1, 1e-5, False),
        ex(aten.group_norm.default, x, 2, f(4), f(4), 1e-5),
        ex(aten.group_norm.default, f(4, 4, 6), 4),
        ex(aten.group_norm.default, f(4, 8, 3), 4, f(8), f(8)),  # channels split in whole groups
    ]


def _complex_and_copies() -> list[Example]:
    z = torch.complex(f(4, 2, 4), f(4, 2, 4))
    return [
        ex(aten.view_as_complex.default, f(4, 2, 4, 2)),
        ex(aten.view_as_real.default, z),
        ex(aten.mul.Tensor, z, torch.complex(f(2, 4), f(2, 4))),  # RoPE's rotation
        ex(aten.add.Tensor, z, z.conj().resolve_conj()),
        ex(aten.numpy_T.default, f(4, 2, 8)),
        ex(aten.mT.default, f(4, 2, 8)),
        ex(aten.repeat_interleave.self_int, f(4, 2, 8), 2, 1),
        ex(aten.repeat_interleave.self_int, f(4, 8), 3, None),
        ex(aten.repeat_interleave.self_int, f(4, 8), 2, 0, output_size=8),
        ex(aten.copy_.default, f(4, 2, 8), f(2, 8)),
        ex(aten.copy_.default, f(4, 8), f(4, 8).float()),
        ex(aten.copy.default, f(4, 8), f(8)),
        ex(aten.scatter_.value, f(4, 8), 1, torch.tensor([[0], [3], [5], [7]]), 1.0),
        ex(aten.scatter_reduce_.two, f(4, 8), 1, torch.tensor([[0, 1], [3, 3], [5, 2], [7, 0]]), f(4, 2), "sum"),
        ex(aten.slice_scatter.default, f(4, 2, 8), f(4, 2, 3), 2, 5, 8),
        ex(aten.slice_scatter.default, f(4, 2, 8), f(4, 2, 4), -1, 0, 8, 2),
        ex(aten.pad.default, f(4, 4, 6), [1, 1], "reflect"),
        ex(aten.pad.default, f(4, 4, 6), [2, 1], "replicate"),
    ]  # fmt: skip


def _experts() -> list[Example]:
    """The fused expert MLP on aten's grouped matmul (float32 on CPU): 16 sorted rows, 4 experts, one empty."""
    from autoshard.capture.experts import expert_mlp

    offs = torch.tensor([3, 9, 9, 16], dtype=torch.int32)
    x, gate_up, down = f(16, 8).float(), f(4, 8, 32).float(), f(4, 16, 8).float()
    return [
        ex(expert_mlp, x, gate_up, down, offs, aten.silu.default, True),
        ex(expert_mlp, x, gate_up, down, offs, aten.gelu.default, True),
        *_routed_experts(),
    ]


def _routed_experts() -> list[Example]:
    """The routed-experts block (capture.dispatch) on aten's grouped matmul: 8 tokens, top-2 of 4 experts,
    expert 3 never chosen; the all-to-all strategy talks to other ranks and is checked on gloo instead
    (tests/runtime/test_runtime_moe.py)."""
    from autoshard.capture.dispatch import routed_experts

    hidden, gate_up, down = f(8, 8).float(), f(4, 8, 32).float(), f(4, 16, 8).float()
    index = torch.tensor([[0, 1], [2, 0], [1, 2], [0, 2], [1, 0], [2, 1], [0, 1], [1, 2]])
    weights = pos(8, 2).float()
    return [ex(routed_experts, hidden, gate_up, down, index, weights, aten.silu.default, True)]


def coverage_examples() -> list[Example]:
    return _conv() + _pool() + _resample() + _norms() + _complex_and_copies() + _experts()
