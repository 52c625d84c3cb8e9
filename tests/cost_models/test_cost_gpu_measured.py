"""What the lent H100 measured, as the cost model now prices it: unaligned GEMMs, the loss after the logits,
dtype casts, a product's two-operand backward, and a one-GPU ``autoshard profile`` document."""

from __future__ import annotations

import json

import pytest

from autoshard.capture.meta import TensorMeta
from autoshard.problem.elementwise import LAYER_NORM_BYTES, extra_seconds
from autoshard.problem.graph import NodeInfo
from autoshard.problem.hidden_ops import LOG_SOFTMAX_BYTES, UPCAST_BYTES, hidden_seconds
from autoshard.profiling import Measurements, profile_document
from autoshard.runtime.verify import cluster_for
from cost_models.compute import aligned, gemm_efficiency, matmul_time, row_alignment
from cost_models.profile import load_profile, parse_profile


def test_a_row_that_is_not_16_bytes_runs_at_the_measured_unaligned_rate() -> None:
    h100 = load_profile("h100x8")
    assert aligned(50304, 768, 2) and not aligned(50257, 768, 2) and not aligned(4096, 4097, 2)
    assert aligned(50257 * 8, 768, 2) and not aligned(50257, 768, 4)  # 16 bytes, not 8 elements
    padded, odd = (
        gemm_efficiency(8192, 50304, h100, k=768, itemsize=2),
        gemm_efficiency(8192, 50257, h100, k=768, itemsize=2),
    )
    assert odd == pytest.approx(padded * 0.164, rel=0.01)  # the measured median, h100x8.json
    # M is a count of rows: 8193 x 4096 x 4096 ran at the full rate on the H100
    assert matmul_time(8193, 4096, 4096, "bfloat16", h100) == pytest.approx(
        matmul_time(8192, 4096, 4096, "bfloat16", h100), rel=0.01
    )
    # measured: GPT-2's LM head (8192 x 768 x 50257) 6.97 ms forward on the H100; priced within 30%
    assert matmul_time(8192, 50257, 768, "bfloat16", h100) == pytest.approx(6.97e-3, rel=0.3)
    a100 = load_profile("a100x8")  # no measurement for the A100: no penalty
    assert a100.compute.unaligned_gemm_efficiency is None
    assert gemm_efficiency(8192, 50257, a100, k=768, itemsize=2) == gemm_efficiency(8192, 50257, a100, k=768)


def _node(
    op: str, dtype: str, shape: tuple[int, ...], *, output: bool = False, grad: bool = True
) -> NodeInfo:
    meta = TensorMeta(shape, dtype, 4 if dtype == "float32" else 2)
    return NodeInfo(
        name=op, op=op, target=f"aten.{op}.default", kind="op", fqn="", module="", inputs=("x",),
        input_outputs=(0,), outputs=(meta,), flops=0, requires_grad=grad, block=None, is_output=output,
    )  # fmt: skip


def test_the_loss_after_the_logits_and_a_cast_are_priced_as_measured() -> None:
    cluster = cluster_for("h100x8", 1)
    logits = _node("linear", "bfloat16", (4, 2048, 128256), output=True)
    elements = 4 * 2048 * 128256
    fwd, bwd = hidden_seconds(logits, (), 0.0, elements * 2.0, cluster, training=True)
    # measured on the H100 (second session): log_softmax 5.55 ms forward, 5.71 ms backward, the fp32 cast
    # each way 5.30 ms (two calls), the gradient's zero fill 1.27 ms: 8.9 forward, 9.0 backward
    assert 8e-3 < fwd < 10e-3 and 8e-3 < bwd < 10e-3
    assert fwd == pytest.approx(elements * (UPCAST_BYTES + LOG_SOFTMAX_BYTES) / 3.015e12, rel=0.01)
    assert hidden_seconds(logits, (), 0.0, elements * 2.0, cluster, training=False) == (0.0, 0.0)
    src = _node("mul", "bfloat16", (4096, 4096))
    cast = _node("to", "float32", (4096, 4096))
    moved, local = 4096 * 4096 * 6.0, 4096 * 4096 * 4.0
    # widening: torch's unvectorised conversion (UPCAST_BYTES per element); its backward narrows at the roofline
    assert hidden_seconds(cast, (src,), moved, local, cluster, training=True) == pytest.approx(
        (4096 * 4096 * UPCAST_BYTES / 3.015e12, moved / 3.015e12), rel=0.01
    )
    down = _node("to", "bfloat16", (4096, 4096))
    wide = _node("mul", "float32", (4096, 4096))
    assert hidden_seconds(down, (wide,), moved, local / 2, cluster, training=True) == pytest.approx(
        (moved / 3.015e12, 4096 * 4096 * UPCAST_BYTES / 3.015e12), rel=0.01
    )
    same = _node("to", "bfloat16", (4096, 4096))  # no dtype change: a view, free
    assert hidden_seconds(same, (src,), moved, 0.0, cluster, training=True) == (0.0, 0.0)


def test_one_gpu_profile_keeps_the_base_links_and_says_they_were_not_measured() -> None:
    m = Measurements(
        device="NVIDIA H100 80GB HBM3", dtype="bfloat16", ranks=1, gemm=[(1024, 23e-6), (4096, 176e-6), (8192, 1.4e-3)],
        stream=(2 * 2**30, 0.72e-3), launch=12e-6, capacity=85 * 10**9, multiprocessors=132,
    )  # fmt: skip
    doc = profile_document(m, "one_gpu", load_profile("h100x8"))
    profile = parse_profile(json.dumps(doc), "one_gpu")
    assert profile.devices_per_node == 8 and profile.intra_node.bus_bandwidth.all_reduce == 480e9
    assert "not measured (collectives need >= 2 ranks" in profile.source_of(
        "intra_node.bus_bandwidth.all_reduce"
    )
    assert profile.compute.multiprocessors == 132 and profile.compute.gemm_tile == 128
    assert profile.memory.runtime_reserve == 1e9 and profile.compute.peak("float16") == 989e12
    # the 1024^3 product (23 us, under twice the 12 us floor) is host-bound: tau is fitted on the others
    assert "[4096, 8192]" in profile.source_of("compute.efficiency_half_time")


def test_a_half_aligned_row_runs_at_twice_the_align1_rate() -> None:
    h100 = load_profile("h100x8")
    assert [row_alignment(n, 768, 2) for n in (50257, 30522, 4096)] == [2, 4, 16]
    full = gemm_efficiency(16384, 30528, h100, k=768)
    # measured: BERT's N = 30522 (4-byte rows) ran 0.334 x the padded rate, GPT-2's 50257 (2-byte) 0.161
    assert gemm_efficiency(16384, 30522, h100, k=768, itemsize=2) / full == pytest.approx(0.328, rel=0.02)
    odd = gemm_efficiency(8192, 50257, h100, k=768, itemsize=2)
    assert odd / gemm_efficiency(8192, 50257, h100, k=768) == pytest.approx(0.164)


def test_a_layer_norm_is_priced_at_its_measured_bytes_each_way() -> None:
    cluster = cluster_for("h100x8", 1)
    norm = _node("layer_norm", "bfloat16", (8, 1024, 768))
    elements = 8 * 1024 * 768
    fwd, bwd = extra_seconds(norm, (), elements * 4.0, elements * 2.0, cluster, training=True)
    roofline = elements * 4.0 / 3.015e12
    # measured on GPT-2 (H100): 19.2 us forward, 49.6 us backward per call; the base prices the roofline once
    assert fwd + roofline == pytest.approx(elements * LAYER_NORM_BYTES[0] / 3.015e12, rel=0.01)
    assert bwd + roofline == pytest.approx(elements * LAYER_NORM_BYTES[1] / 3.015e12, rel=0.01)
    assert 18e-6 < fwd + roofline < 21e-6 and 45e-6 < bwd + roofline < 52e-6
