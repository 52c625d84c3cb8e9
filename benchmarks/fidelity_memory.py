"""Peak memory from a source the memory formulas do not come from: torchtitan's measured H100 runs, planned.

Source: torchtitan, ``benchmarks/llama3_h100_202412_torchtitan.md`` (github.com/pytorch/torchtitan, commit
31a17bf; runs of 2024-12 on Grand Teton hosts: 8 x H100 96 GB HBM2e per host, NVLink, 400 Gb/s RDMA per
GPU).  Memory(GiB) is the maximum over GPUs of the peak the run logged (steady over training, per the page).
The rows taken are the ones autoshard can express:

* Table 1, "FSDP": Llama 3.1 8B, FSDP on 8 GPUs, local batch 2, sequence 8192, selective activation
  checkpointing (torchtitan's default op-level policy), eager: **82.4 GiB**;
* Table 3, "FSDP": the same on 128 GPUs: **67.0 GiB**;
* Table 4, "2D": Llama 3.1 70B, FSDP 32 x TP 8 on 256 GPUs, local batch 16, full activation checkpointing,
  torch.compile + Float8 linears: **71.9 GiB** (compile and Float8 change compute more than memory: the
  8B rows of Table 1 differ by 7%, eager against compile).

Left out: the torch.compile rows where an eager twin exists (compile fuses elementwise ops and frees their
outputs; autoshard prices eager graphs), the context-parallel rows (Tables 2, 6: zig-zag CP is another
engineer's room) and the 405B pipeline rows (Table 5: the page gives neither the microbatch count nor the
chunks per rank).

Each run is planned by ``autoshard.plan`` on the meta device (Hugging Face ``LlamaForCausalLM`` from the
Llama 3.1 config, bf16) on ``h100x8`` with the published layout pinned: every weight sharded on dim 0 over
the FSDP axis (FSDP2), the batch split over it, and for the 2D run Megatron's column / row split on the
node's 8 GPUs; recomputation as published; ``memory_limit=inf`` so nothing is bent to fit.  The prediction
is the plan's ``memory_per_device``: the solver's per-node memory (parameters, gradients, Adam state at 16
bytes per parameter: torchtitan's fp32 sharded parameters, fp32 gradients and two fp32 moments are 16
bytes too; activations kept for backward) plus :func:`autoshard.problem.extras.extra_memory` (runtime
reserve, gathered FSDP weights, largest temporary).  Nothing in it was fitted to these rows: they are all
held out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["TITAN_MEMORY", "MemoryRun", "memory_case", "planned_memory"]

_SOURCE = "torchtitan benchmarks/llama3_h100_202412_torchtitan.md"


@dataclass(frozen=True, slots=True)
class MemoryRun:
    """One published peak-memory measurement and the configuration it ran with."""

    key: str
    source: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    fsdp: int
    tp: int
    local_batch: int
    seq: int
    recompute: str  # autoshard's policy name
    measured_gib: float


TITAN_MEMORY: tuple[MemoryRun, ...] = (
    MemoryRun("Llama3.1-8B FSDP 8", f"{_SOURCE}, Table 1 (FSDP)", 4096, 32, 32, 8, 14336, 8, 1, 2, 8192,
              "selective", 82.4),
    MemoryRun("Llama3.1-8B FSDP 128", f"{_SOURCE}, Table 3 (FSDP)", 4096, 32, 32, 8, 14336, 128, 1, 2, 8192,
              "selective", 67.0),
    MemoryRun("Llama3.1-70B FSDP 32 x TP 8", f"{_SOURCE}, Table 4 (2D)", 8192, 80, 64, 8, 28672, 32, 8, 16,
              8192, "full", 71.9),
)  # fmt: skip

_COLUMN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
_ROW = ("o_proj", "down_proj")


def _pins(run: MemoryRun) -> dict[str, Any]:
    if run.tp == 1:  # FSDP2: every parameter sharded on dim 0, the batch split over the same ranks
        return {"input_ids": "S(0)", "*.weight": ("S(0)",)}
    pins: dict[str, Any] = {"input_ids": "(S(0), R)"}
    pins.update({f"*.{m}": "column" for m in _COLUMN})
    pins.update({f"*.{m}": "row" for m in _ROW})
    pins.update({f"*.{m}.weight": "(S(0), S(0))" for m in _COLUMN})  # FSDP dim 0, TP output features
    pins.update({f"*.{m}.weight": "(S(0), S(1))" for m in _ROW})  # FSDP dim 0, TP input features
    return pins


def memory_case(key: str) -> dict[str, Any]:
    """Plan run ``key`` (child process): predicted GiB per device and the plan's memory breakdown."""
    import torch
    import transformers

    import autoshard

    run = next(r for r in TITAN_MEMORY if r.key == key)
    config = transformers.LlamaConfig(  # type: ignore[call-arg]
        hidden_size=run.hidden, intermediate_size=run.ffn, num_hidden_layers=run.layers,
        num_attention_heads=run.heads, num_key_value_heads=run.kv_heads, vocab_size=128256,
        max_position_embeddings=run.seq, rope_theta=500000.0, use_cache=False, attn_implementation="sdpa",
        bos_token_id=128000, eos_token_id=128001,
    )  # fmt: skip
    with torch.device("meta"):
        model: torch.nn.Module = transformers.LlamaForCausalLM(config)
        model = model.to(torch.bfloat16)
    gpus = run.fsdp * run.tp
    ids = torch.zeros((run.local_batch * run.fsdp, run.seq), dtype=torch.long, device="meta")
    mesh = (run.fsdp,) if run.tp == 1 else (run.fsdp, run.tp)
    cluster = autoshard.load_cluster("h100x8", nodes=max(1, gpus // 8), mesh=mesh)
    plan = autoshard.plan(
        model, cluster, (ids,), annotations=_pins(run), recompute=run.recompute,  # type: ignore[arg-type]
        memory_limit=float("inf"),
    )  # fmt: skip
    return {
        "gib": plan.memory_per_device / 2**30,
        "extras_gib": {k: round(v / 2**30, 2) for k, v in plan.memory_breakdown.items()},
        "recompute": plan.recompute,
    }


def planned_memory(key: str) -> dict[str, Any]:
    """:func:`memory_case` in a fresh process (its figures, or ``{"error": ...}``)."""
    from benchmarks.isolate import run_isolated

    return run_isolated("benchmarks.fidelity_memory:memory_case", {"key": key})
