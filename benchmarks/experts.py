"""How MoE models on 8 x 8 A100s get their experts: fused or op by op, and which token dispatcher.

    python -m benchmarks.experts

Each case is planned in fresh processes, on one capture variant only (``autoshard.plan`` itself tries fused
and unfused and keeps the cheaper; here the other is switched off):

- ``fused``: the routed-experts block as one node (``autoshard.capture.dispatch``), free to split the experts
  with either dispatcher -- all-gather (tokens gathered over the expert axis, the Partial output reduced) or
  all-to-all (each device sends its tokens' top-k rows to the experts' devices and back), by cost;
- ``fused, all-gather only``: the same with the all-to-all dispatcher taken away (what plans cost before it);
- ``unfused``: the fusion passes switched off (the grouped matmuls planned op by op: an expert split must
  all-reduce between them, but the matmuls' K and N splits stay available).

Printed per variant: the predicted step time, the experts' chosen strategy, the dispatcher and, for all-to-all,
the volume per step the plan lists (``problem.dispatch``: each device's tokens x top-k x hidden x bytes per
all-to-all; split sizes, dispatch and combine forward, both again backward) with the report's phrase.
Measured 2026-11-24 before the all-to-all dispatcher: fusion won for Mixtral-8x7B (1.77 -> 1.13 s at 16 x 4096
tokens, 5.03 -> 4.37 s at 64 x 4096) and lost for DeepSeek-V3 at 64 x 512 tokens without a memory budget
(0.147 -> 0.183 s at 4 layers), whose unfused plan splits K and N inside the experts.  The figures with it
are in ``benchmarks/results/experts.txt``: Mixtral-8x7B at 16 x 4096 tokens 0.639 s fused (all-to-all, 160
all-to-alls moving 2.00 GiB per step), 0.907 s with all-gather dispatch only, 1.779 s unfused; at 64 x 4096
2.118 / 2.672 / 5.245 s; DeepSeek-V3 (4 layers, 64 x 512) 0.132 s fused with all-gather dispatch (top-8 on an
axis of 8: the all-to-all saves n / k = 1, nothing) against 0.153 s unfused.
"""

from __future__ import annotations

import argparse
import contextlib
import json
from typing import Any
from unittest import mock

from benchmarks.isolate import run_isolated

CASES: dict[str, dict[str, Any]] = {
    "mixtral-8x7b 16x4096": {"model": "mixtral", "batch": 16, "seq": 4096},
    "mixtral-8x7b 64x4096": {"model": "mixtral", "batch": 64, "seq": 4096},
    "deepseek-v3 4 layers 64x512": {"model": "deepseek", "batch": 64, "seq": 512, "layers": 4},
}


def plan_case(
    model: str, batch: int, seq: int, fuse: bool, layers: int = 4, gather_only: bool = False
) -> dict[str, Any]:
    """Plan one case (child process); ``fuse=False`` runs capture without the expert fusion passes,
    ``gather_only`` takes the all-to-all dispatcher away from the routed-experts rule."""
    import autoshard
    from autoshard.report.groups import PlanView
    from autoshard.report.patterns import recognise
    from autoshard.strategies.rules.dispatch import dispatch_axis
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
    no_a2a = mock.patch(
        "autoshard.strategies.rules.dispatch._one_dispatch", lambda s: dispatch_axis(s) is None
    )
    with fused_only if fuse else unfused, no_a2a if gather_only else contextlib.nullcontext():
        plan = autoshard.plan(m, cluster, args, memory_limit=limit)
    targets = ("grouped_mm", "expert_mlp", "routed_experts")
    experts = [n for n in plan.nodes if any(t in n.target for t in targets)]
    names = {n.name for n in experts}
    a2a = [c for c in plan.collectives if c.kind == "all_to_all" and c.node in names and c.tensor == c.node]
    evidence = [p.evidence for p in recognise(PlanView.of(plan)) if p.name == "expert parallel"]
    split = any(e for e in evidence)
    return {
        "step_s": round(plan.predicted_step_time, 3),
        "experts": sorted({n.strategy for n in experts}),
        "dispatch": ("all-to-all" if a2a else "all-gather") if split else "no expert split",
        "all_to_all_per_step": len(a2a),
        "all_to_all_bytes_per_step": sum(c.nbytes for c in a2a),
        "all_to_all_seconds_per_step": round(sum(c.seconds for c in a2a), 4),
        "report": evidence,
    }


def main() -> None:
    argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    ).parse_args()
    for name, kwargs in CASES.items():
        variants = {
            "fused": {**kwargs, "fuse": True},
            "fused, all-gather only": {**kwargs, "fuse": True, "gather_only": True},
            "unfused": {**kwargs, "fuse": False},
        }
        results = {v: run_isolated("benchmarks.experts:plan_case", a) for v, a in variants.items()}
        print(json.dumps({"case": name, **results}))
        for variant, r in results.items():
            if "step_s" not in r:
                print(f"{name} | {variant}: failed: {r.get('error', '')[:200]}")
                continue
            volume = (
                f", {r['all_to_all_per_step']} all-to-alls, {r['all_to_all_bytes_per_step'] / 2**30:.2f} GiB, "
                f"{r['all_to_all_seconds_per_step']:.3f} s per step"
                if r["all_to_all_per_step"]
                else ""
            )
            print(f"{name} | {variant}: {r['step_s']} s, {r['dispatch']}{volume}")


if __name__ == "__main__":
    main()
