"""Records and small helpers of the capture stage: TensorMeta, BlockInfo, module-path normalisation."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from autoshard.capture.annotate import normalize_module_path
from autoshard.capture.meta import BlockInfo, TensorMeta, tensor_meta_of


def test_tensor_meta_sizes_and_notation() -> None:
    meta = TensorMeta((2, 16, 64), "bfloat16", 2)
    assert meta.numel == 2048 and meta.nbytes == 4096 and meta.ndim == 3
    assert str(meta) == "bfloat16[2, 16, 64]"
    assert meta.is_floating and not TensorMeta((3,), "int64", 8).is_floating
    assert TensorMeta((), "float32", 4).numel == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        meta.shape = (1,)  # type: ignore[misc]


def test_tensor_meta_validates() -> None:
    with pytest.raises(ValueError, match="negative dim"):
        TensorMeta((2, -3), "float32", 4)
    with pytest.raises(ValueError, match="itemsize"):
        TensorMeta((2,), "float32", 0)


def test_tensor_meta_of_values() -> None:
    assert tensor_meta_of(torch.zeros(3, 4, dtype=torch.int64)) == TensorMeta((3, 4), "int64", 8)
    assert tensor_meta_of(torch.zeros(2, device="meta", dtype=torch.bfloat16)) == TensorMeta(
        (2,), "bfloat16", 2
    )
    values, indices = torch.zeros(5).topk(2)
    assert tensor_meta_of((values, indices, 3)) == (
        TensorMeta((2,), "float32", 4),
        TensorMeta((2,), "int64", 8),
        None,
    )
    assert tensor_meta_of(7) is None


@pytest.mark.parametrize(
    ("raw", "fqn"),
    [
        ("model.layers.3.mlp", "model.layers.3.mlp"),
        ("L['self'].model.layers[3].mlp", "model.layers.3.mlp"),
        ("L['self'].model._modules['layers']._modules['3'].mlp", "model.layers.3.mlp"),
        ("getattr(L['self'].model.layers, '3').mlp", "model.layers.3.mlp"),
        ("getattr(getattr(L['self'], 'model').layers, '3')", "model.layers.3"),
        ("L__self__.encoder.layer.0", "encoder.layer.0"),
        ("self.h.11.attn", "h.11.attn"),
        ("lin@1", "lin"),
        ("", ""),
    ],
)
def test_normalize_module_path(raw: str, fqn: str) -> None:
    assert normalize_module_path(raw) == fqn


def test_block_info() -> None:
    info = BlockInfo(
        "model.layers",
        32,
        2,
        69,
        "LlamaDecoderLayer",
        {"mlp.up_proj.weight": TensorMeta((8, 4), "bfloat16", 2)},
        10,
    )
    assert info.fqn(7, "mlp.up_proj.weight") == "model.layers.7.mlp.up_proj.weight"
    assert str(info) == "model.layers: 32 x LlamaDecoderLayer (2 captured, 69 nodes each)"
    with pytest.raises(ValueError, match=r"captured_blocks=3 must lie in 1\.\.2"):
        BlockInfo("x", 2, 3, 1, "X", {}, 0)
