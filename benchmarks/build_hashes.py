"""Digests of every array of every problem the planner builds of one capture (issue 17): a speed-up of the
builder is exact when two checkouts print the same digests.

Run: ``OMP_NUM_THREADS=1 python -m benchmarks.build_hashes [70 8 tiny ...]`` here, and again with
``PYTHONPATH=<older tree>``; compare the lines (the last one per case digests them all).  Per case (each in
a fresh process): the capture once, then, in the planner's order and sharing its caches as the planner does,
each recomputation policy, the per-block search's ``recompute_share=0`` builds, the contiguous layout, and
each policy on the zigzag cluster of every mesh axis (:mod:`autoshard.problem.shared`,
:mod:`autoshard.problem.pricing`).  A digest covers node costs, memory, peaks, edges (ends and cost matrix),
masks, names, strategy labels and the budget of the :class:`~autoshard.search.SearchProblem`, bit for bit.
Cases: ``70`` and ``8`` (:data:`benchmarks.plan_phases.CASES`), ``tiny`` (``llama-tiny`` on 2 x 2 x 2, a
sequence of 64 so every axis may ring).
"""

from __future__ import annotations

import argparse
import hashlib
from typing import Any

from benchmarks.isolate import run_isolated

__all__ = ["digest", "hashes_case", "main"]


def digest(problem: Any) -> str:
    """sha256 (first 16 hex digits) of every array and label of a SearchProblem."""
    import numpy as np

    h = hashlib.sha256()

    def add(array: Any) -> None:
        if array is None:
            h.update(b"none")
            return
        a = np.ascontiguousarray(array)
        h.update(repr((a.dtype.str, a.shape)).encode())
        h.update(a.tobytes())

    for arrays in (problem.node_costs, problem.memory or (), problem.peak or (), problem.allowed or ()):
        h.update(b"|")
        for a in arrays:
            add(a)
    for e in problem.edges:
        h.update(repr((e.u, e.v)).encode())
        add(e.cost)
    h.update(repr((problem.names, problem.strategy_labels, problem.memory_limit)).encode())
    return h.hexdigest()[:16]


def hashes_case(which: str) -> dict[str, str]:
    """Every build of one case in this (child) process, in the planner's order: label -> digest."""
    import gc

    from autoshard.problem.build import build_problem
    from autoshard.problem.context import zigzag_cluster
    from autoshard.problem.costs import CostOptions, Recompute
    from benchmarks.plan_phases import CASES
    from benchmarks.rebuilds import captured_case

    tiny = ("llama-tiny", "a100x8", [2, 2, 2], 1, 4, 64)
    cluster, captured, limit = captured_case(*(tiny if which == "tiny" else CASES[which][:6]))
    gc.disable()  # as autoshard.plan runs (autoshard.gcpause)
    builds: list[tuple[str, Any, CostOptions]] = [
        (p.value, cluster, CostOptions(recompute=p)) for p in Recompute
    ]
    builds += [
        (f"{p.value} share 0", cluster, CostOptions(recompute=p, recompute_share=0.0))
        for p in (Recompute.SELECTIVE, Recompute.FULL)
    ]
    builds.append(("contiguous", cluster, CostOptions(recompute=Recompute.SELECTIVE, cp_layout="contiguous")))
    for axis in reversed(range(len(cluster.mesh_shape))):
        for p in Recompute:
            options = CostOptions(recompute=p, cp_layout="contiguous")
            builds.append((f"zigzag {axis} {p.value}", zigzag_cluster(cluster, axis), options))
    out = {label: digest(build_problem(captured, c, o, memory_limit=limit).problem) for label, c, o in builds}
    out["all"] = hashlib.sha256(repr(sorted(out.items())).encode()).hexdigest()[:16]
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="*", default=["tiny", "8", "70"], choices=["tiny", "8", "70"])
    args = parser.parse_args(argv)
    for case in args.cases:
        r = run_isolated("benchmarks.build_hashes:hashes_case", {"which": case}, timeout=900)
        for label, value in r.items():
            print(f"{case} {label}: {value}", flush=True)


if __name__ == "__main__":
    main()
