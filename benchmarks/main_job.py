"""``python -m benchmarks.main_job [--runs N]``: how long README command 1 takes, and where the time goes.

Runs ``autoshard search --profile a100x8.json`` (GPT-2 on one 8 x A100 node, with its data-parallel
baseline) ``N`` times as a fresh process and prints the wall and CPU seconds of each, then times the stages
in one process: ``import torch``, building the model on the meta device (mostly importing the transformers
model class), one capture (shared by the plan and its baseline), and the two plans.  The CPU time is the
figure to compare on a shared machine: the wall time there includes waiting for other jobs' processes.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import time

COMMAND = ["-m", "autoshard.cli", "search", "--profile", "a100x8.json"]


def run_command(runs: int) -> None:
    for k in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run([sys.executable, *COMMAND], check=True, capture_output=True)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        print(f"run {k + 1}: autoshard search --profile a100x8.json  wall {wall:5.2f} s  cpu {cpu:5.2f} s")


def stages() -> None:
    t = time.process_time()
    marks: list[tuple[str, float]] = []

    def mark(name: str) -> None:
        nonlocal t
        now = time.process_time()
        marks.append((name, now - t))
        t = now

    import torch  # noqa: F401

    mark("import torch")
    import autoshard
    from autoshard import zoo
    from autoshard.capture import capture

    mark("import autoshard")
    case = zoo.build("gpt2")
    mark("build gpt2 on meta (transformers import)")
    captured = capture(case.model, case.args, dict(case.kwargs))
    mark("capture (once)")
    cluster = autoshard.load_cluster("a100x8")
    autoshard.plan(case.model, cluster, case.args, captured=captured)
    mark("plan")
    replicate = {name: ("R",) for name, _ in case.model.named_parameters()}
    autoshard.plan(
        case.model, cluster, case.args, annotations=replicate | {"input_ids": ("S(0)",)}, captured=captured
    )
    mark("data-parallel baseline (same capture)")
    for name, seconds in marks:
        print(f"  {name:<44}{seconds:6.2f} s cpu")
    print(f"  {'total':<44}{sum(s for _, s in marks):6.2f} s cpu")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else "")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    run_command(args.runs)
    print("stages, in one process:")
    stages()


if __name__ == "__main__":
    main()
