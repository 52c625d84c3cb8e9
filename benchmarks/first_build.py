"""CPU seconds of the planner's first problem build (issue 17), split by part: the cold build that prices
every redistribution table, strategy and node figure of a capture (later builds reuse them).

Run: ``OMP_NUM_THREADS=1 python -m benchmarks.first_build [70|8|405 ...] [--repeat N]`` (each run in a fresh
process).  Parts (``time.process_time`` around the builder's steps; nested parts count inside their parent):
``graph`` (strategies and weighted uses), ``nodes`` (per-strategy compute and memory), ``fanout``, ``edges``
(redistribution tables of edges and fan-outs), ``extras`` (FSDP gathers, temporaries), ``shortest_paths``
(the Bellman-Ford runs inside fanout and edges), ``first_build`` (all of it).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import time
from collections.abc import Callable
from typing import Any

from benchmarks.isolate import run_isolated
from benchmarks.plan_phases import CASES

__all__ = ["first_build_case", "main"]

_PARTS = {
    "_graph_of": "graph",
    "node_arrays": "nodes",
    "fanout_arrays": "fanout",
    "edge_arrays": "edges",
    "memory_extras": "extras",
    "build_problem": "first_build",
}


class _Done(Exception):
    """Raised after the first build: the rest of the plan is not measured."""


def first_build_case(which: str) -> dict[str, Any]:
    """Plan one case in this (child) process until its first build is priced; that build's CPU seconds."""
    import autoshard.problem.build as build
    import autoshard.problem.pricing as pricing

    spent: dict[str, float] = {}

    def timed(label: str, func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            c0 = time.process_time()
            try:
                return func(*args, **kwargs)
            finally:
                spent[label] = spent.get(label, 0.0) + time.process_time() - c0

        return wrapper

    for name, label in _PARTS.items():
        setattr(build, name, timed(label, getattr(build, name)))
    pricing._bellman_ford = timed("shortest_paths", pricing._bellman_ford)
    import autoshard.planner_steps as steps  # after the patches: it binds build_problem on import

    first = steps.build

    def stop_after(*args: Any, **kwargs: Any) -> Any:
        first(*args, **kwargs)
        raise _Done

    steps.build = stop_after
    from benchmarks.plan_scale import plan_case

    with contextlib.suppress(_Done):
        plan_case(*CASES[which])
    return {k: round(v, 3) for k, v in spent.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="*", default=["70"], choices=sorted(CASES))
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args(argv)
    for case in args.cases:
        for _ in range(args.repeat):
            r = run_isolated("benchmarks.first_build:first_build_case", {"which": case}, timeout=900)
            print(f"{CASES[case][0]} {CASES[case][2]}: {r}", flush=True)


if __name__ == "__main__":
    main()
