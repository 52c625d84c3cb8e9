"""What fusing the expert MLP (``autoshard.capture.experts``) does to plans of MoE models on 8 x 8 A100s.

    python -m benchmarks.experts

Each case is planned twice, in fresh processes, on one capture variant only (``autoshard.plan`` itself tries
both and keeps the cheaper; here the other is switched off): fused (the grouped-GEMM expert MLP as one node,
whose expert split is expert parallelism with one reduction per MoE layer) and with the fusion pass switched
off (the two grouped matmuls planned op by op: an expert split must all-reduce between them, but the
matmuls' K and N splits stay available).  Printed: the predicted step time of each, and the expert MLP's
chosen strategy.  Measured 2026-11-24: fusion wins for Mixtral-8x7B (1.77 -> 1.13 s at 16 x 4096 tokens,
5.03 -> 4.37 s at 64 x 4096, equal at 256 x 4096) and loses for DeepSeek-V3 at 64 x 512 tokens without a
memory budget (3.40 -> 5.48 s at 61 layers, 0.147 -> 0.183 s at 4), whose unfused plan splits K and N inside
the experts -- options the fused op cannot offer without a collective inside it.
"""

from __future__ import annotations

import argparse
import json
from typing import Any
from unittest import mock

from benchmarks.isolate import run_isolated

CASES: dict[str, dict[str, Any]] = {
    "mixtral-8x7b 16x4096": {"model": "mixtral", "batch": 16, "seq": 4096},
    "mixtral-8x7b 64x4096": {"model": "mixtral", "batch": 64, "seq": 4096},
    "deepseek-v3 4 layers 64x512": {"model": "deepseek", "batch": 64, "seq": 512, "layers": 4},
}


def plan_case(model: str, batch: int, seq: int, fuse: bool, layers: int = 4) -> dict[str, Any]:
    """Plan one case (child process); ``fuse=False`` runs capture without the expert fusion pass."""
    import autoshard
    from benchmarks.collapse import _deepseek

    if model == "mixtral":
        from autoshard import zoo

        case = zoo.build("mixtral-8x7b", batch=batch, seq=seq)
        m, args, limit = case.model, case.args, None
    else:
        (m, args), limit = _deepseek(batch, seq, layers), float("inf")
    cluster = autoshard.load_cluster("a100x8", nodes=8, mesh=(8, 8))
    unfused = mock.patch("autoshard.capture.clean.fuse_expert_mlps", side_effect=lambda gm, **_: gm)
    fused_only = mock.patch("autoshard.planner.plan_fuses_experts", return_value=False)  # no second attempt
    with fused_only if fuse else unfused:
        plan = autoshard.plan(m, cluster, args, memory_limit=limit)
    experts = sorted({n.strategy for n in plan.nodes if "grouped_mm" in n.target or "expert_mlp" in n.target})
    return {"step_s": round(plan.predicted_step_time, 3), "experts": experts}


def main() -> None:
    argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    ).parse_args()
    for name, kwargs in CASES.items():
        fused = run_isolated("benchmarks.experts:plan_case", {**kwargs, "fuse": True})
        plain = run_isolated("benchmarks.experts:plan_case", {**kwargs, "fuse": False})
        print(json.dumps({"case": name, "fused": fused, "unfused": plain}))
        if "step_s" in fused and "step_s" in plain:
            print(f"{name}: fused {fused['step_s']} s, unfused {plain['step_s']} s "
                  f"(fused / unfused = {fused['step_s'] / plain['step_s']:.2f})")  # fmt: skip


if __name__ == "__main__":
    main()
