"""Plan.overlap at run time: step time with and without the overlap, on 2 local gloo ranks.

``python -m benchmarks.overlap_run [--hidden H] [--layers L] [--steps K] [--bucket-mib M]`` builds a LLaMA-style
model (float32, ``zoo`` llama-tiny widened to ``--hidden``), plans it data-parallel and FSDP (annotations) for
2 ranks, and trains ``--steps`` AdamW steps per variant, printing the median wall and CPU seconds of a step
(after one warm-up) and what overlapped:

- ``dp in-graph``: each gradient all-reduced synchronously by its edge's backward (the emitted module as is);
- ``dp bucketed``: :func:`autoshard.runtime.overlap.apply_overlap` -- all-reduces of ``--bucket-mib`` buckets
  issued asynchronously during backward (how many were issued before backward ended); a size other than the
  plan's 25 MiB buckets, so in the runtime's own order (it says so; ``benchmarks.grad_buckets`` runs the
  plan's);
- ``fsdp no prefetch`` / ``fsdp prefetch 1``: reshard after forward, gathers issued at use or one layer ahead.

Not a timed test: on a loaded 2-core machine compute and gloo's worker threads share the cores, so the figures
show what runs, and roughly what it saves; the structure is asserted in tests/runtime/test_runtime_overlap.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from typing import Any

import torch

import autoshard
from autoshard import zoo
from autoshard.codegen import parallelize, shard_inputs
from autoshard.runtime.launch import launch
from autoshard.runtime.verify import cluster_for
from cost_models.overlap import OverlapPolicy

BATCH_SPLIT = ((2, 1, 1), (1, 1))
DP = {
    "input_ids": ("S(0)",),
    "model.embed_tokens": ((1, 1), (2, 1)),
    "*_proj": BATCH_SPLIT,
    "lm_head": BATCH_SPLIT,
}
FSDP = {**DP, "*_proj.weight": ("S(0)",), "lm_head.weight": ("S(0)",)}


def _model(hidden: int, layers: int) -> tuple[torch.nn.Module, torch.Tensor]:
    """The zoo's LLaMA builder at this width (heads of 64, 2 kv heads, FFN 2.75x, vocabulary 4096)."""
    torch.manual_seed(0)
    build = zoo._llama("llama-bench", hidden, layers, hidden // 64, 2, hidden * 11 // 4, vocab=4096)
    case = build(zoo._Options(4, 64, "cpu", torch.float32, None))
    return case.model, case.args[0]


def _variant(name: str, plan: Any, model: torch.nn.Module, ids: torch.Tensor, steps: int) -> dict[str, Any]:
    from autoshard.runtime.overlap import apply_overlap
    from autoshard.runtime.prefetch import prefetch_gathers
    from autoshard.runtime.reshard import reshard_after_forward

    module = parallelize(model, plan, (ids,))
    opt = torch.optim.AdamW(module.parameters(), lr=1e-3)
    sync = None
    if name == "dp bucketed":
        sync, _ = apply_overlap(module, opt)
    if name.startswith("fsdp"):
        reshard_after_forward(module)
        if name.endswith("prefetch 1"):
            prefetch_gathers(module, 1)
    wall, cpu = timed_steps(module, opt, shard_inputs(plan, ids), steps)
    early = 0
    if sync is not None:
        early = sum(waiting > 0 for _, waiting in sync.events) // (steps + 1)
    buckets = len(sync.buckets) if sync is not None else 0
    return {"wall": wall, "cpu": cpu, "buckets": buckets, "early": early}


def timed_steps(module: Any, opt: Any, local: Any, steps: int) -> tuple[float, float]:
    """Median wall and CPU seconds of a training step, after one warm-up step."""
    wall, cpu = [], []
    for _ in range(steps + 1):
        t0, c0 = time.perf_counter(), time.process_time()
        opt.zero_grad()
        module(*local).float().square().mean().backward()
        opt.step()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return statistics.median(wall[1:]), statistics.median(cpu[1:])


def _rank(plans: dict[str, Any], hidden: int, layers: int, steps: int) -> dict[str, dict[str, Any]]:
    model, ids = _model(hidden, layers)
    return {name: _variant(name, plan, model, ids, steps) for name, plan in plans.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--bucket-mib", type=float, default=1.0)
    args = parser.parse_args(argv)
    model, ids = _model(args.hidden, args.layers)
    cluster = cluster_for("cpu", 2)
    dp = autoshard.plan(model, cluster, (ids,), annotations=DP)
    fsdp = autoshard.plan(model, cluster, (ids,), annotations=FSDP)
    bucketed = dataclasses.replace(dp, overlap=OverlapPolicy(bucket_bytes=int(args.bucket_mib * 2**20)))
    plans = {"dp in-graph": dp, "dp bucketed": bucketed, "fsdp no prefetch": fsdp, "fsdp prefetch 1": fsdp}
    params = sum(p.numel() for p in model.parameters())
    results = launch(_rank, 2, plans, args.hidden, args.layers, args.steps, timeout=600)
    print(
        f"LLaMA-style, {params / 1e6:.1f} M parameters, float32, batch 4 x 64, 2 gloo ranks, {args.steps} steps"
    )
    print(f"{'variant':<18}{'wall s/step':>12}{'cpu s/step':>12}  overlap")
    for name in plans:
        r = results[0][name]
        what = f"{r['early']} of {r['buckets']} buckets issued during backward" if r["buckets"] else ""
        print(f"{name:<18}{r['wall']:>12.3f}{r['cpu']:>12.3f}  {what}")


if __name__ == "__main__":
    main()
