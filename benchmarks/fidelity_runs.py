"""Published, measured training runs the cost model is checked against: configuration pinned, source cited.

Every figure below was read from its source (the file says so where it was not).  Two sources:

* **Korthikanti et al. 2022**, "Reducing Activation Recomputation in Large Transformer Models" (arXiv
  2205.05198), Table 5 (iteration times) and the memory figures quoted in REFERENCE.md: GPT models on A100
  80 GB (Selene, 8 GPUs per node, 8 x HDR 200 Gb/s), sequence 2048, vocabulary 51,200, micro-batch 1, bf16,
  Megatron-LM with its fused kernels and *unfused* attention (QK^T and .V as batched GEMMs with a fused
  scale-mask-softmax; FlashAttention was not yet in Megatron).  Two columns per model: full recomputation
  without sequence parallelism, and sequence parallelism + selective recomputation.  The 175B run interleaves
  3 model chunks per pipeline stage (REFERENCE.md); so, by inference from its memory figures, does 530B.
* **torchtitan, docs/performance.md** (github.com/pytorch/torchtitan): Llama 2 and Llama 3 with FSDP2 on 64
  A100 80 GB GPUs, bf16 parameters, fp32 gradient reduction (torchtitan's default ``mixed_precision_reduce``),
  FlashAttention through SDPA, per-GPU batch as listed; the published figure is WPS (tokens per second per
  GPU), turned into seconds per step as ``local batch x sequence / WPS``.  Activation checkpointing: "selective
  layer" checkpoints every second layer (torchtitan's default ``selective_ac_option = "2"``), "selective op"
  saves matmul and attention outputs except every second matmul (its op-level policy), "full" every layer.
  torchtitan ran eager (no torch.compile in these runs): its RMSNorm, SwiGLU and RoPE are separate
  elementwise kernels, as the captured graph has them.  The page names the GPUs but not the network;
  the 8 x HDR 200 Gb/s of a DGX A100 is assumed (a100x8.json).

Model shapes: REFERENCE.md (Llama 3) and the Llama 2 paper (Touvron et al. 2023, Table 1 / model card:
13B h 5120, 40 layers, 40 heads, FFN 13824; 70B h 8192, 80 layers, 64 heads with 8 KV heads, FFN 28672;
vocabulary 32,000, sequence 4096).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["FIT", "RUNS", "Model", "Run"]

Recompute = Literal["none", "selective", "selective_layer", "selective_op", "full"]


@dataclass(frozen=True, slots=True)
class Model:
    """A decoder-only transformer's shape."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    gated: bool  # SwiGLU (3 matrices) rather than a GELU MLP (2)
    biases: bool

    def layer_params(self) -> float:
        head_dim = self.hidden // self.heads
        attn = 2 * self.hidden * self.hidden + 2 * self.hidden * self.kv_heads * head_dim
        mlp = (3 if self.gated else 2) * self.hidden * self.ffn
        return float(attn + mlp)


@dataclass(frozen=True, slots=True)
class Run:
    """One published measurement and the configuration it ran with."""

    key: str
    model: Model
    source: str
    gpus: int
    tp: int
    pp: int
    dp: int
    fsdp: bool  # data parallel as FSDP / ZeRO-3 (True) or replicated (False)
    virtual_stages: int
    micro_batch: int
    global_batch: int
    seq: int
    recompute: Recompute
    sequence_parallel: bool
    fused_attention: bool
    fused_elementwise: bool  # Megatron's fused norm/bias/dropout kernels (True) or eager torch ops (False)
    fp32_grads: bool  # Megatron's fp32 main_grad buffer / torchtitan's fp32 reduction
    step_seconds: float
    memory_gib: tuple[tuple[str, float], ...] = ()  # (what, GiB) where published
    memory_micro_batch: int = 0  # the micro-batch the memory figures are for (0: micro_batch)

    @property
    def microbatches(self) -> int:
        return self.global_batch // (self.micro_batch * self.dp)


GPT_22B = Model("GPT 22B", 6144, 48, 64, 64, 4 * 6144, 51200, False, True)
GPT_175B = Model("GPT 175B", 12288, 96, 96, 96, 4 * 12288, 51200, False, True)
GPT_530B = Model("GPT 530B", 20480, 105, 128, 128, 4 * 20480, 51200, False, True)
GPT_1T = Model("GPT 1T", 25600, 128, 160, 160, 4 * 25600, 51200, False, True)
LLAMA3_8B = Model("Llama 3 8B", 4096, 32, 32, 8, 14336, 128256, True, False)
LLAMA3_70B = Model("Llama 3 70B", 8192, 80, 64, 8, 28672, 128256, True, False)
LLAMA2_13B = Model("Llama 2 13B", 5120, 40, 40, 40, 13824, 32000, True, False)
LLAMA2_70B = Model("Llama 2 70B", 8192, 80, 64, 8, 28672, 32000, True, False)

_K = "Korthikanti et al. 2022, Table 5"
_KM = "Korthikanti et al. 2022 via REFERENCE.md (first-stage GiB)"
_T = "torchtitan docs/performance.md"


def _megatron(
    key: str, m: Model, gpus: int, pp: int, v: int, batch: int, full: float, sel: float,
    state: float, act_none: float, act_sel: float, memory_micro_batch: int = 0,
) -> tuple[Run, Run]:  # fmt: skip
    common = dict(model=m, gpus=gpus, tp=8, pp=pp, dp=gpus // (8 * pp), fsdp=False, virtual_stages=v,
                  micro_batch=1, global_batch=batch, seq=2048, fused_attention=False, fused_elementwise=True,
                  fp32_grads=True, memory_micro_batch=memory_micro_batch)  # fmt: skip
    return (
        Run(f"{key} full", source=_K, recompute="full", sequence_parallel=False, step_seconds=full,
            memory_gib=(("params+optimizer", state), ("activations, no recompute", act_none)),
            **common),  # type: ignore[arg-type]
        Run(f"{key} SP+sel", source=_K, recompute="selective", sequence_parallel=True, step_seconds=sel,
            memory_gib=(("activations, SP+selective", act_sel),), **common),  # type: ignore[arg-type]
    )  # fmt: skip


def _titan(key: str, m: Model, seq: int, batch: int, recompute: Recompute, wps: float) -> Run:
    return Run(
        key, m, f"{_T} (WPS {wps:g})", gpus=64, tp=1, pp=1, dp=64, fsdp=True, virtual_stages=1,
        micro_batch=batch, global_batch=64 * batch, seq=seq, recompute=recompute, sequence_parallel=False,
        fused_attention=True, fused_elementwise=False, fp32_grads=True, step_seconds=batch * seq / wps,
    )  # fmt: skip


# 530B: interleaved with v = 3 is *inferred*, not read: REFERENCE.md names only 175B as interleaved, but both
# published 530B activation figures equal the 1F1B formula times (1 + (p-1)/(p v)) with v = 3 to four digits
# (86.13 x 1.3238 = 114.02 GiB; 17.43 x 1.3238 = 23.08), and 105 layers on 35 stages allow 3 chunks of one layer.
# The 22B memory figures are those of a micro-batch of 4 (its whole global batch): 34·s·b·h/t·l = 9.56 GiB
# holds exactly for b = 4, so the memory rows pin micro_batch 4 while Table 5's time is for micro-batch 1.
RUNS: tuple[Run, ...] = (
    *_megatron("22B", GPT_22B, 8, 1, 1, 4, 1.42, 1.10, 45.56, 59.25, 9.56, memory_micro_batch=4),
    *_megatron("175B", GPT_175B, 64, 8, 3, 64, 18.13, 13.75, 45.56, 66.84, 12.35),
    *_megatron("530B", GPT_530B, 280, 35, 3, 280, 49.05, 37.83, 31.64, 114.02, 23.08),
    *_megatron("1T", GPT_1T, 512, 64, 1, 512, 94.42, 71.49, 32.96, 131.25, 26.56),
    _titan("Llama3-8B sel-layer", LLAMA3_8B, 8192, 1, "selective_layer", 2904),
    _titan("Llama3-8B sel-op", LLAMA3_8B, 8192, 1, "selective_op", 2973),
    _titan("Llama3-70B full", LLAMA3_70B, 8192, 1, "full", 331),
    _titan("Llama2-13B none", LLAMA2_13B, 4096, 2, "none", 2162),
    _titan("Llama2-13B sel-layer", LLAMA2_13B, 4096, 2, "selective_layer", 1914),
    _titan("Llama2-13B sel-op", LLAMA2_13B, 4096, 2, "selective_op", 1904),
    _titan("Llama2-70B sel-op", LLAMA2_70B, 4096, 1, "selective_op", 355),
    _titan("Llama2-70B full", LLAMA2_70B, 4096, 2, "full", 353),
)

#: The runs the A100 profile's fitted parameters are fitted on; every other run is held out.
FIT: tuple[str, ...] = ("175B full", "175B SP+sel", "Llama3-8B sel-op", "Llama2-13B none")
