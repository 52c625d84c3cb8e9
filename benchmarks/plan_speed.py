"""Planning speed on 3-D meshes (issue 17): CPU and wall seconds, peak RSS and the objective against main.

Run: ``OMP_NUM_THREADS=1 python -m benchmarks.plan_speed`` (each case in a fresh process: peak RSS per case).

Cases: LLaMA-3-8B on 2 x 4 x 8 A100 (batch 64 x 4096) and LLaMA-3-70B on 16 x 8 x 8 (batch 1,024 x 4096;
the memory budget binds, so the recomputation policies are searched under it).  Per case: the CPU seconds of
``autoshard.plan`` (what the wall time would be on an idle core: this machine's two cores are shared), the
wall seconds, the CPU seconds per stage (capture, build = strategies + costs, solve), peak RSS, and the
objective against ``BEFORE``, the same problem planned by main's code before this work.
"""

from __future__ import annotations

import math
import sys
import time
from typing import Any

from benchmarks.isolate import run_isolated

__all__ = ["BEFORE", "plan_case", "run"]

#: main at 5920294 (before the speed3d branch: vectorised pricing, Pareto elimination and the memory extras
#: already in), measured here on 2026-11-24 ~09:50 UTC with the same command under a load average of ~11 on
#: 2 cores: (objective, CPU s, wall s, peak RSS GiB).  The 70B objective is that of the problem with the
#: memory extras inside the budget (issue 13), which binds harder than before.
BEFORE: dict[str, tuple[float, float, float, float]] = {
    "llama3-8b 2x4x8": (1.1324306930751005, 3.61, 9.5, 0.67),
    "llama3-70b 16x8x8": (11.674927991050067, 28.95, 134.9, 0.98),
}

CASES: tuple[tuple[str, str, tuple[int, ...], int, int, int], ...] = (
    # model, profile, mesh, nodes, batch, seq
    ("llama3-8b", "a100x8", (2, 4, 8), 8, 64, 4096),
    ("llama3-70b", "a100x8", (16, 8, 8), 128, 1024, 4096),
)


def plan_case(model: str, profile: str, mesh: list[int], nodes: int, batch: int, seq: int) -> dict[str, Any]:
    """Plan one case (in a child process): CPU and wall seconds, CPU per stage, objective."""
    import autoshard
    import autoshard.planner as planner
    import autoshard.planner_steps as planner_steps
    from autoshard import zoo

    stages: dict[str, float] = {}

    def timed(name: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            c0 = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                stages[name] = stages.get(name, 0.0) + time.process_time() - c0

        return wrapper

    for name, attr in (("capture", "capture"), ("build", "build_problem"), ("solve", "solve")):
        for module in (planner, planner_steps):  # the planner and its per-capture steps
            if hasattr(module, attr):
                setattr(module, attr, timed(name, getattr(module, attr)))
    case = zoo.build(model, batch=batch, seq=seq, device="meta")
    cluster = autoshard.load_cluster(profile, nodes=nodes, mesh=tuple(mesh))
    t0, c0 = time.perf_counter(), time.process_time()
    plan = autoshard.plan(case.model, cluster, case.args, case.kwargs)
    return {
        "wall_s": time.perf_counter() - t0,
        "cpu_s": time.process_time() - c0,
        "stages_cpu_s": {k: round(v, 2) for k, v in stages.items()},
        "objective": plan.solver.objective,
        "optimal": plan.solver.optimal,
        "method": plan.solver.method,
    }


def run(log: Any = print) -> list[dict[str, Any]]:
    rows = []
    for model, profile, mesh, nodes, batch, seq in CASES:
        key = f"{model} {'x'.join(map(str, mesh))}"
        args = {
            "model": model,
            "profile": profile,
            "mesh": list(mesh),
            "nodes": nodes,
            "batch": batch,
            "seq": seq,
        }
        r = run_isolated("benchmarks.plan_speed:plan_case", args, timeout=900)
        r["case"] = key
        if "error" not in r:
            objective, cpu, wall, rss = BEFORE[key]
            r["same_optimum"] = math.isclose(r["objective"], objective, rel_tol=1e-12)
            r["before"] = {"cpu_s": cpu, "wall_s": wall, "peak_rss_gib": rss, "objective": objective}
        rows.append(r)
        log(_line(r))
    return rows


def _line(r: dict[str, Any]) -> str:
    if "error" in r:
        return f"{r['case']}: error {r['error'][:300]}"
    b = r["before"]
    return (
        f"{r['case']}: {r['cpu_s']:.2f} s CPU (was {b['cpu_s']:.2f}), {r['wall_s']:.1f} s wall (was "
        f"{b['wall_s']:.1f}), stages CPU {r['stages_cpu_s']}, peak RSS {r['peak_rss_gib']:.2f} GiB (was "
        f"{b['peak_rss_gib']:.2f}), objective {r['objective']!r} "
        f"({'same as' if r['same_optimum'] else 'DIFFERENT from'} main's {b['objective']!r}), "
        f"optimal {r['optimal']} by {r['method']}"
    )


if __name__ == "__main__":
    run()
    sys.exit(0)
