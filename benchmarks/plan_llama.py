"""The two headline planning cases against ARCHITECTURE.md's targets, each in a fresh process.

    python -m benchmarks.plan_llama            # both cases
    python -m benchmarks.plan_llama --case 8b  # one case

LLaMA-3-8B on 8 x 8 A100s (global batch 64 x 4096): target <= 5 s; LLaMA-3-70B on 128 x 8 (1024 x 4096):
target <= 10 s; both under 1.5 GiB and provably optimal.  The same case function as the suite's search-scaling
table (:func:`benchmarks.scaling.plan_case`); ``python -m benchmarks --only scaling`` runs the whole matrix.
"""

from __future__ import annotations

import argparse
import json

from benchmarks.isolate import run_isolated

CASES = {
    # name: (zoo model, mesh, global batch, seq, target seconds)
    "8b": ("llama3-8b", (8, 8), 64, 4096, 5.0),
    "70b": ("llama3-70b", (128, 8), 1024, 4096, 10.0),
}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--case", choices=sorted(CASES), action="append")
    args = parser.parse_args()
    for name in args.case or list(CASES):
        model, mesh, batch, seq, target = CASES[name]
        r = run_isolated(
            "benchmarks.scaling:plan_case", {"model": model, "mesh": list(mesh), "batch": batch, "seq": seq}
        )
        if "error" in r:
            print(f"{name}: FAILED: {r['error']}")
            continue
        met = r["total_s"] <= target and r["peak_rss_gib"] <= 1.5 and r["optimal"]
        r["target"] = f"<= {target:.0f} s, <= 1.5 GiB, optimal: {'met' if met else 'MISSED'}"
        print(json.dumps({"case": name, "model": model, "mesh": list(mesh), **r}, indent=1))


if __name__ == "__main__":
    main()
