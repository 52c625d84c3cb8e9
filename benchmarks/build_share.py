"""CPU seconds of ``build_problem`` inside a whole plan (issue 17): builds of one capture share their work.

Run: ``OMP_NUM_THREADS=1 python -m benchmarks.build_share [case ...]`` (each case in a fresh process).
Cases: ``70b`` (LLaMA-3-70B on 16 x 8 x 8, benchmarks.plan_scale), ``8b`` (LLaMA-3-8B on 2 x 4 x 8),
``405b-pp`` (the 405B-shaped LLaMA with Llama 3's pipeline layout pinned: the pipeline search builds each
policy on the stage sub-mesh) and ``gpt2-mesh`` (``autoshard search gpt2 --nodes 2``: the mesh search
builds every candidate mesh).  Per case it prints how many builds ran, the CPU seconds of each (the first
prices everything, the later ones reuse it: problem/shared.py), their total, and the plan's objective.

It wraps ``autoshard.planner_steps.build_problem``, which every planner path calls, so the same script
measures an older checkout too (``PYTHONPATH=<older tree> python -m benchmarks.build_share``): the same
objective there and here says the shared builds changed no optimum.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from benchmarks.isolate import run_isolated

__all__ = ["CASES", "measure", "run"]

#: name -> plan_case arguments (benchmarks.plan_scale), or None for the mesh search
CASES: dict[str, tuple[Any, ...] | None] = {
    "70b": ("llama3-70b", "a100x8", [16, 8, 8], 128, 1024, 4096, None),
    "8b": ("llama3-8b", "a100x8", [2, 4, 8], 8, 64, 4096, None),
    "405b-pp": (
        "llama3-405b", "h100x8", [16, 8, 16, 8], 2048, 128, 131072,
        {"pipeline": 16, "microbatches": 16, "schedule": "auto"},
    ),
    "gpt2-mesh": None,
}  # fmt: skip


def measure(case: str) -> dict[str, Any]:
    """Plan one case with every ``build_problem`` call timed (CPU seconds of this process)."""
    import autoshard.planner_steps as steps

    real = steps.build_problem
    seconds: list[float] = []

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.process_time()
        try:
            return real(*args, **kwargs)
        finally:
            seconds.append(time.process_time() - start)

    steps.build_problem = timed  # type: ignore[assignment]
    start = time.process_time()
    spec = CASES[case]
    if spec is None:
        objective = _mesh_search()
    else:
        from benchmarks.plan_scale import plan_case

        objective = plan_case(*spec)["objective"]
    return {"builds": seconds, "plan_cpu_s": time.process_time() - start, "objective": objective}


def _mesh_search() -> float:
    from autoshard import zoo
    from autoshard.meshsearch import search_mesh

    case = zoo.build("gpt2")
    found = search_mesh(case.model, "a100x8", case.args, case.kwargs, nodes=2)
    return found.plan.predicted_step_time


def run(cases: list[str] | None = None, log: Any = print) -> list[dict[str, Any]]:
    rows = []
    for case in cases or list(CASES):
        r = run_isolated("benchmarks.build_share:measure", {"case": case}, timeout=1800)
        r["case"] = case
        rows.append(r)
        if "error" in r:
            log(f"{case}: error {r['error'][:300]}")
            continue
        each = ", ".join(f"{s:.3f}" for s in r["builds"])
        log(
            f"{case}: {len(r['builds'])} builds, {sum(r['builds']):.2f} s CPU in build_problem ({each}); "
            f"plan {r['plan_cpu_s']:.1f} s CPU, peak RSS {r['peak_rss_gib']:.2f} GiB, objective {r['objective']!r}"
        )
    return rows


if __name__ == "__main__":
    run(sys.argv[1:] or None)
