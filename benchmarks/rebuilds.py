"""CPU seconds of the builds the planner makes of one capture (issue 17): one per recomputation policy, then
one per zigzag cluster the layout search may rebuild on.

Run: ``OMP_NUM_THREADS=1 python -m benchmarks.rebuilds [70|8 ...] [--repeat N]`` (each run in a fresh
process; on a loaded machine take the least of a few runs).  The capture is made once, outside the timing;
then, in the planner's order, ``none`` (the cold build: strategies, redistribution tables, per-strategy
figures), ``selective`` and ``full`` (composed from what ``none`` kept, :mod:`autoshard.problem.shared`),
and ``zigzag a`` for each mesh axis ``a`` (policy selective, after the plain builds: only the prices a zigzag
axis raises are asked again).  ``time.process_time`` around each ``build_problem``, the cyclic collector off
as :func:`autoshard.plan` has it (:mod:`autoshard.gcpause`).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from benchmarks.isolate import run_isolated
from benchmarks.plan_phases import CASES

__all__ = ["main", "rebuilds_case"]


def captured_case(
    model: str, profile: str, mesh: Any, nodes: int, batch: int, seq: int
) -> tuple[Any, Any, float]:
    """(cluster, captured model, memory limit) of one case, as autoshard.plan makes them."""
    import autoshard
    from autoshard import zoo
    from autoshard.capture import capture

    case = zoo.build(model, batch=batch, seq=seq, device="meta")
    cluster = autoshard.load_cluster(profile, nodes=nodes, mesh=tuple(mesh))
    args = case.args if isinstance(case.args, tuple) else (case.args,)
    return cluster, capture(case.model, args, dict(case.kwargs or {})), float(cluster.device_memory)


def rebuilds_case(which: str) -> dict[str, Any]:
    """Capture one case in this (child) process, then each build's CPU seconds."""
    import gc

    from autoshard.problem.build import build_problem
    from autoshard.problem.context import zigzag_cluster
    from autoshard.problem.costs import CostOptions, Recompute

    cluster, captured, limit = captured_case(*CASES[which][:6])
    spent: dict[str, Any] = {}
    gc.disable()  # as autoshard.plan runs (autoshard.gcpause)

    def timed(label: str, target: Any, policy: Recompute) -> None:
        c0 = time.process_time()
        build_problem(captured, target, CostOptions(recompute=policy), memory_limit=limit)
        spent[label] = round(time.process_time() - c0, 3)

    for policy in Recompute:
        timed(policy.value, cluster, policy)
    spent["policies"] = round(sum(spent[p.value] for p in Recompute), 3)
    for axis in reversed(range(len(cluster.mesh_shape))):
        timed(f"zigzag {axis}", zigzag_cluster(cluster, axis), Recompute.SELECTIVE)
    return spent


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="*", default=["70"], choices=["8", "70"])
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args(argv)
    for case in args.cases:
        for _ in range(args.repeat):
            r = run_isolated("benchmarks.rebuilds:rebuilds_case", {"which": case}, timeout=900)
            print(f"{CASES[case][0]} {CASES[case][2]}: {r}", flush=True)


if __name__ == "__main__":
    main()
