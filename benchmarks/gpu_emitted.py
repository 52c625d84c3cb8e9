"""The emitted program against eager on one GPU: ``python -m benchmarks.gpu_emitted [--out DIR]``.

benchmarks/runtime.py's GPU comparison (a LLaMA 2048 hidden x 8 layers, bf16, batch 8 x 1024, forward +
backward, median of 20 after 3 warm-ups, CUDA events), with the model built, captured and planned on the GPU
(one h100x8 device) and emitted by ``autoshard.parallelize`` on one NCCL rank.  Writes
``gpu_step_emitted.json`` under ``--out`` (default benchmarks/results).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

__all__ = ["emitted_case"]

SHAPE = {"hidden": 2048, "layers": 8, "batch": 8, "seq": 1024, "steps": 20}  # benchmarks/runtime.py's


def _emitted_on_rank(hidden: int, layers: int, batch: int, seq: int, steps: int) -> dict[str, Any]:
    """On the one NCCL rank: a LLaMA (benchmarks/runtime.py's shape) built and captured on the GPU in bf16,
    planned for one h100x8 device, emitted by ``parallelize``; forward + backward timed against eager."""
    import copy

    import torch
    import transformers

    import autoshard
    from autoshard.codegen import parallelize, shard_inputs
    from autoshard.runtime.verify import cluster_for

    config: Any = transformers.LlamaConfig(  # type: ignore[call-arg]
        hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers, num_attention_heads=hidden // 64,
        num_key_value_heads=max(1, hidden // 256), vocab_size=32000, max_position_embeddings=max(2048, seq),
        use_cache=False, attn_implementation="sdpa", bos_token_id=0, eos_token_id=31999,
    )  # fmt: skip
    torch.manual_seed(0)
    with torch.device("cuda"):
        model: Any = transformers.LlamaForCausalLM(config)
    model = model.to(torch.bfloat16).eval()
    ids = torch.randint(0, 32000, (batch, seq), device="cuda")
    plan = autoshard.plan(model, cluster_for("h100x8", 1), (ids,))
    eager = copy.deepcopy(model)
    emitted = parallelize(model, plan, (ids,), device="cuda")
    (local,) = shard_inputs(plan, ids)

    def timed(forward: Any) -> tuple[float, Any]:
        times, out = [], torch.empty(0)
        for i in range(steps + 3):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = forward()
            out.float().sum().backward()
            end.record()
            end.synchronize()
            if i >= 3:
                times.append(start.elapsed_time(end))
        return statistics.median(times), out.detach()

    t_emitted, y_emitted = timed(lambda: emitted(local.cuda()))
    t_eager, y_eager = timed(lambda: eager(ids).logits)
    kernels = {
        "emitted": _kernels(lambda: emitted(local.cuda())),
        "eager": _kernels(lambda: eager(ids).logits),
    }
    return {
        "kernels": kernels,
        "model": f"LLaMA {hidden}h x{layers} bf16, batch {batch} x {seq}, forward + backward",
        "eager_ms": t_eager, "emitted_ms": t_emitted, "ratio": t_emitted / t_eager,
        "max_abs_diff": float((y_emitted.float() - y_eager.float()).abs().max()),
        "max_abs_logit": float(y_eager.float().abs().max()), "plan": plan.summary().splitlines()[0],
    }  # fmt: skip


def _kernels(forward: Any) -> dict[str, Any]:
    """One forward + backward under torch.profiler: device ms per kernel class, and the ten largest kernels."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from benchmarks.gpu_step import kernel_class

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        forward().float().sum().backward()
        torch.cuda.synchronize()
    classes: dict[str, float] = {}
    names: dict[str, float] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            ms = float(e.time_range.elapsed_us()) / 1e3
            classes[kernel_class(e.name)] = classes.get(kernel_class(e.name), 0.0) + ms
            names[e.name[:100]] = names.get(e.name[:100], 0.0) + ms
    top = sorted(names.items(), key=lambda kv: -kv[1])[:12]
    return {"classes": classes, "count": len(prof.events()), "top": top}


def emitted_case(hidden: int, layers: int, batch: int, seq: int, steps: int) -> dict[str, Any]:
    """:func:`_emitted_on_rank` on one NCCL rank (child process)."""
    from autoshard.runtime.launch import launch

    (r,) = launch(_emitted_on_rank, 1, hidden, layers, batch, seq, steps, backend="nccl", timeout=600)
    return dict(r)


def main() -> None:
    from benchmarks.isolate import run_isolated

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args()
    r = run_isolated("benchmarks.gpu_emitted:emitted_case", SHAPE, timeout=600)
    print(json.dumps(r))
    (args.out / "gpu_step_emitted.json").write_text(json.dumps(r, indent=1) + "\n")


if __name__ == "__main__":
    main()
