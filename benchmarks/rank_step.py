"""What ranking plans by the reported step costs and changes (autoshard/planner_rerank.py).

The new user's two cases, planned on every candidate mesh as ``autoshard search`` does:

* ``gpt2``: README command 1 (GPT-2, batch 8 x 1024, one 8 x A100 node): the plan's step, its label, the
  proven bound, and the ranking's own time per mesh (wall and CPU) against planning without it;
* ``llama``: ``--model llama3-8b --forbid tp --memory-limit 40``: the pinned plan's step against the
  unpinned price (was 1.175 s pinned vs 1.194 s "unpinned optimum").

    python -m benchmarks.rank_step                 # gpt2
    python -m benchmarks.rank_step --case llama    # about a minute per mesh on 2 cores
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import autoshard
import autoshard.planner as planner_module
from autoshard import zoo
from autoshard.capture import capture
from autoshard.meshsearch import candidate_meshes
from autoshard.plans import Plan
from autoshard.report.proof import proof_line


def _timed(fn: Callable[[], Plan]) -> tuple[Plan, float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    plan = fn()
    return plan, time.perf_counter() - wall, time.process_time() - cpu


def _without_ranking() -> Any:
    """Context: autoshard.plan with the ranking step replaced by the identity (for the time it adds)."""
    original = planner_module.rank_plan

    class Off:
        def __enter__(self) -> None:
            planner_module.rank_plan = lambda found, *a, **k: found

        def __exit__(self, *exc: object) -> None:
            planner_module.rank_plan = original

    return Off()


def gpt2() -> None:
    case = zoo.build("gpt2")
    captured = capture(case.model, case.args, dict(case.kwargs))
    print("README command 1: gpt2 on 1 x a100x8, every candidate mesh")
    total = {"on": [0.0, 0.0], "off": [0.0, 0.0]}
    for mesh in candidate_meshes(1, 8):
        cluster = autoshard.load_cluster("a100x8", mesh=mesh)

        def run(cluster: autoshard.Cluster = cluster) -> Plan:
            return autoshard.plan(case.model, cluster, case.args, case.kwargs, captured=captured)

        with _without_ranking():
            off, off_wall, off_cpu = _timed(run)
        on, on_wall, on_cpu = _timed(run)
        for key, wall, cpu in (("on", on_wall, on_cpu), ("off", off_wall, off_cpu)):
            total[key][0] += wall
            total[key][1] += cpu
        print(
            f"  mesh {'x'.join(map(str, mesh)):6s} step {on.predicted_step_time * 1e3:8.3f} ms "
            f"(unranked {off.predicted_step_time * 1e3:8.3f} ms)  rank {on.timings.get('rank', 0.0) * 1e3:6.1f} ms  "
            f"plan {on_wall:.2f} s wall {on_cpu:.2f} s CPU (unranked {off_wall:.2f} / {off_cpu:.2f})"
        )
        print(f"    proven: {proof_line(on)}")
    extra_wall = total["on"][0] - total["off"][0]
    extra_cpu = total["on"][1] - total["off"][1]
    print(f"  ranking adds {extra_wall:.3f} s wall, {extra_cpu:.3f} s CPU over all meshes")


def llama() -> None:
    case = zoo.build("llama3-8b")
    captured = capture(case.model, case.args, dict(case.kwargs))
    print("llama3-8b --forbid tp --memory-limit 40 on 1 x a100x8")
    pins: dict[str, Any] = {"captured": captured, "forbid": ["tp"], "memory_limit": 40 * 2**30}
    for mesh in candidate_meshes(1, 8):
        cluster = autoshard.load_cluster("a100x8", mesh=mesh)

        def run(cluster: autoshard.Cluster = cluster) -> Plan:
            return autoshard.plan(case.model, cluster, case.args, case.kwargs, **pins)

        plan, wall, cpu = _timed(run)
        price = plan.unpinned_step_time
        print(
            f"  mesh {'x'.join(map(str, mesh)):6s} pinned {plan.predicted_step_time:.4f} s, unpinned price "
            f"{price if price is None else round(price, 4)} s; rank {plan.timings.get('rank', 0.0):.2f} s; "
            f"plan {wall:.1f} s wall {cpu:.1f} s CPU"
        )
        print(f"    proven: {proof_line(plan)}")
        print(f"    ranked: {'; '.join(plan.solver.ranked)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=("gpt2", "llama"), default="gpt2")
    args = parser.parse_args()
    {"gpt2": gpt2, "llama": llama}[args.case]()


if __name__ == "__main__":
    main()
