"""Pipeline planning at GPT-3 scale: the free plan, Megatron's configuration pinned, and a 1T model.

    python -m benchmarks.plan_pipeline              # all three cases, each in a fresh process
    python -m benchmarks.plan_pipeline --case free  # one case

The model is GPT-3 175B built as a GPT-2-style Hugging Face config (``GPT2LMHeadModel``: learned positions,
GELU MLP of 4 × hidden, tied embedding and head, as GPT-3) on the meta device in bfloat16: 96 layers, hidden
12288, 96 heads, vocabulary 51200, sequence 2048, global batch 1536.  The cluster is 128 nodes of 8 A100
(``load_cluster("a100x8", nodes=128, mesh=(128, 8))``).  Cases:

- ``free``: ``pipeline="auto", microbatches="auto", schedule="auto"``;
- ``megatron``: Megatron-LM's published configuration (Narayanan et al. 2021, Table 1: TP 8, PP 8, DP 16,
  micro-batch 1, interleaved schedule) pinned: ``pipeline=8``, ``microbatches=96`` (1536 / (16 × 1)),
  ``schedule="interleaved_1f1b"`` (chunks per device searched) and every linear split Megatron's way over
  the 8 GPUs of a node;
- ``1t``: 128 layers, hidden 25600, 160 heads on 384 nodes (3072 A100), free.

Targets (issue 12): the free plan uses pp > 1 and predicts a step no slower than Megatron's pinned one;
each case plans in <= 10 s and <= 1.5 GiB (peak RSS of the child process, model construction included).
``plan_s`` is wall time, ``plan_cpu_s`` the planning process's CPU time (what the wall time is on an idle
machine; the two part when other work shares the cores).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from benchmarks.isolate import run_isolated

CASES: dict[str, dict[str, Any]] = {
    "free": {"layers": 96, "hidden": 12288, "heads": 96, "nodes": 128, "batch": 1536},
    "megatron": {"layers": 96, "hidden": 12288, "heads": 96, "nodes": 128, "batch": 1536, "megatron": True},
    "1t": {"layers": 128, "hidden": 25600, "heads": 160, "nodes": 384, "batch": 3072},
}

MEGATRON_TP = {  # GPT-2's Conv1D weights are (in, out): column parallel splits dim 1, row parallel dim 0
    "*.attn.c_attn.weight": "(R, S(1))",
    "*.attn.c_proj.weight": "(R, S(0))",
    "*.mlp.c_fc.weight": "(R, S(1))",
    "*.mlp.c_proj.weight": "(R, S(0))",
}


def pipeline_case(
    layers: int, hidden: int, heads: int, nodes: int, batch: int, megatron: bool = False, seq: int = 2048
) -> dict[str, Any]:
    """Build the model on meta and plan it (in the child process); figures of the plan."""
    import torch
    import transformers

    import autoshard

    t0 = time.perf_counter()
    config: dict[str, Any] = {
        "n_embd": hidden, "n_layer": layers, "n_head": heads, "vocab_size": 51200, "n_positions": seq,
        "use_cache": False, "attn_implementation": "sdpa", "bos_token_id": 0, "eos_token_id": 51199,
    }  # fmt: skip
    with torch.device("meta"):
        model: torch.nn.Module = transformers.GPT2LMHeadModel(transformers.GPT2Config(**config))
        model = model.to(dtype=torch.bfloat16)
    ids = torch.zeros(batch, seq, dtype=torch.long, device="meta")
    build_s = time.perf_counter() - t0
    cluster = autoshard.load_cluster("a100x8", nodes=nodes, mesh=(nodes, 8))
    pins: dict[str, Any] = (
        {"pipeline": 8, "microbatches": 96, "schedule": "interleaved_1f1b", "annotations": MEGATRON_TP}
        if megatron
        else {"pipeline": "auto", "microbatches": "auto", "schedule": "auto"}
    )
    t0, cpu0 = time.perf_counter(), time.process_time()
    plan = autoshard.plan(model, cluster, (ids,), **pins)
    plan_s, plan_cpu_s = time.perf_counter() - t0, time.process_time() - cpu0
    pp = plan.pipeline
    return {
        "headline": plan.summary().splitlines()[0],
        "step_s": round(plan.predicted_step_time, 3),
        "bubble": round(pp.bubble_fraction, 4) if pp else 0.0,
        "memory_gib": round(plan.memory_per_device / 2**30, 1),
        "stages": " ".join(f"{a}-{b}" for a, b in (st.layers or (0, 0) for st in pp.stages)) if pp else None,
        "degrees": plan.degrees,
        "microbatches": plan.microbatches,
        "build_s": round(build_s, 2),
        "plan_s": round(plan_s, 2),
        "plan_cpu_s": round(plan_cpu_s, 2),  # this process's CPU time: the wall time on an idle machine
        "timings": {k: round(v, 2) for k, v in plan.timings.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--case", choices=sorted(CASES), action="append")
    args = parser.parse_args()
    results: dict[str, dict[str, Any]] = {}
    for name in args.case or list(CASES):
        r = run_isolated("benchmarks.plan_pipeline:pipeline_case", CASES[name])
        results[name] = r
        if "error" not in r:
            r["peak_rss_gib"] = round(r["peak_rss_gib"], 2)
            r["process_s"] = round(r["process_s"], 2)
            r["target"] = "plan <= 10 s and <= 1.5 GiB: " + (
                "met" if r["plan_s"] <= 10 and r["peak_rss_gib"] <= 1.5 else "MISSED"
            )
        print(json.dumps({"case": name, **r}, indent=1), flush=True)
    if "free" in results and "megatron" in results and "error" not in results["free"]:
        free, pinned = results["free"], results["megatron"]
        if "error" not in pinned:
            ok = free["degrees"].get("pp", 1) > 1 and free["step_s"] <= pinned["step_s"]
            print(
                f"free plan {free['step_s']} s vs Megatron pinned {pinned['step_s']} s per step; "
                f"pp > 1 and free <= Megatron: {'met' if ok else 'MISSED'}"
            )


if __name__ == "__main__":
    main()
