"""Capture + plan LLaMA-3-8B on 64 devices and LLaMA-3-70B on 1024 devices, on the meta device.

    python benchmarks/plan_llama.py            # both cases
    python benchmarks/plan_llama.py --case 8b  # one case

Prints, per case: time to build the model, per-stage planning times (capture, strategies and costs, solve),
total end-to-end planning time, peak RSS of the process, the solver's certificate and the plan's headline
figures.  Each case runs in a fresh subprocess so peak RSS is per case.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

CASES = {
    # name: (zoo model, nodes, mesh, batch, seq)
    "8b": ("llama3-8b", 8, (8, 8), 64, 4096),
    "70b": ("llama3-70b", 128, (128, 8), 1024, 4096),
}


def run_case(name: str) -> dict:
    import torch  # noqa: F401  (imported here so its cost is reported apart from planning)

    import autoshard
    from autoshard import zoo

    model_name, nodes, mesh, batch, seq = CASES[name]
    t0 = time.perf_counter()
    case = zoo.build(model_name, batch=batch, seq=seq, device="meta")
    t_build = time.perf_counter() - t0
    cluster = autoshard.load_cluster("a100x8", nodes=nodes, mesh=mesh)
    t1 = time.perf_counter()
    plan = autoshard.plan(case.model, cluster, case.args, case.kwargs)
    t_plan = time.perf_counter() - t1
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {
        "case": name,
        "model": model_name,
        "mesh": list(mesh),
        "devices": cluster.num_devices,
        "global_batch": f"{batch} x {seq}",
        "build_model_s": round(t_build, 2),
        "plan_s": round(t_plan, 2),
        "stages_s": {k: round(v, 3) for k, v in plan.timings.items()},
        "peak_rss_gib": round(peak / 2**30, 2),
        "solver": plan.solver.method,
        "optimal": plan.solver.optimal,
        "gap": plan.solver.gap,
        "step_time_s": round(plan.predicted_step_time, 3),
        "memory_gib": round(plan.memory_per_device / 2**30, 1),
        "notes": list(plan.notes),
        "sample_placements": dict(list(plan.param_placements.items())[:6]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--case", choices=sorted(CASES), action="append")
    parser.add_argument("--inner", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner:
        print(json.dumps(run_case(args.inner)))
        return
    for name in args.case or list(CASES):
        t0 = time.perf_counter()
        out = subprocess.run(
            [sys.executable, __file__, "--inner", name], capture_output=True, text=True, check=False
        )
        wall = time.perf_counter() - t0
        if out.returncode != 0:
            print(f"{name}: FAILED\n{out.stderr[-3000:]}")
            continue
        result = json.loads(out.stdout.strip().splitlines()[-1])
        result["process_wall_s"] = round(wall, 2)
        print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
