"""Predict a published run's step time and memory from the cost model's functions, layer by layer.

A run (:class:`benchmarks.fidelity_runs.Run`) pins the parallel degrees, micro-batches and recomputation; this
module prices one micro-batch of one transformer layer on one device with :mod:`cost_models` alone, then
composes the step:

* GEMMs: :func:`cost_models.compute.matmul_time` per product with its local shape (forward M x N x K, the two
  backward products dX = dY·Wᵀ and dW = dYᵀ·X with theirs), tile/wave quantisation included;
* attention: fused (FlashAttention; backward 2.5x the forward's FLOPs, five products against two) with
  :func:`~cost_models.compute.attention_time`, or Megatron's unfused batched GEMMs plus a memory-bound
  scale-mask-softmax and dropout;
* norms, residual adds, dropout, activation functions, RoPE: memory-bound at the achieved HBM bandwidth
  (one op each, at least the launch floor);
* tensor / sequence parallel collectives exposed (:mod:`cost_models.overlap`, item 1), re-issued under full
  recomputation;
* FSDP: all-gathers prefetched under the previous layer, gradient reduce-scatters overlapped with the rest
  of backward (:mod:`cost_models.overlap`, items 2-3);
* pipeline: 1F1B composed analytically, ``(m + (p-1)/v)`` stage-micro-batch slots plus the LM head on the last
  stage and the exposed stage-to-stage sends (the pipeline engineer's stage pricing replaces this later);
* optimizer: Adam, memory-bound over 32 bytes per local parameter.

Memory (Megatron's first stage): :func:`cost_models.memory.transformer_activation_bytes` times layers per
stage times :func:`~cost_models.memory.microbatches_in_flight`; parameters and optimizer state with Megatron's
precision policy (bf16 weights, fp32 main gradients, fp32 master + Adam: 18 bytes per parameter).
"""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks.fidelity_runs import Run
from cost_models.collectives import CollectiveGroup, collective_time
from cost_models.compute import attention_time, compute_time, matmul_time
from cost_models.memory import (
    PrecisionPolicy,
    microbatches_in_flight,
    transformer_activation_bytes,
)
from cost_models.overlap import exposed_prefetched_gathers, exposed_sync_repeated
from cost_models.profile import HardwareProfile

__all__ = ["LayerTimes", "layer_times", "predict_memory", "predict_step"]

BF16 = "bfloat16"
ADAM_BYTES_PER_PARAM = 32  # read weight, fp32 grad, master, m, v (18 B... 20 B) and write four of them back
FLASH_BACKWARD = 2.5  # FlashAttention-2 paper (Dao 2023): backward runs 5 products to the forward's 2


@dataclass(frozen=True, slots=True)
class LayerTimes:
    """One transformer layer, one micro-batch, one device (seconds)."""

    gemm_fwd: float
    gemm_bwd: float
    attn_fwd: float
    attn_bwd: float
    elem_fwd: float
    elem_bwd: float
    tp_fwd: float  # exposed tensor/sequence-parallel collectives, forward
    tp_bwd: float

    @property
    def forward(self) -> float:
        return self.gemm_fwd + self.attn_fwd + self.elem_fwd

    @property
    def backward(self) -> float:
        return self.gemm_bwd + self.attn_bwd + self.elem_bwd

    def recompute(self, policy: str) -> float:
        """Extra backward time of the recomputation policy (compute plus re-issued collectives)."""
        full = self.forward + self.tp_fwd
        if policy == "full":
            return full
        if policy == "selective_layer":  # every second layer fully recomputed
            return full / 2
        if policy == "selective":  # Korthikanti: the attention core only
            return self.attn_fwd
        if policy == "selective_op":  # torchtitan: all but matmul/attention outputs, every second matmul
            return self.elem_fwd + self.gemm_fwd / 2
        return 0.0


def _gemm(m: int, n: int, k: int, p: HardwareProfile) -> tuple[float, float]:
    """(forward, backward) of Y[m,n] = X[m,k] · W[k,n]: backward dX[m,k] (contract n) + dW[k,n] (contract m)."""
    return matmul_time(m, n, k, BF16, p), matmul_time(m, k, n, BF16, p) + matmul_time(k, n, m, BF16, p)


def _elementwise(nbytes: float, p: HardwareProfile) -> float:
    return compute_time(0.0, nbytes, BF16, p)


def _fused_elementwise(dropout: bool, region: float, ffn: float, gated: bool, rope: float) -> list[float]:
    """Bytes of each memory-bound kernel of a layer with Megatron's fused kernels (one pass per op)."""
    elem = [2 * region, 2 * region]  # two LayerNorms: read + write
    elem += [3.5 * region] * 2 if dropout else [3 * region] * 2  # bias-dropout-add (mask: 1 byte)
    elem.append(3 * ffn if gated else 2 * ffn)  # SwiGLU or bias-GELU
    if not dropout:
        elem.append(2 * rope)
    return elem


def _eager(region: float, ffn: float, rope: float) -> list[float]:
    """Bytes of each kernel eager torch runs for a Llama layer (torchtitan's modules, fp32 where they upcast).

    RMSNorm: float(), pow, mean, (+eps, rsqrt: tiny), mul, type_as, mul weight; SwiGLU: silu, mul; RoPE on
    q and k: float(), complex mul, type_as; two residual adds.
    """
    a = region
    norm = [3 * a, 4 * a, 2 * a, 0.0, 0.0, 4 * a, 3 * a, 2 * a]
    return [*norm, *norm, 2 * ffn, 3 * ffn, 3 * rope, 4 * rope, 3 * rope, 3 * a, 3 * a]


def layer_times(run: Run, p: HardwareProfile) -> LayerTimes:
    m, t = run.model, run.tp
    tokens = run.micro_batch * run.seq
    hd = m.hidden // m.heads
    kv = m.kv_heads * hd
    shapes = [(tokens, m.hidden // t, m.hidden), (tokens, kv // t, m.hidden), (tokens, kv // t, m.hidden)]
    if m.biases:  # Megatron: one fused QKV product
        shapes = [(tokens, (m.hidden + 2 * kv) // t, m.hidden)]
    shapes.append((tokens, m.hidden, m.hidden // t))  # attention output projection
    shapes += [(tokens, m.ffn // t, m.hidden)] * (2 if m.gated else 1)  # MLP up (and gate)
    shapes.append((tokens, m.hidden, m.ffn // t))  # MLP down
    gemms = [_gemm(a, b, c, p) for a, b, c in shapes]
    heads = run.micro_batch * m.heads // t
    if run.fused_attention:
        attn_fwd = attention_time(heads, run.seq, run.seq, hd, BF16, p, causal=True)
        attn_bwd = FLASH_BACKWARD * attn_fwd
    else:  # batched QK^T and ·V over full S x S scores, fused scale-mask-softmax, dropout
        qk = matmul_time(run.seq, run.seq, hd, BF16, p, batch=heads)
        pv = matmul_time(run.seq, hd, run.seq, BF16, p, batch=heads)
        scores = heads * run.seq * run.seq
        softmax = _elementwise(2 * 2.0 * scores, p) + _elementwise((2 + 1 + 2) * scores, p)
        attn_fwd = qk + pv + softmax
        attn_bwd = 2 * (qk + pv) + 2 * softmax
    act = 2.0 * tokens * m.hidden  # bytes of one (tokens, hidden) bf16 activation
    region = act / t if run.sequence_parallel else act  # norms, residuals, dropout run split under SP
    ffn = 2.0 * tokens * m.ffn / t
    rope = 2.0 * tokens * (m.hidden + kv) / t  # q and k
    elem = (
        _fused_elementwise(m.biases, region, ffn, m.gated, rope)
        if run.fused_elementwise
        else _eager(region, ffn, rope)
    )
    elem_fwd = sum(_elementwise(b, p) for b in elem)
    elem_bwd = sum(_elementwise(2 * b, p) for b in elem)
    tp_fwd = tp_bwd = 0.0
    if t > 1:
        group = CollectiveGroup(members_per_node=t)
        if run.sequence_parallel:
            pair = collective_time("all_gather", act, group, p) + collective_time(
                "reduce_scatter", act, group, p
            )
            tp_fwd = tp_bwd = 2 * pair
        else:
            tp_fwd = tp_bwd = 2 * collective_time("all_reduce", act, group, p)
    return LayerTimes(
        gemm_fwd=sum(f for f, _ in gemms),
        gemm_bwd=sum(b for _, b in gemms),
        attn_fwd=attn_fwd,
        attn_bwd=attn_bwd,
        elem_fwd=elem_fwd,
        elem_bwd=elem_bwd,
        tp_fwd=tp_fwd,
        tp_bwd=tp_bwd,
    )


def _head(run: Run, p: HardwareProfile) -> float:
    """LM head + fp32 cross-entropy of one micro-batch, forward and backward."""
    m, t = run.model, run.tp
    tokens = run.micro_batch * run.seq
    fwd, bwd = _gemm(tokens, m.vocab // t, m.hidden, p)
    # fp32 logits: upcast, softmax, gradient (fused in Megatron; eager: upcast, log_softmax, nll and back)
    loss = _elementwise((16.0 if run.fused_elementwise else 32.0) * tokens * m.vocab / t, p)
    comm = 0.0
    if t > 1:  # the head's input gradient is reduced over the tensor-parallel group
        comm = collective_time("all_reduce", 2.0 * tokens * m.hidden, CollectiveGroup(t), p)
    return fwd + bwd + loss + comm


def _group(ranks: int, p: HardwareProfile) -> CollectiveGroup:
    k = min(ranks, p.devices_per_node)
    return CollectiveGroup(members_per_node=k, nodes=max(1, ranks // k))


def predict_step(run: Run, p: HardwareProfile) -> float:
    """Seconds of one training step of ``run`` on profile ``p`` (module docstring)."""
    m = run.model
    lt = layer_times(run, p)
    extra = lt.recompute(run.recompute)
    layer = lt.forward + lt.backward + extra + lt.tp_fwd + lt.tp_bwd
    head = _head(run, p)
    layers_per_stage = m.layers / run.pp
    params_per_device = (m.layers * m.layer_params() / run.pp + m.vocab * m.hidden) / run.tp
    if run.fsdp:
        params_per_device /= run.dp
    optimizer = _elementwise(ADAM_BYTES_PER_PARAM * params_per_device, p)
    if run.fsdp:
        group = _group(run.dp, p)
        gather = collective_time("all_gather", 2.0 * m.layer_params(), group, p)
        reduce = collective_time(
            "reduce_scatter", (4.0 if run.fp32_grads else 2.0) * m.layer_params(), group, p
        )
        fwd = exposed_prefetched_gathers([gather] * m.layers, [lt.forward] * m.layers, prefetch=1)
        # backward re-gathers (reshard after forward) and reduce-scatters, both hidden by the next layer
        bwd = exposed_sync_repeated(lt.backward + extra, gather + reduce, m.layers)
        return m.layers * (lt.forward + lt.backward + extra) + head + fwd + bwd + optimizer
    mb = run.microbatches
    if run.pp == 1:
        return mb * (m.layers * layer + head) + optimizer
    v = run.virtual_stages
    stage = layers_per_stage * layer
    send = 2.0 * run.micro_batch * run.seq * m.hidden / run.tp  # Megatron scatters the send over TP ranks
    net = p.inter_node.bandwidth_per_device(p.devices_per_node)
    # 1F1B's steady state pairs each activation sent forward with a gradient received backward in one
    # batched p2p call (Megatron's send_forward_recv_backward); the link is full duplex: one transfer time
    p2p = v * (p.inter_node.step_latency + send / net)
    return (mb + (run.pp - 1) / v) * (stage + p2p) + mb * head + optimizer


def predict_memory(run: Run) -> tuple[tuple[str, float], ...]:
    """Predicted GiB of each published memory figure of ``run`` (Megatron's first pipeline stage)."""
    m = run.model
    layers = m.layers // run.pp
    b = run.memory_micro_batch or run.micro_batch
    held = microbatches_in_flight(run.pp, run.virtual_stages, run.microbatches) if run.pp > 1 else 1.0
    policy = PrecisionPolicy(fp32_grad_accumulation=run.fp32_grads)
    out: list[tuple[str, float]] = []
    for what, _ in run.memory_gib:
        if what == "params+optimizer":
            value = m.layer_params() * layers / run.tp * policy.recipe().total
        else:
            sp, rc = ("SP" in what, "selective" if "selective" in what else "none")
            per_layer = transformer_activation_bytes(run.seq, b, m.hidden, m.heads, run.tp, sp, rc)
            value = per_layer * layers * held
        out.append((what, value / 2**30))
    return tuple(out)
