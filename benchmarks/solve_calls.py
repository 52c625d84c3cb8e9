"""CPU seconds of every ``search.solve`` call one plan makes (issue 17): the budgeted solves of the layout search
(balanced bound B, contiguous C, the zigzag layouts), the recompute-count search's intervals and the rank.

Run: ``OMP_NUM_THREADS=1 python -m benchmarks.solve_calls [8|70 ...]`` (each case in a fresh process).

:mod:`benchmarks.plan_phases` splits a plan by planner phase; this splits its solver time by call, each line
with the problem's size, whether a budget binds, the ceiling it was given and its answer (objective and bound,
or the exception it raised), so a solver change can be checked call by call not to move a result.  Wall time
on a shared machine says little; the figures are each call's ``time.process_time``.
"""

from __future__ import annotations

import importlib
import math
import sys
import time
from typing import Any

from benchmarks.isolate import run_isolated
from benchmarks.plan_phases import CASES
from benchmarks.plan_scale import plan_case

__all__ = ["calls_case", "run"]

#: Modules that bound ``search.solve`` by name at import: the wrapper replaces it in each.
_USERS = (
    "autoshard.search",
    "autoshard.planner_layout",
    "autoshard.planner_policy",
    "autoshard.planner_rerank",
    "autoshard.planner_steps",
    "autoshard.multishape",
    "autoshard.meshbound",
)


def calls_case(which: str) -> dict[str, Any]:
    """Plan one case in this (child) process with each ``solve`` call's CPU seconds and answer recorded."""
    solve = importlib.import_module("autoshard.search.solve").solve
    calls: list[dict[str, Any]] = []

    def timed(problem: Any, **kwargs: Any) -> Any:
        c0 = time.process_time()
        row: dict[str, Any] = {"nodes": problem.num_nodes, "budget": problem.memory_limit is not None}
        row["ceiling"] = kwargs.get("ceiling", math.inf)
        try:
            found = solve(problem, **kwargs)
            row["answer"] = f"{found.objective!r} (bound {found.lower_bound!r}, {found.method})"
            return found
        except Exception as e:  # recorded, then raised on: the planner handles it as before
            row["answer"] = f"{type(e).__name__}: {str(e)[:80]}"
            raise
        finally:
            row["cpu_s"] = round(time.process_time() - c0, 3)
            calls.append(row)

    for name in _USERS:
        module = importlib.import_module(name)
        if hasattr(module, "solve"):
            module.solve = timed  # type: ignore[attr-defined]
    r = plan_case(*CASES[which])
    return {"cpu_s": r["cpu_s"], "objective": r["objective"], "optimal": r["optimal"], "calls": calls}


def run(which: list[str], log: Any = print) -> list[dict[str, Any]]:
    rows = []
    for case in which:
        r = run_isolated("benchmarks.solve_calls:calls_case", {"which": case}, timeout=900)
        rows.append(r)
        if "error" in r:
            log(f"{case}: error {r['error'][:300]}")
            continue
        total = sum(c["cpu_s"] for c in r["calls"])
        log(
            f"{' '.join(map(str, CASES[case][:3]))}: {r['cpu_s']:.2f} s CPU, {len(r['calls'])} solves "
            f"{total:.2f} s, objective {r['objective']!r}, optimal {r['optimal']}"
        )
        for k, c in enumerate(r["calls"]):
            log(
                f"  {k:2d} {c['cpu_s']:6.3f} s  {c['nodes']} nodes{', budget' if c['budget'] else ''}, "
                f"ceiling {c['ceiling']:.6g}: {c['answer']}"
            )
    return rows


if __name__ == "__main__":
    run(sys.argv[1:] or ["70"])
    sys.exit(0)
