"""The memory-budgeted path in seconds (issue 17): the per-block recompute search and the budgeted solves.

Run: ``OMP_NUM_THREADS=1 python -m benchmarks.plan_budget`` (each case in a fresh process: peak RSS per case).

Cases (the three the issue names):

- LLaMA-3-70B on 16 x 8 x 8 A100 (1,024 devices, batch 1,024 x 4,096): ``autoshard.plan``;
- ``autoshard search --profile a100x8 --model llama3-8b --forbid tp`` (the new-user trial; mesh auto on one
  node, with the data-parallel baseline);
- ``autoshard search --profile a100x8 --model mixtral-8x7b --nodes 2 --mesh 2x8``.

For each: CPU seconds of the process (what the wall time would be on an idle core; the machine is shared),
wall seconds, peak RSS, the CPU seconds of the recompute-count search (``mix_policies``, all its calls), the
predicted step, the recomputation chosen (policy and ``k`` of ``N`` blocks), the solver's method and
optimality.  ``BEFORE``: the same figures with main's code before this work (3 full solves per policy on
the way down the k intervals; the op-by-op expert alternative solved to the end), measured on this machine.
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.isolate import run_isolated

__all__ = ["BEFORE", "budget_case", "run"]

#: Main at 5920294 (before this work), measured with this script on 2026-11-24 09:50 UTC, load 9-14 on 2 shared
#: cores: CPU s of the process, CPU s of the recompute-count search, wall s, objective.
BEFORE: dict[str, tuple[float, float, float, float]] = {
    "llama3-70b 16x8x8": (24.8, 8.30, 155.9, 11.674927991050067),
    "search llama3-8b --forbid tp": (7.1, 1.34, 47.4, 1.1559165193085659),
    "search mixtral-8x7b 2x8": (55.6, 9.12, 389.0, 1.3798578417407221),
}

CASES: dict[str, list[str] | None] = {
    "llama3-70b 16x8x8": None,
    "search llama3-8b --forbid tp": [
        "search",
        "--profile",
        "a100x8",
        "--model",
        "llama3-8b",
        "--forbid",
        "tp",
    ],
    "search mixtral-8x7b 2x8": [
        "search",
        "--profile",
        "a100x8",
        "--model",
        "mixtral-8x7b",
        "--nodes",
        "2",
        "--mesh",
        "2x8",
    ],
}


def budget_case(case: str) -> dict[str, Any]:
    """One case in this (child) process: seconds, the recompute search's CPU seconds, and the plan."""
    import autoshard
    import autoshard.planner_policy as planner
    from autoshard import zoo

    spent = [0.0]
    mix = planner.mix_policies

    def timed(*args: Any, **kwargs: Any) -> Any:
        c0 = time.process_time()
        try:
            return mix(*args, **kwargs)
        finally:
            spent[0] += time.process_time() - c0

    planner.mix_policies = timed
    t0, c0 = time.perf_counter(), time.process_time()
    argv = CASES[case]
    if argv is None:
        model = zoo.build("llama3-70b", batch=1024, seq=4096, device="meta")
        cluster = autoshard.load_cluster("a100x8", nodes=128, mesh=(16, 8, 8))
        plan = autoshard.plan(model.model, cluster, model.args, model.kwargs)
    else:
        from autoshard.cli import main

        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "plan.json"
            code = main([*argv, "--out", str(out)])
            if code:
                raise RuntimeError(f"autoshard {' '.join(argv)} exited {code}")
            plan = autoshard.load_plan(out)
    return {
        "cpu_s": time.process_time() - c0,
        "wall_s": time.perf_counter() - t0,
        "recompute_search_cpu_s": spent[0],
        "step_s": plan.predicted_step_time,
        "objective": plan.solver.objective,
        "recompute": plan.recompute,
        "k": plan.recompute_blocks,
        "method": plan.solver.method,
        "optimal": plan.solver.optimal,
        "mesh": list(plan.mesh_shape),
        "memory_gib": plan.memory_per_device / 2**30,
    }


def run(log: Any = print) -> list[dict[str, Any]]:
    """Every case in its own process, one line each as it finishes."""
    rows = []
    for case in CASES:
        row = {
            "case": case,
            **run_isolated("benchmarks.plan_budget:budget_case", {"case": case}, timeout=1800),
        }
        log(_line(row) if "error" not in row else f"{case} failed: {row['error'][:300]}")
        rows.append(row)
    return rows


def _line(r: dict[str, Any]) -> str:
    k = f"{r['recompute']}" + (f", k = {r['k']}" if r["k"] is not None else "")
    text = (
        f"{r['case']}: {r['cpu_s']:.1f} s CPU / {r['wall_s']:.1f} s wall, {r['peak_rss_gib']:.2f} GiB, "
        f"recompute search {r['recompute_search_cpu_s']:.2f} s CPU, step {r['step_s']:.4g} s, "
        f"recompute {k}, mesh {'x'.join(map(str, r['mesh']))}, {r['memory_gib']:.1f} GiB/device, "
        f"{r['method']}, optimal {r['optimal']}, objective {r['objective']!r}"
    )
    before = BEFORE.get(r["case"])
    if before is not None:
        cpu, search, wall, objective = before
        same = "same" if math.isclose(r["objective"], objective, rel_tol=1e-9) else "DIFFERENT"
        text += (
            f"; before: {cpu:.1f} s CPU / {wall:.0f} s wall, recompute search {search:.2f} s CPU, "
            f"{same} objective"
        )
    return text


if __name__ == "__main__":
    rows = run()
    if "--json" in sys.argv:
        print(json.dumps(rows, indent=1))
    sys.exit(0)
