"""Real single-GPU training steps against autoshard's prediction: step time and peak memory.

    python -m benchmarks.gpu_step predict            # here, on the CPU: plan every case for one H100
    python -m benchmarks.gpu_step measure --out DIR  # on a CUDA machine: time every case, profile two
    python -m benchmarks.gpu_table                   # join, print, write results/gpu_step.csv

Each case is a real model built from its published config (HF GPT-2 124M, a HF LLaMA shaped as Llama-3.2-1B,
HF BERT-base), trained on one device with AdamW, with and without full activation checkpointing (HF's
``gradient_checkpointing_enable``: every decoder layer re-run in backward, autoshard's ``recompute="full"``).

Precision: the planner is given the model in bfloat16, so it prices bf16 compute and 16 bytes of state per
parameter (2 weights + 2 gradients + 12 fp32 master and Adam moments).  Two real recipes (``--recipes``, see
:func:`_trainer`): ``bf16``, that same recipe (fused AdamW on an fp32 master copy), and ``amp``, torch's default
(fp32 weights under autocast, foreach AdamW).  The loss is cross-entropy on the fp32-upcast logits, as HF's is.

Measured (``measure``): step = zero_grad + forward + loss + backward + optimizer step; median of ``--steps``
steps after 3 warm-up steps, each timed with CUDA events; ``torch.cuda.max_memory_allocated`` and
``max_memory_reserved`` over the timed steps, and the device's used memory (total - free, CUDA context and
cuBLAS workspaces included) after them.  Each case runs in a fresh process.  ``OPS_CASES`` also record one
step under ``torch.profiler`` (bf16): device time per aten op and per kernel class, written beside the figures.

Predicted (``predict``): ``autoshard.plan`` on the meta device, cluster = one device of each of ``PROFILES``
(``cluster_for("h100x8", 1)``, and the ``h100_measured`` profile), recompute pinned to the case's, no memory
limit: ``predicted_step_time``, ``compute_time`` and ``memory_per_device`` (the 1 GB runtime reserve included;
compare it with the used memory).  Stored in ``benchmarks/results/gpu_step_predicted.json``: the GPU machine
needs no solver.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
PREDICTED = RESULTS / "gpu_step_predicted.json"
GIB = 2**30

__all__ = ["CASES", "Case", "build", "kernel_class", "measure_case", "predict_case"]


@dataclass(frozen=True)
class Case:
    """One training configuration: model, global batch, sequence length, activation recomputation."""

    model: str
    batch: int
    seq: int
    recompute: str  # "none" | "full"

    @property
    def key(self) -> str:
        return f"{self.model} b{self.batch}x{self.seq} {self.recompute}"


# published configs: GPT-2 small (Radford et al. 2019 / HF "gpt2"), Llama-3.2-1B (HF meta-llama/Llama-3.2-1B
# config.json: 2048 hidden, 16 layers, 32 heads, 8 kv heads, FFN 8192, vocab 128256, tied embeddings),
# BERT-base (Devlin et al. 2019 / HF "bert-base-uncased")
# Qwen2-0.5B (HF Qwen/Qwen2-0.5B config.json: 896 hidden, 24 layers, 14 heads, 2 kv heads, FFN 4864, vocab
# 151936, q/k/v biases, tied embeddings): a second held-out model, measured 2026-11-24 (second GPU session)
MODELS = ("gpt2", "llama-1b", "bert-base", "qwen-0.5b")
CASES: tuple[Case, ...] = (
    Case("gpt2", 8, 1024, "none"),
    Case("gpt2", 8, 1024, "full"),
    Case("gpt2", 16, 1024, "none"),
    Case("llama-1b", 4, 2048, "none"),
    Case("llama-1b", 4, 2048, "full"),
    Case("llama-1b", 8, 2048, "full"),
    Case("bert-base", 32, 512, "none"),
    Case("bert-base", 32, 512, "full"),
    Case("qwen-0.5b", 8, 1024, "none"),
    Case("qwen-0.5b", 8, 2048, "none"),
    Case("qwen-0.5b", 8, 2048, "full"),
)
PROFILES = ("h100x8", "h100_measured")  # bundled: the DGX H100 datasheet one, and the one measured here
OPS_CASES = (  # recorded op by op (both recipes)
    Case("llama-1b", 4, 2048, "none"), Case("gpt2", 8, 1024, "none"), Case("bert-base", 32, 512, "none"),
    Case("qwen-0.5b", 8, 2048, "none"),
)  # fmt: skip


def build(model: str, batch: int, seq: int, device: str, dtype: Any) -> tuple[Any, Any]:
    """The model (HF, SDPA attention, no dropout, no KV cache) and random token ids of ``(batch, seq)``."""
    import torch
    import transformers

    common: dict[str, Any] = {"use_cache": False, "attn_implementation": "sdpa"}
    if model == "gpt2":
        cfg: Any = transformers.GPT2Config(
            n_embd=768, n_layer=12, n_head=12, vocab_size=50257, n_positions=1024,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **common,
        )  # fmt: skip
        cls: Any = transformers.GPT2LMHeadModel
    elif model == "llama-1b":
        cfg = transformers.LlamaConfig(
            hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
            num_key_value_heads=8, vocab_size=128256, max_position_embeddings=8192, tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": 500000.0}, rms_norm_eps=1e-5,
            bos_token_id=0, eos_token_id=128255, **common,
        )  # fmt: skip
        cls = transformers.LlamaForCausalLM
    elif model == "bert-base":
        cfg = transformers.BertConfig(
            hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
            vocab_size=30522, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **common,
        )  # fmt: skip
        cls = transformers.BertForMaskedLM
    elif model == "qwen-0.5b":
        cfg = transformers.Qwen2Config(
            hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
            num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768, tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, rms_norm_eps=1e-6,
            bos_token_id=0, eos_token_id=151643, **common,
        )  # fmt: skip
        cls = transformers.Qwen2ForCausalLM
    else:
        raise ValueError(f"unknown model {model!r}; one of {MODELS}")
    torch.manual_seed(0)
    with torch.device(device):
        net = cls(cfg).to(dtype)
    vocab = cfg.vocab_size
    if device == "meta":
        ids = torch.zeros((batch, seq), dtype=torch.long, device="meta")
    else:
        ids = torch.randint(0, vocab, (batch, seq), device=device)
    return net, ids


# -- prediction (CPU) ---------------------------------------------------------------------------------------------
def predict_case(
    model: str, batch: int, seq: int, recompute: str, profile: str = "h100x8", recipe: str = "bf16"
) -> dict[str, Any]:
    """autoshard's plan of one case for one device of ``profile`` under ``recipe`` (the planner's
    ``precision``; runs in a child process)."""
    import time

    import torch

    import autoshard
    from autoshard.runtime.verify import cluster_for

    net, ids = build(model, batch, seq, "meta", torch.bfloat16)
    net.train()
    start = time.perf_counter()
    plan = autoshard.plan(
        net, cluster_for(profile, 1), (ids,), recompute=recompute,  # type: ignore[arg-type]
        memory_limit=float("inf"), precision=recipe,  # type: ignore[arg-type]
    )  # fmt: skip
    return {
        "step_ms": plan.predicted_step_time * 1e3,
        "compute_ms": plan.compute_time * 1e3,
        "communication_ms": plan.communication_time * 1e3,
        "memory_gib": plan.memory_per_device / GIB,
        "breakdown_gib": {k: v / GIB for k, v in plan.memory_breakdown.items()},
        "recompute": plan.recompute,
        "params": sum(p.numel() for p in net.parameters()),
        "plan_s": time.perf_counter() - start,
    }


def predict(profiles: tuple[str, ...], recipes: tuple[str, ...]) -> None:
    """Every case under each profile and recipe; stored under ``profile`` (bf16) or ``"profile recipe"``."""
    from benchmarks.isolate import run_isolated

    out: dict[str, Any] = {}
    for recipe in recipes:
        for profile in profiles:
            key = profile if recipe == "bf16" else f"{profile} {recipe}"
            for case in CASES:
                kwargs = {**asdict(case), "profile": profile, "recipe": recipe}
                r = run_isolated("benchmarks.gpu_step:predict_case", kwargs, timeout=1200)
                out.setdefault(key, {})[case.key] = r
                print(key, case.key, {k: r[k] for k in ("step_ms", "memory_gib", "plan_s") if k in r} or r)
    PREDICTED.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {PREDICTED}")


# -- measurement (CUDA) -------------------------------------------------------------------------------------------
RECIPES = ("bf16", "amp")


def _trainer(net: Any, ids: Any, recipe: str) -> Any:
    """One training step of ``net`` under ``recipe`` (module docstring), as a closure.

    ``bf16``: what the planner prices -- bf16 weights and gradients, an fp32 master copy and fp32 Adam moments
    (torch's fused AdamW on the master copy, one optimizer per ~64M-element chunk so that the fp32 copy of the
    gradients exists for one chunk at a time), the master copied back into the bf16 weights.
    ``amp``: torch's default mixed precision -- fp32 weights under ``torch.autocast(bfloat16)``, default AdamW
    (foreach): the same 16 bytes of state per parameter, but an fp32 residual stream and per-step weight casts.
    """
    import torch
    import torch.nn.functional as F

    def loss_of() -> Any:
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=recipe == "amp"):
            logits = net(ids).logits
        return F.cross_entropy(logits.float().flatten(0, 1), ids.flatten())

    if recipe == "amp":
        opt = torch.optim.AdamW(net.parameters(), lr=1e-4)

        def amp_step() -> None:
            opt.zero_grad(set_to_none=True)
            loss_of().backward()
            opt.step()

        return amp_step
    chunks: list[list[Any]] = [[]]
    for p in net.parameters():
        if sum(q.numel() for q in chunks[-1]) >= 64 * 2**20:
            chunks.append([])
        chunks[-1].append(p)
    masters = [[p.detach().float() for p in chunk] for chunk in chunks]
    opts = [torch.optim.AdamW(m, lr=1e-4, fused=True) for m in masters]

    def bf16_step() -> None:
        for p in net.parameters():
            p.grad = None
        loss_of().backward()
        for chunk, master, opt in zip(chunks, masters, opts, strict=True):
            for p, m in zip(chunk, master, strict=True):
                m.grad = None if p.grad is None else p.grad.float()
            opt.step()
            for p, m in zip(chunk, master, strict=True):
                p.data.copy_(m)
                m.grad = None

    return bf16_step


def measure_case(
    model: str, batch: int, seq: int, recompute: str, steps: int, recipe: str = "bf16", ops: str = ""
) -> dict[str, Any]:
    """Train one case on the GPU (child process): median step ms and peak memory; with ``ops``, a profiled
    step's device time per aten op and per kernel class written to that path."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = True  # fp32 work outside autocast as the profile's tf32 peak
    net, ids = build(model, batch, seq, "cuda", torch.bfloat16 if recipe == "bf16" else torch.float32)
    net.train()
    if recompute == "full":
        net.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    step = _trainer(net, ids, recipe)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    free, total = torch.cuda.mem_get_info()
    result = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "recipe": recipe,
        "step_ms": statistics.median(times),
        "step_ms_min": min(times),
        "step_ms_max": max(times),
        "allocated_gib": torch.cuda.max_memory_allocated() / GIB,
        "reserved_gib": torch.cuda.max_memory_reserved() / GIB,
        "used_gib": (total - free) / GIB,
        "params": sum(p.numel() for p in net.parameters()),
    }
    if ops:
        result["ops"] = _profile_ops(step, ops)
    return result


_CLASSES = (  # (class, substrings of a kernel's name), first match wins
    ("annotation", ("optimizer.step", "command buffer full", "profilerstep")),
    ("attention", ("flash", "fmha", "sdpa", "attention", "cudnn")),
    ("gemm", ("nvjet", "gemm", "xmma", "cutlass")),
    ("optimizer", ("multi_tensor_apply", "fused_adam", "adam")),
    ("copy/cast", ("copy_kernel", "memcpy", "memset", "catarray")),
    ("loss softmax", ("softmax",)),
    ("reduction", ("reduce_kernel", "norm")),
)


def kernel_class(name: str) -> str:
    """The op class of a CUDA kernel, from its name (``annotation``: a profiler range, not a kernel)."""
    low = name.lower()
    return next((c for c, keys in _CLASSES if any(k in low for k in keys)), "elementwise")


def _profile_ops(step: Any, path: str) -> dict[str, float]:
    """One step under torch.profiler: per-kernel-class device ms (returned; ``busy`` is their sum, ``step``
    the step's wall time) and the aten and kernel tables (written to ``path``)."""
    import time

    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    classes: dict[str, float] = {}
    kernels: dict[str, list[float]] = {}
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        us = float(e.time_range.elapsed_us())  # a device event: its kernel's duration
        classes[kernel_class(e.name)] = classes.get(kernel_class(e.name), 0.0) + us / 1e3
        kernels.setdefault(e.name, []).append(us)
    classes.pop("annotation", None)
    classes["busy"], classes["step"] = sum(classes.values()), wall * 1e3
    table = prof.key_averages().table(
        sort_by="self_device_time_total", row_limit=80, max_name_column_width=70
    )
    shapes = prof.key_averages(group_by_input_shape=True).table(
        sort_by="self_device_time_total", row_limit=200, max_name_column_width=40, max_shapes_column_width=110
    )
    top = sorted(kernels.items(), key=lambda kv: -sum(kv[1]))[:120]
    lines = [f"{sum(v) / 1e3:10.3f} ms {len(v):6d} x {kernel_class(k):14s} {k[:300]}" for k, v in top]
    Path(path).write_text(
        table
        + "\n\nkernels by total device time\n"
        + "\n".join(lines)
        + "\n\naten ops by input shapes\n"
        + shapes
        + "\n"
    )
    return classes


def measure(out: Path, steps: int, only: str | None, recipes: tuple[str, ...]) -> None:
    from benchmarks.isolate import run_isolated

    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {}
    for recipe in recipes:
        for case in CASES:
            if only and not any(o in case.key for o in only.split(",")):
                continue
            ops = (
                str(out / f"gpu_step_ops_{case.model}{'' if recipe == 'bf16' else '_' + recipe}.txt")
                if case in OPS_CASES
                else ""
            )
            kwargs = {**asdict(case), "steps": steps, "recipe": recipe, "ops": ops}
            r = run_isolated("benchmarks.gpu_step:measure_case", kwargs, timeout=600)
            results[f"{case.key} {recipe}"] = r
            print(case.key, recipe, json.dumps(r), flush=True)
            (out / "gpu_step_measured.json").write_text(json.dumps(results, indent=1) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=("predict", "measure"))
    parser.add_argument("--profiles", default=",".join(PROFILES), help="comma-separated, for predict")
    parser.add_argument("--recipes", default=None, help=f"comma-separated, of {RECIPES} (measure: bf16)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument(
        "--only", default=None, help="cases whose key contains one of these (comma-separated)"
    )
    args = parser.parse_args(argv)
    if args.what == "predict":
        predict(tuple(args.profiles.split(",")), tuple((args.recipes or ",".join(RECIPES)).split(",")))
    elif args.what == "measure":
        measure(args.out, args.steps, args.only, tuple((args.recipes or "bf16").split(",")))


if __name__ == "__main__":
    main(sys.argv[1:])
