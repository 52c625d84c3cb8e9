"""Why Mixtral-8x7B on 2 x 8 H100s computes its experts twice at batch 8, and where that stops.

    python -m benchmarks.experts_node_axis              # batches 8, 12, 16 at 4096 tokens; ~1 min CPU

The report of ``autoshard search --profile h100x8 --model mixtral-8x7b --nodes 2 --mesh 2x8`` says "experts
split on axis 1; axis 0: same tokens, experts computed 2x".  The strategy that does not duplicate them exists
(``strategies/rules/dispatch.py``: tokens split on the node axis, all-to-all expert parallelism inside the
node); this plans each batch twice, free and with that strategy pinned on every MoE layer
(``model.layers.*.mlp.experts``), and prints both steps.  The pinned plan halves the expert compute but holds
every expert on both nodes, so each layer's expert gradients (one expert per device, ~352 MB in bf16) are
all-reduced across the nodes (~7 ms per layer at 400 GB/s per node shared by 8 GPUs), longer than the
layer's backward it could hide under at 32k tokens.  More tokens per step make not duplicating pay: at batch
12 the planner splits the experts across the nodes (EP 2, gathered inside the node), at 16 it splits the
tokens across them (results/experts_node_axis.txt); a faster inter-node network would move the crossover down.
"""

from __future__ import annotations

import argparse
import time

import autoshard
from autoshard import zoo

PIN = {"model.layers.*.mlp.experts": ((16, 1), (8, 1, 1), (8, 1, 1), (16, 1), (16, 1))}
"""Tokens (hidden, routing index and weights) split 16 ways, experts 8 ways: tokens over both axes, experts
over the node-internal axis (all-to-all dispatch there)."""


def _line(batch: int, pinned: bool) -> str:
    case = zoo.build("mixtral-8x7b", batch=batch)
    cluster = autoshard.load_cluster("h100x8", nodes=2, mesh=(2, 8))
    start = time.process_time()
    plan = autoshard.plan(case.model, cluster, case.args, case.kwargs, annotations=PIN if pinned else None)
    cpu = time.process_time() - start
    step = plan.predicted_step_time
    headline = plan.summary().splitlines()[0]
    how = "tokens split on the node axis (pinned)" if pinned else "free"
    return f"batch {batch:2d} x 4096  {how:38s} step {step * 1e3:7.1f} ms  ({cpu:.1f} s CPU)  {headline}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", default="8,12,16")
    for batch in (int(b) for b in parser.parse_args().batches.split(",")):
        for pinned in (False, True):
            print(_line(batch, pinned), flush=True)


if __name__ == "__main__":
    main()
