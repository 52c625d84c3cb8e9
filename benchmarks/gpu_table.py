"""Predicted against measured single-GPU training steps: ``python -m benchmarks.gpu_table``.

Joins ``results/gpu_step_predicted.json`` (``python -m benchmarks.gpu_step predict``: this branch's cost model,
the bundled ``h100x8`` profile and the ``h100_measured`` one), ``results/gpu_step_predicted_main.json`` (the
same cases priced by main's cost model before the H100 measurements) and ``results/gpu_step_measured.json``
(``benchmarks/gpu_step.py measure`` on a lent H100 80GB HBM3, 2026-11-24), prints one row per case and recipe
and writes ``results/gpu_step.csv``.  Errors are predicted / measured - 1; memory is compared with the
device's used memory (CUDA context and allocator cache included: the plan's figure holds a 1 GB reserve).
"""

from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path
from typing import Any

from benchmarks.gpu_step import CASES, PREDICTED, RECIPES, RESULTS

__all__ = ["rows"]

MAIN = RESULTS / "gpu_step_predicted_main.json"
MEASURED = RESULTS / "gpu_step_measured.json"
CSV = RESULTS / "gpu_step.csv"
HELD_OUT = ("bert-base", "qwen-0.5b")  # no constant of the step's pricing was read off these models' tables


def _pct(a: float, b: float) -> float:
    return round(100 * (a / b - 1), 1)


def rows(predicted: dict[str, Any], main: dict[str, Any], measured: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per case and recipe measured and predicted (``predicted``: profile -> case -> figures)."""
    out = []
    for recipe in RECIPES:
        suffix = "" if recipe == "bf16" else f" {recipe}"  # gpu_step.predict's keys: "profile[ recipe]"
        bundled = predicted.get("h100x8" + suffix) or predicted.get("h100x8", {})
        ours = predicted.get("h100_measured" + suffix) or predicted.get("h100_measured", {})
        for case in CASES:
            p, m = bundled.get(case.key, {}), measured.get(f"{case.key} {recipe}", {})
            if "step_ms" not in p or "step_ms" not in m:
                continue
            before, mine = main.get(case.key, {}), ours.get(case.key, {})
            out.append({
                "model": case.model, "held_out": case.model in HELD_OUT,
                "config": f"b{case.batch}x{case.seq} recompute={case.recompute}",
                "recipe": recipe, "measured_ms": round(m["step_ms"], 2),
                "predicted_ms": round(p["step_ms"], 2), "time_error_pct": _pct(p["step_ms"], m["step_ms"]),
                "main_ms": round(before.get("step_ms", float("nan")), 2),
                "main_error_pct": _pct(before.get("step_ms", float("nan")), m["step_ms"]),
                "measured_profile_ms": round(mine.get("step_ms", float("nan")), 2),
                "measured_profile_error_pct": _pct(mine.get("step_ms", float("nan")), m["step_ms"]),
                "measured_gib": round(m["used_gib"], 2), "predicted_gib": round(p["memory_gib"], 2),
                "memory_error_pct": _pct(p["memory_gib"], m["used_gib"]),
                "allocated_gib": round(m["allocated_gib"], 2), "reserved_gib": round(m["reserved_gib"], 2),
            })  # fmt: skip
    return out


def _summary(table: list[dict[str, Any]], column: str, recipe: str, held_out: bool = False) -> str:
    errors = [
        abs(r[column])
        for r in table
        if r["recipe"] == recipe and (r["held_out"] or not held_out) and r[column] == r[column]  # not NaN
    ]
    return f"mean {statistics.fmean(errors):.1f}% max {max(errors):.1f}%" if errors else "none"


def main() -> None:
    load = lambda path: json.loads(Path(path).read_text()) if Path(path).exists() else {}  # noqa: E731
    table = rows(load(PREDICTED), load(MAIN), load(MEASURED))
    if not table:
        raise SystemExit(f"no case is in both {PREDICTED} and {MEASURED}")
    with CSV.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(table[0]))
        writer.writeheader()
        writer.writerows(table)
    head = ("model", "held out", "config", "recipe", "meas ms", "pred ms", "err", "main ms", "err",
            "h100_measured ms", "err", "meas GiB", "pred GiB", "err", "alloc", "resv")  # fmt: skip
    print(" | ".join(head))
    for r in table:
        print(" | ".join(str(v) for v in r.values()))
    for recipe in RECIPES:
        print(
            f"{recipe}: step |error| {_summary(table, 'time_error_pct', recipe)} (main's cost model "
            f"{_summary(table, 'main_error_pct', recipe)}; h100_measured profile "
            f"{_summary(table, 'measured_profile_error_pct', recipe)}); memory |error| "
            f"{_summary(table, 'memory_error_pct', recipe)}; held out {HELD_OUT}: step |error| "
            f"{_summary(table, 'time_error_pct', recipe, True)}"
        )
    print(f"wrote {CSV}")


if __name__ == "__main__":
    main()
