"""Shape-aware compute, the overlap model and the memory terms: relations, not magic numbers."""

from __future__ import annotations

import dataclasses

import pytest
from test_cost_compute import H100_BF16_GEMMS  # measured on one H100: (m, k, n) -> seconds

from cost_models import load_profile
from cost_models.compute import attention_time, compute_time, gemm_efficiency, matmul_time
from cost_models.memory import (
    PrecisionPolicy,
    gathered_weight_bytes,
    logits_bytes,
    microbatches_in_flight,
    transformer_activation_bytes,
)
from cost_models.overlap import (
    OverlapPolicy,
    bucket_layers,
    exposed_gradient_sync,
    exposed_prefetched_gathers,
    exposed_sync_repeated,
)

A100, H100, CPU = load_profile("a100x8"), load_profile("h100x8"), load_profile("cpu")


@pytest.mark.parametrize(("shape", "measured"), H100_BF16_GEMMS.items(), ids=lambda x: str(x))
def test_shaped_matmul_tracks_measured_h100_gemms(shape: tuple[int, int, int], measured: float) -> None:
    m, k, n = shape
    assert matmul_time(m, n, k, "bfloat16", H100) == pytest.approx(measured, rel=0.15)


def test_gemm_efficiency_is_a_fraction_near_one_for_large_products() -> None:
    assert gemm_efficiency(16384, 16384, A100, k=16384) > 0.97
    for m, n in ((129, 8192), (4096, 4096 + 1), (1000, 3000), (64, 64)):
        assert 0 < gemm_efficiency(m, n, A100, k=4096) <= 1
    assert gemm_efficiency(123, 457, CPU, k=99) == 1.0  # no tile in the CPU profile


def test_a_ragged_edge_or_a_partial_wave_costs_efficiency() -> None:
    whole = gemm_efficiency(128 * 108, 128, A100, k=4096)  # exactly one wave of whole tiles
    assert whole == pytest.approx(1.0)
    assert gemm_efficiency(128 * 108 + 1, 128, A100, k=4096) < whole  # a ragged edge opens a second wave
    # the shape costs time at equal FLOPs: a ragged product is slower per FLOP than a whole one
    m = 128 * 108
    ragged = matmul_time(m + 1, 128, 4096, "bfloat16", A100)
    even = matmul_time(m, 128, 4096, "bfloat16", A100)
    assert ragged / even > 1.1 > (m + 1) / m


def test_small_k_is_memory_bound_and_never_faster_than_its_bytes() -> None:
    t = matmul_time(8192, 8192, 16, "bfloat16", A100)
    nbytes = 2 * (8192 * 16 * 2 + 8192 * 8192)
    assert t == pytest.approx(compute_time(0, nbytes, "bfloat16", A100), rel=1e-9)


def test_fused_attention_uses_its_own_efficiency_and_causal_halves_it() -> None:
    full = attention_time(64, 4096, 4096, 128, "bfloat16", A100, causal=False)
    causal = attention_time(64, 4096, 4096, 128, "bfloat16", A100, causal=True)
    assert causal == pytest.approx(full / 2, rel=0.01)
    slower = dataclasses.replace(A100, compute=dataclasses.replace(A100.compute, attention_efficiency=0.2))
    assert attention_time(64, 4096, 4096, 128, "bfloat16", slower) > causal


def test_grad_sync_smaller_than_backward_exposes_only_the_last_bucket() -> None:
    """The acceptance relation: step ~ compute + the last bucket when each sync hides under the next layer."""
    layers, c, s = 12, 3e-3, 1e-3
    exposed = exposed_gradient_sync([c] * layers, [s] * layers, OverlapPolicy())
    assert exposed == pytest.approx(s)
    assert exposed == pytest.approx(exposed_sync_repeated(c, s, layers))
    assert exposed_gradient_sync([c] * layers, [s] * layers, OverlapPolicy(overlap_grad_sync=False)) == (
        pytest.approx(layers * s)
    )


def test_communication_bound_sync_is_the_comm_stream_not_the_sum() -> None:
    layers, c, s = 10, 1e-3, 2e-3
    exposed = exposed_gradient_sync([c] * layers, [s] * layers, OverlapPolicy())
    assert exposed == pytest.approx(exposed_sync_repeated(c, s, layers)) and exposed == pytest.approx(11e-3)
    assert (layers * c + exposed) == pytest.approx(c + layers * s)  # step = first backward + all syncs


def test_buckets_merge_small_layers_and_tail_compute_hides_the_last() -> None:
    assert bucket_layers([10, 10, 10, 30, 5], 25) == [[0, 1, 2], [3], [4]]
    policy = OverlapPolicy(bucket_bytes=25)
    merged = exposed_gradient_sync([1.0] * 5, [0.5] * 5, policy, grad_bytes=[10, 10, 10, 30, 5])
    per_layer = exposed_gradient_sync([1.0] * 5, [0.5] * 5, policy)
    assert merged >= per_layer  # bigger buckets start later
    assert exposed_gradient_sync([1.0] * 5, [0.5] * 5, policy, tail_compute=10.0) == 0.0


def test_prefetched_gathers_hide_under_the_previous_layer() -> None:
    assert exposed_prefetched_gathers([1.0] * 4, [2.0] * 4, prefetch=1) == pytest.approx(1.0)
    assert exposed_prefetched_gathers([3.0] * 4, [2.0] * 4, prefetch=1) == pytest.approx(3.0 + 3 * 1.0)
    assert exposed_prefetched_gathers([1.0] * 4, [2.0] * 4, prefetch=0) == pytest.approx(4.0)


def test_overlap_policy_validates_and_round_trips() -> None:
    with pytest.raises(ValueError, match="bucket_bytes"):
        OverlapPolicy(bucket_bytes=0)
    policy = OverlapPolicy(bucket_bytes=2**20, prefetch=2, async_tp=True)
    assert OverlapPolicy.from_json(dataclasses.asdict(policy)) == policy
    assert "TP async" in policy.describe()


def test_precision_policy_recipes() -> None:
    assert PrecisionPolicy().recipe().total == 16  # bf16 w + bf16 g + fp32 master, m, v (ZeRO's 16 Ψ)
    assert PrecisionPolicy(fp32_grad_accumulation=True).recipe().total == 18  # Megatron's main_grad
    fp32 = PrecisionPolicy(param_dtype="float32", grad_dtype="float32")
    assert fp32.recipe().total == 16 and fp32.recipe().optimizer == 8  # no master copy needed


def test_activation_memory_relations() -> None:
    args = (2048, 1, 6144, 64)
    none, sp = transformer_activation_bytes(*args, tp=8), transformer_activation_bytes(*args, 8, True)
    selective = transformer_activation_bytes(*args, 8, True, "selective")
    full = transformer_activation_bytes(*args, 8, True, "full")
    assert full < selective < sp < none
    assert transformer_activation_bytes(*args) == pytest.approx(8 * sp)  # SP divides everything by t
    assert microbatches_in_flight(8) == 8 and microbatches_in_flight(8, 3) > 8
    assert microbatches_in_flight(8, microbatches=4) == 4
    assert logits_bytes(4096, 32000, tp=8) == logits_bytes(4096, 32000) / 8
    assert gathered_weight_bytes(100.0, prefetch=1) == 200.0


@pytest.mark.parametrize("kind", ["all_reduce", "all_gather", "reduce_scatter"])
def test_bus_bandwidth_rises_with_message_size_and_halves_at_the_alpha_beta_knee(kind: str) -> None:
    """NCCL reaches its bus bandwidth only for large messages: the model's curve is the alpha-beta line,
    half the peak where the latency equals the transfer time (S½ = α · busbw / f)."""
    from cost_models.collectives import CollectiveGroup, alpha_beta, bus_bandwidth

    group = CollectiveGroup(members_per_node=8)
    sizes = [2.0**k for k in range(10, 34, 2)]
    curve = [bus_bandwidth(kind, s, group, A100) for s in sizes]
    assert curve == sorted(curve)
    peak = A100.intra_node.bus_bandwidth.of(kind)
    assert curve[-1] == pytest.approx(peak, rel=0.01) and curve[0] < 0.05 * peak
    (line,) = alpha_beta(kind, group, A100)
    knee = line.latency / line.seconds_per_byte
    assert bus_bandwidth(kind, knee, group, A100) == pytest.approx(peak / 2, rel=1e-9)
