"""Each recomputation policy's step lower bounds on the 405B pipelined case, against the step the search found.

Run: ``OMP_NUM_THREADS=1 python -m benchmarks.plan_scale_bounds`` (CASES[3] of :mod:`benchmarks.plan_scale`:
LLaMA-3 405B shape at 128K tokens, PP 16 over a (16, 8, 16, 8) mesh of H100s, 16 microbatches, every schedule).

Every policy's stage problem is solved here (the bounds switched off in the search), then priced with:

- ``floor``: :func:`~autoshard.pipeline.search.compute_floor` (m / p x every node's least compute);
- ``layers``: :func:`~autoshard.pipeline.bound.step_bound` (the busiest device's ceil(L / p) layers, the
  schedule's bubble factor, one layer's compute and activation moves; its dual solve under the stage budget);
- ``own``: the same factor times the found plan's own ``B(s) / L`` (what the bound is at best when the found
  plan is the layer problem's optimum);
- the step the stage DP priced for the found plan, and each bound's margin to the best step of the others
  (a policy is pruned when its bound reaches that).

CPU seconds (``time.process_time``) of each bound and of the stage solve it would replace.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from typing import Any

from benchmarks.plan_scale import CASES

__all__ = ["bounds"]


def bounds() -> list[dict[str, Any]]:
    """Per policy: the bounds, the found step, CPU seconds."""
    import autoshard
    import autoshard.pipeline.search as search
    from autoshard import zoo
    from autoshard.pipeline.bound import layer_problem, schedule_factor, step_bound
    from autoshard.pipeline.layers import stage_memory_problem
    from autoshard.pipeline.schedules import Schedule, in_flight, torch_refuses, virtual_stage_options
    from autoshard.search import evaluate

    model, profile, mesh, nodes, batch, seq, staged = CASES[3]
    case = zoo.build(model, batch=batch, seq=seq, device="meta")
    cluster = autoshard.load_cluster(profile, nodes=nodes, mesh=tuple(mesh))
    found: list[tuple[Any, float, Any]] = []
    price = search._price

    def record(*args: Any, **kwargs: Any) -> Any:
        c0 = time.process_time()
        result = price(*args, **kwargs)
        found.append((args[4].recompute, time.process_time() - c0, result))
        return result

    floor_of = search.compute_floor
    search._price = record
    search.step_bound = lambda *args: 0.0
    search.compute_floor = lambda built, degree: 0.0
    try:
        autoshard.plan(case.model, cluster, case.args, case.kwargs, **staged)
    finally:
        search._price, search.step_bound, search.compute_floor = price, step_bound, floor_of
    rows = []
    steps = {policy: c.step_seconds for policy, _, c in found if c is not None}
    for policy, cpu, c in found:
        if c is None:
            continue
        p, m, built, layers = c.layout.degree, c.microbatches, c.built, c.built.num_blocks
        problem = stage_memory_problem(built, p, in_flight(Schedule.ONE_F_ONE_B, 0, p, 1, m))
        problem = dataclasses.replace(problem, memory_limit=float(cluster.device_memory))
        shapes = [
            (s, v)
            for s in Schedule
            for v in virtual_stage_options(s, p, layers)
            if torch_refuses(s, p, v, m) is None
        ]  # every schedule: the case's "auto"
        others = min((s for q, s in steps.items() if q is not policy), default=math.inf)
        c0 = time.process_time()
        bound = step_bound(built, problem, shapes, p, others, 60.0, search.STAGE_MAX_FACTOR)
        bound_cpu = time.process_time() - c0
        factor = min(schedule_factor(s, v, p, layers, m) for s, v in shapes)
        own = evaluate(layer_problem(built, problem), c.solution.choice) * factor / layers
        rows.append(
            dict(policy=policy.value, step=c.step_seconds, others=others, floor=floor_of(built, p), layers=bound,
                 own=own, solve_cpu=cpu, bound_cpu=bound_cpu)
        )  # fmt: skip
    return rows


def main() -> None:
    for r in bounds():
        margin = (r["layers"] - r["others"]) / r["others"] if math.isfinite(r["others"]) else math.nan
        print(
            f"{r['policy']:>9}: step {r['step']:.4f} s (stage solve + DP {r['solve_cpu']:.2f} s CPU); floor "
            f"{r['floor']:.4f}, layer bound {r['layers']:.4f} ({r['bound_cpu']:.2f} s CPU), on its own plan "
            f"{r['own']:.4f}; best other policy {r['others']:.4f} s, margin {margin:+.2%}"
        )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
