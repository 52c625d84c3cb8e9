"""What ranking plans by the reported step costs and changes (autoshard/planner_rerank.py).

The new user's two cases, planned on every candidate mesh as ``autoshard search`` does:

* ``gpt2``: README command 1 (GPT-2, batch 8 x 1024, one 8 x A100 node): the plan's step, its label, the
  proven bound, and the ranking's own time per mesh (wall and CPU) against planning without it;
* ``llama``: ``--model llama3-8b --forbid tp --memory-limit 40``: the pinned plan's step against the
  unpinned price (was 1.175 s pinned vs 1.194 s "unpinned optimum");
* ``scale``: LLaMA-3-70B on 16 x 8 x 8 A100 (issue 17's case): the ranking's CPU seconds in the plan;
* ``forbid``: ``autoshard search --profile a100x8 --model llama3-8b --forbid tp``: CPU seconds of the whole
  command and of its rankings (every ``rank_plan`` call, pinned and unpinned), and per candidate mesh its floor
  (:mod:`autoshard.meshbound`), whether it was solved or pruned, and its CPU seconds.

    python -m benchmarks.rank_step                 # gpt2
    python -m benchmarks.rank_step --case llama    # about a minute per mesh on 2 cores
    python -m benchmarks.rank_step --case scale    # about 20 s CPU
    python -m benchmarks.rank_step --case forbid   # about 8 s CPU (was 95 s before autoshard/meshbound.py)
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import autoshard
import autoshard.planner_steps as planner_module
from autoshard import meshsearch, zoo
from autoshard.capture import capture
from autoshard.meshsearch import MeshCandidate, MeshSearch, candidate_meshes
from autoshard.plans import Plan
from autoshard.report.proof import proof_line


def _timed(fn: Callable[[], Plan]) -> tuple[Plan, float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    plan = fn()
    return plan, time.perf_counter() - wall, time.process_time() - cpu


class _RankClock:
    """Wraps ``autoshard.planner_steps.rank_plan`` to add up the CPU and wall seconds it takes."""

    def __init__(self) -> None:
        self.cpu = self.wall = 0.0
        self.original = planner_module.rank_plan

    def __enter__(self) -> _RankClock:
        def timed(*args: Any, **kwargs: Any) -> Plan:
            wall, cpu = time.perf_counter(), time.process_time()
            try:
                return self.original(*args, **kwargs)
            finally:
                self.cpu += time.process_time() - cpu
                self.wall += time.perf_counter() - wall

        planner_module.rank_plan = timed
        return self

    def __exit__(self, *exc: object) -> None:
        planner_module.rank_plan = self.original


def gpt2(repeats: int = 3) -> None:
    case = zoo.build("gpt2")
    captured = capture(case.model, case.args, dict(case.kwargs))
    print(f"README command 1: gpt2 on 1 x a100x8, every candidate mesh (best of {repeats} runs)")
    total_cpu = total_wall = 0.0
    for mesh in candidate_meshes(1, 8):
        cluster = autoshard.load_cluster("a100x8", mesh=mesh)
        runs = []

        def run(cluster: autoshard.Cluster = cluster) -> Plan:
            return autoshard.plan(case.model, cluster, case.args, case.kwargs, captured=captured)

        for _ in range(repeats):
            with _RankClock() as clock:
                plan, wall, cpu = _timed(run)
            runs.append((clock.cpu, clock.wall, cpu, wall, plan))
        rank_cpu, rank_wall, cpu, wall, plan = min(runs, key=lambda r: r[0])
        total_cpu, total_wall = total_cpu + rank_cpu, total_wall + rank_wall
        print(
            f"  mesh {'x'.join(map(str, mesh)):6s} step {plan.predicted_step_time * 1e3:8.3f} ms  ranking "
            f"{rank_cpu * 1e3:6.1f} ms CPU {rank_wall * 1e3:6.1f} ms wall, of planning {cpu:.2f} s CPU "
            f"{wall:.2f} s wall"
        )
        print(f"    proven: {proof_line(plan)}")
    print(
        f"  ranking adds {total_cpu:.3f} s CPU ({total_wall:.3f} s wall) over the {len(candidate_meshes(1, 8))} meshes"
    )


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


def scale() -> None:
    case = zoo.build("llama3-70b", batch=1024, seq=4096, device="meta")
    cluster = autoshard.load_cluster("a100x8", nodes=128, mesh=(16, 8, 8))
    with _RankClock() as clock:
        plan, wall, cpu = _timed(lambda: autoshard.plan(case.model, cluster, case.args, case.kwargs))
    print(
        f"llama3-70b 16x8x8: ranking {clock.cpu:.2f} s CPU ({clock.wall:.2f} s wall) of planning {cpu:.1f} s CPU "
        f"({wall:.1f} s wall)"
    )
    print(f"    proven: {proof_line(plan)}")
    print(f"    ranked: {'; '.join(plan.solver.ranked)}")


def forbid() -> None:
    import contextlib
    import io

    from autoshard.cli import main as cli

    argv = ["search", "--profile", "a100x8", "--model", "llama3-8b", "--forbid", "tp"]
    out = io.StringIO()
    original = meshsearch.search_mesh
    meshsearch.search_mesh = _keep_last(original)  # the CLI imports it at call time
    try:
        with _RankClock() as clock, contextlib.redirect_stdout(out):
            _, wall, cpu = _timed(lambda: cli(argv))  # type: ignore[arg-type,return-value]
    finally:
        meshsearch.search_mesh = original
    head = out.getvalue().splitlines()[0]
    print(f"autoshard {' '.join(argv)}: {head}")
    print(
        f"    {cpu:.1f} s CPU ({wall:.1f} s wall), of which ranking {clock.cpu:.2f} s CPU ({clock.wall:.2f} s wall)"
    )
    for line in out.getvalue().splitlines():
        if line.startswith(("  price of", "proven", "note: mesh search", "note:   runner-up")):
            print(f"    {line.strip()}")
    print("    per candidate mesh (autoshard.meshbound): floor before planning, then solved or pruned")
    for c in _candidates():
        floor = "none" if c.floor is None else f"{c.floor:.6f} s"
        what = f"pruned, bound {c.bound:.6f} s" if c.pruned else f"solved, step {c.step_seconds:.6f} s"
        mesh = "x".join(map(str, c.mesh_shape))
        print(f"      {mesh:6s} floor {floor}; {what}; {c.cpu_seconds:.2f} s CPU {c.seconds:.2f} s wall")
        for line in c.proof:
            print(f"        {line}")


def _candidates() -> tuple[MeshCandidate, ...]:
    """The last mesh search's candidates (the CLI prints their plans, not these records)."""
    return _LAST[0].candidates if _LAST else ()


_LAST: list[MeshSearch] = []


def _keep_last(search: Callable[..., MeshSearch]) -> Callable[..., MeshSearch]:
    def kept(*args: Any, **kwargs: Any) -> MeshSearch:
        found = search(*args, **kwargs)
        _LAST[:] = [found]
        return found

    return kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=("gpt2", "llama", "scale", "forbid"), default="gpt2")
    args = parser.parse_args()
    {"gpt2": gpt2, "llama": llama, "scale": scale, "forbid": forbid}[args.case]()


if __name__ == "__main__":
    main()
