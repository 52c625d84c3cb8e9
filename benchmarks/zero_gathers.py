"""ZeRO-1's optimizer all-gathers in the objective: which GPT-2 plan wins once they are priced.

    OMP_NUM_THREADS=1 python -m benchmarks.zero_gathers

GPT-2 (124M, fp32, on meta) on one H100 node cut to 2 and 4 devices, at the zoo's batch 8 x 1024 and at a
small batch 1 x 64 (where splitting the batch buys little and a replicated or tensor-parallel plan competes).
Per case: the plan's headline, its objective and predicted step, ZeRO-1's gathers that no gradient all-reduce
pays (``Plan.optimizer_gathers``: count and seconds) and whether the step pays them
(``Plan.optimizer_gathers_priced``; an autoshard before problem/zero_terms.py lists them outside the step:
run this script on such a checkout to compare), and the planning time (CPU seconds).
"""

from __future__ import annotations

import time

import autoshard
from autoshard import zoo
from autoshard.pipeline.summary import headline
from autoshard.runtime.verify import cluster_for


def main() -> None:
    for batch, seq in ((8, 1024), (1, 64)):
        built = zoo.build("gpt2", batch=batch, seq=seq, device="meta")
        for devices in (2, 4):
            cluster = cluster_for("h100x8", devices)
            t0 = time.process_time()
            plan = autoshard.plan(built.model, cluster, built.args, built.kwargs)
            cpu = time.process_time() - t0
            gathers = plan.optimizer_gathers
            paid = sum(c.seconds for c in gathers)
            priced = getattr(plan, "optimizer_gathers_priced", False)
            print(
                f"gpt2 {batch}x{seq} on {devices}: {headline(plan)}\n"
                f"    objective {plan.solver.objective * 1e3:.4f} ms  step {plan.predicted_step_time * 1e3:.4f} ms  "
                f"optimizer gathers {len(gathers)} ({paid * 1e3:.4f} ms, {'in' if priced else 'NOT in'} the step)  "
                f"plan {cpu:.1f} s CPU",
                flush=True,
            )


if __name__ == "__main__":
    main()
