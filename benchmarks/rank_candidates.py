"""The default search against every ``--forbid`` one on the new-user trial's case (autoshard/planner_candidates.py).

Run: ``OMP_NUM_THREADS=1 python -m benchmarks.rank_candidates [trial|small]``.

``trial``: ``autoshard search --profile h100x8 --model llama3-8b --nodes 2 --mesh 2x8 --batch 2 --seq 8192``;
``small``: the LLaMA of 2048 hidden x 4 layers (batch 2 x 4096) on the same cluster that
``tests/planner/test_planner_candidates.py`` plans.  For the default and each ``--forbid KIND`` it prints the
plan's degrees, its reported step, the proven bound, how many plans the ranking priced, and the CPU seconds
(``time.process_time``) of planning and of the ranking alone.  The model is captured once.

Figures, 2026-11-25 on the shared 2-core machine (before: the ranking without the sync-exposed and the
restricted candidates):

* trial, default: CP 8 x DP 2 at 197.70 ms (bound 134.97, 2 plans priced, rank 0.21-0.24 CPU s) ->
  TP 2 x CP 8 at 157.48 ms (6 priced, rank 0.67-0.73 CPU s); ``--forbid cp`` 188.36 -> 166.60 ms,
  ``--forbid dp`` 166.22, ``--forbid sp`` 191.75, ``--forbid tp`` 204.25 ms.
* small, default: CP 8 x DP 2 at 10.04 ms -> TP 2 x CP 8 at 7.52 ms (bound 6.95), the plan ``--forbid dp``
  proves optimal among plans without dp (its bound 7.52); ``--forbid cp`` 8.73, ``sp`` 10.11, ``tp`` 8.13.
* LLaMA-3-70B on 16 x 8 x 8 (``python -m benchmarks.plan_phases 70``): proven, nothing more priced; rank
  0.51-0.54 CPU s before, 0.51-0.53 after.

With the bound raised by the sync a backward cannot hide (autoshard/planner_dual.py: up to three more solves
and their plans priced, only while unproven), 2026-11-25, load 3.7-4.7, main then this, back to back:

* trial: default 157.48 ms either way, bound 134.97 -> 137.24 ms, rank 1.59 -> 3.43 CPU s; ``--forbid cp``
  166.60 -> 163.27 ms, ``dp`` 166.57 -> 161.26, ``tp`` 211.06 -> 178.40, ``sp`` 191.88 (unchanged).
* small: default 7.83 -> 7.67 ms (bound 6.95 -> 7.35), rank 1.15 -> 1.97 CPU s; ``--forbid cp`` 8.74 ->
  8.62, ``tp`` 10.40 -> 9.95; ``dp`` 8.23 and ``sp`` 9.84 unchanged.
* LLaMA-3-70B 16 x 8 x 8 and LLaMA-3-8B 2 x 4 x 8 (``plan_phases 70 8``): proven before the dual, unchanged.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import autoshard
import autoshard.planner_steps as steps
from autoshard import zoo
from autoshard.capture import capture
from autoshard.planner_rerank import rank_plan

__all__ = ["run"]

KINDS = ("cp", "dp", "sp", "tp")


def _case(name: str) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    if name == "trial":
        case = zoo.build("llama3-8b", batch=2, seq=8192)
        return case.model, case.args, dict(case.kwargs)
    sys.path.insert(0, "tests/planner")
    from test_planner_candidates import _llama

    model, args = _llama()
    return model, args, {}


def run(name: str = "trial") -> None:
    model, args, kwargs = _case(name)
    cluster = autoshard.load_cluster("h100x8", nodes=2, mesh=(2, 8))
    captured = capture(model, args, kwargs)
    ranking: list[float] = []

    def timed_rank(*a: Any, **k: Any) -> Any:
        t0 = time.process_time()
        try:
            return rank_plan(*a, **k)
        finally:
            ranking.append(time.process_time() - t0)

    steps.rank_plan = timed_rank
    for forbid in ((), *((k,) for k in KINDS)):
        ranking.clear()
        t0 = time.process_time()
        plan = autoshard.plan(model, cluster, args, kwargs, captured=captured, forbid=list(forbid))
        cpu = time.process_time() - t0
        s = plan.solver
        bound = f"{s.step_bound * 1e3:.2f} ms" if s.step_bound is not None else "none"
        label = f"--forbid {forbid[0]}" if forbid else "default"
        print(
            f"{name} {label:>12}: {plan.degrees} step {plan.predicted_step_time * 1e3:.2f} ms, bound {bound}, "
            f"{len(s.ranked)} priced, chosen {s.chosen!r}; plan {cpu:.2f} CPU s, rank {sum(ranking):.2f} CPU s "
            f"({len(ranking)} rankings)"
        )


if __name__ == "__main__":
    for arg in sys.argv[1:] or ["trial"]:
        run(arg)
