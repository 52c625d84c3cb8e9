"""CPU seconds per planning phase (issue 17): where ``autoshard.plan`` spends its time on the scale cases.

Run: ``OMP_NUM_THREADS=1 python -m benchmarks.plan_phases [8|70|405 ...]`` (each case in a fresh process).

Wall time on the shared 2-core machine says more about the load than about the code; this reports each
phase's *CPU* seconds (``time.process_time``), measured by wrapping the planner's steps in the child process:
capture, build (strategies and costs, every policy and share), solve (the uniform recomputation policies,
sequence layouts included), bound_policy (policies bounded instead of solved, :mod:`autoshard.planner_policy`),
recompute_blocks (the per-block search with its share-0 builds), rank (the critical-path ranking), and the
objective, so a speed change can be checked not to move the optimum.

Cases (those of :mod:`benchmarks.plan_scale`): ``8`` LLaMA-3-8B on 2 x 4 x 8 A100, ``70`` LLaMA-3-70B on
16 x 8 x 8 A100 (batch 1024 x 4096), ``405`` the 405B-shaped LLaMA on 16 x 8 x 16 x 8 H100 with Llama 3's
published PP 16 layout pinned (its stages are planned inside the pipeline search: only capture and build
are split out there).
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable
from typing import Any

from benchmarks.isolate import run_isolated
from benchmarks.plan_scale import PUBLISHED, plan_case

__all__ = ["CASES", "phases_case", "run"]

CASES: dict[str, tuple[str, str, list[int], int, int, int, dict[str, Any] | None]] = {
    "8": ("llama3-8b", "a100x8", [2, 4, 8], 8, 64, 4096, None),
    "70": ("llama3-70b", "a100x8", [16, 8, 8], 128, 1024, 4096, None),
    "405": ("llama3-405b", "h100x8", [16, 8, 16, 8], 2048, 128, 131072, PUBLISHED),
}

#: planner.py name -> phase label
_PHASES = {
    "capture": "capture",
    "build": "build",
    "by_step": "solve",
    "cannot_win": "bound_policy",
    "search_counts": "recompute_blocks",
    "ranked": "rank",
}


def phases_case(which: str) -> dict[str, Any]:
    """Plan one case in this (child) process with each phase's CPU seconds counted."""
    import autoshard.planner as planner

    spent: dict[str, float] = {}
    active: list[str] = []

    def timed(label: str, func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            c0 = time.process_time()
            active.append(label)
            try:
                return func(*args, **kwargs)
            finally:
                active.pop()
                if label not in active:  # nested calls (build inside the layout search) count once
                    spent[label] = spent.get(label, 0.0) + time.process_time() - c0

        return wrapper

    for name, label in _PHASES.items():
        if hasattr(planner, name):
            setattr(planner, name, timed(label, getattr(planner, name)))
    r = plan_case(*CASES[which])
    keys = ("cpu_s", "objective", "optimal", "gap", "method", "step_s")
    return {**{k: r[k] for k in keys}, "phases": {k: round(v, 2) for k, v in spent.items()}}


def run(which: list[str], log: Any = print) -> list[dict[str, Any]]:
    rows = []
    for case in which:
        r = run_isolated("benchmarks.plan_phases:phases_case", {"which": case}, timeout=900)
        rows.append(r)
        if "error" in r:
            log(f"{case}: error {r['error'][:300]}")
            continue
        log(
            f"{' '.join(map(str, CASES[case][:3]))}: {r['cpu_s']:.2f} s CPU, phases {r['phases']}, "
            f"peak RSS {r['peak_rss_gib']:.2f} GiB, objective {r['objective']!r}, step {r['step_s']:.6g} s, "
            f"{r['method']}, optimal {r['optimal']}, gap {r['gap']:.4%}"
        )
    return rows


if __name__ == "__main__":
    run(sys.argv[1:] or list(CASES))
    sys.exit(0)
