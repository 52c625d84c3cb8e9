"""Memory and loss of a shard-only training run: ``python -m benchmarks.train_memory [--preset llama-1b]``.

What it does, with ``examples/train.py`` (README, "From a plan to a training run"): writes the preset's init as
safetensors, plans it on the meta device for 4 ranks twice -- Megatron TP x DP on a 2 x 2 mesh (ZeRO-1) and
FSDP over 4 (ZeRO-3, gathered weights freed after use) -- trains ``--steps`` AdamW steps under ``torchrun``
on gloo for each, and prints, per plan and rank: peak RSS, RSS before building the model (imports), the
parameters and optimizer state the rank holds, and the losses; with ``--reference`` also the single-process
run (at 1B it needs ~16 GiB: off by default, the two plans are then checked against each other).
Results go to ``benchmarks/results/train_memory_<preset>.json``.  Every process runs with
``MALLOC_MMAP_THRESHOLD_=65536`` (see ``_run``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRAIN = REPO / "examples" / "train.py"
PLANS = {"tp-dp": ("tp-dp", "2x2", "1"), "fsdp": ("fsdp", "", "3")}  # 2 x 2 mesh with ZeRO-1; 4 ranks, ZeRO-3


def _run(argv: list[str]) -> str:
    # glibc's default dynamic mmap threshold lets the few-MiB weights FSDP gathers and frees fragment the heap
    # (peak RSS then counts memory no tensor holds); a fixed threshold keeps RSS close to live memory
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": "65536"}
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{' '.join(argv)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return done.stdout


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="llama-1b")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--reference", action="store_true")
    parser.add_argument(
        "--plans",
        default=",".join(PLANS),
        help=f"comma-separated subset of {list(PLANS)} (at 1B in float32, "
        "TP x DP holds half the model, its gradients and half its AdamW state per rank: ~5.5 GiB x 4 ranks)",
    )
    args = parser.parse_args(argv)
    py = sys.executable
    results: dict[str, object] = {
        "preset": args.preset,
        "steps": args.steps,
        "batch": args.batch,
        "seq": args.seq,
    }
    with tempfile.TemporaryDirectory(prefix="autoshard-mem-") as tmp:
        ckpt = Path(tmp) / "ckpt"
        print(_run([py, str(TRAIN), "init", "--model", str(ckpt), "--preset", args.preset]).strip())
        shape = ["--batch", str(args.batch), "--seq", str(args.seq)]
        for label in args.plans.split(","):
            layout, mesh, zero = PLANS[label]
            plan = Path(tmp) / f"{layout}.json"
            extra = ["--mesh", mesh] if mesh else []
            extra += ["--memory-limit", "16"]  # GiB: the cpu profile's 4 GiB devices are too small at 1B
            _run([py, str(TRAIN), "plan", "--model", str(ckpt), "--nproc", "4", "--layout", layout, *extra, *shape,
                  "--out", str(plan)])  # fmt: skip
            metrics = Path(tmp) / f"{layout}-metrics.json"
            start = time.perf_counter()
            _run([py, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "4", str(TRAIN), "run",
                  "--model", str(ckpt), "--plan", str(plan), "--steps", str(args.steps), "--zero", zero,
                  "--metrics", str(metrics)])  # fmt: skip
            figures = json.loads(metrics.read_text())
            figures["wall_s"] = time.perf_counter() - start
            results[label] = figures
            _print(label, figures)
        if args.reference:
            ref = Path(tmp) / "ref.json"
            _run([py, str(TRAIN), "reference", "--model", str(ckpt), "--steps", str(args.steps), *shape,
                  "--metrics", str(ref)])  # fmt: skip
            results["single process"] = json.loads(ref.read_text())
            print(f"single process: peak RSS {results['single process']['peak_rss'] / 2**20:.0f} MiB, losses "  # type: ignore[index]
                  f"{results['single process']['losses']}")  # type: ignore[index]  # fmt: skip
    out = REPO / "benchmarks" / "results" / f"train_memory_{args.preset}.json"
    out.write_text(json.dumps(results, indent=1))
    print(f"wrote {out}")


def _print(label: str, figures: dict) -> None:
    mib = 2**20
    print(f"\n{label}: model {figures['model_bytes'] / mib:.0f} MiB of parameters; {figures['wall_s']:.0f} s")
    print(f"  losses {[f'{x:.6f}' for x in figures['losses']]}")
    print(f"  tokens/s {[f'{x:.0f}' for x in figures['tokens_per_s']]}")
    for r, rank in enumerate(figures["ranks"]):
        grown = rank["peak_rss"] - rank["start_rss"]
        print(f"  rank {r}: peak RSS {rank['peak_rss'] / mib:.0f} MiB (imports {rank['start_rss'] / mib:.0f}, "
              f"grown {grown / mib:.0f}); parameters {rank['params'] / mib:.0f} MiB, optimizer state "
              f"{rank['optimizer'] / mib:.0f} MiB")  # fmt: skip


if __name__ == "__main__":
    main()
