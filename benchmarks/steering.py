"""What ``forbid=`` costs to apply: following the batch, sequence and expert dims through every strategy of
LLaMA-3-8B.

``python -m benchmarks.steering`` captures LLaMA-3-8B (batch 64 x 4096, meta) once, builds its search problem
on an 8 x 8 and a 2 x 4 x 8 mesh of A100 nodes and prints, per mesh and forbidden kinds (``dp``; ``tp``;
``dp``, ``tp`` and ``fsdp``), the strategies of the problem and the wall and CPU seconds of
:func:`autoshard.steering.kind_masks` (the dims of each role found to a fixed point over every strategy's
per-axis patterns, then one mask per node), with how many nodes it masks.  Not a timed test: figures
depend on the machine's load; CPU seconds are the steadier figure on a shared machine.
"""

from __future__ import annotations

import math
import time

import autoshard
from autoshard import zoo
from autoshard.capture import capture
from autoshard.problem.build import build_problem
from autoshard.problem.costs import CostOptions
from autoshard.steering import kind_masks

MESHES = ((8, 8), (2, 4, 8))
FORBIDDEN = (frozenset({"dp"}), frozenset({"tp"}), frozenset({"dp", "tp", "fsdp"}))


def main() -> None:
    case = zoo.build("llama3-8b")
    captured = capture(case.model, case.args, dict(case.kwargs), blocks="auto")
    print(f"{'mesh':<8}{'forbid':<12}{'strategies':>11}{'masked nodes':>14}{'wall s':>9}{'CPU s':>8}")
    for mesh in MESHES:
        cluster = autoshard.load_cluster("a100x8", nodes=math.prod(mesh) // 8, mesh=mesh)
        built = build_problem(captured, cluster, CostOptions())
        count = sum(len(s) for s in built.strategies.values())
        for kinds in FORBIDDEN:
            wall, cpu = time.perf_counter(), time.process_time()
            masks = kind_masks(kinds, built.infos, built.strategies, built.template)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            name = ",".join(sorted(kinds))
            print(
                f"{'x'.join(map(str, mesh)):<8}{name:<12}{count:>11}{len(masks):>14}{wall:>9.3f}{cpu:>8.3f}"
            )


if __name__ == "__main__":
    main()
