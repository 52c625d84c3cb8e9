"""``python -m benchmarks [--quick] [--only SECTION ...] [--out DIR]``: run the suite, write CSV + SUMMARY.md.

Sections run in the numbered order of the summary, each timed; a section that raises is reported in the
summary as FAILED with its error and the run goes on, so one broken stage never costs the other results.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.report import Table, machine, write_results

#: Wall time of the last full run on the 2-core dev VM (shared with other jobs), for --quick's summary.
FULL_RUN_MINUTES = (
    "about 20 minutes (19.7 measured on 2026-11-23 on the shared 2-core AMD EPYC dev VM); planning LLaMA "
    "on 3-D meshes is ~60% of it"
)

SECTIONS: tuple[tuple[str, str, str], ...] = (
    # key, title, module (its run(quick, log) returns tables)
    ("scaling", "1. Search scaling", "benchmarks.scaling"),
    ("optimality", "2. Optimality", "benchmarks.optimality"),
    ("quality", "3. Plan quality against hand plans", "benchmarks.quality"),
    ("fidelity", "4. Fidelity of the cost model", "benchmarks.fidelity"),
    ("runtime", "5-6. Runtime: against DTensor, against eager on one device", "benchmarks.runtime"),
)
RESULTS = Path(__file__).resolve().parent / "results"


def _run_section(module: str, quick: bool, log: Callable[[str], None]) -> list[Table]:
    run: Callable[..., list[Table]] = importlib.import_module(module).run
    return run(quick, log)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="the subset that runs in under 3 minutes")
    parser.add_argument("--only", action="append", choices=[k for k, _, _ in SECTIONS], help="run only these")
    parser.add_argument(
        "--out", type=Path, help="results folder (default results/, or results/quick/ with --quick)"
    )
    args = parser.parse_args(argv)
    out = args.out or (RESULTS / "quick" if args.quick else RESULTS)

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    start = time.perf_counter()
    sections: list[tuple[str, list[Table]]] = []
    timing: list[str] = []
    for key, title, module in SECTIONS:
        if args.only and key not in args.only:
            continue
        log(f"{title} ...")
        t0 = time.perf_counter()
        try:
            tables = _run_section(module, args.quick, log)
        except Exception:  # a broken section must not cost the others' results
            detail = traceback.format_exc().strip().splitlines()
            tables = [
                Table(f"{key}_error", f"{title}: FAILED", ("error",), [(detail[-1],)], tuple(detail[-6:-1]))
            ]
        seconds = time.perf_counter() - t0
        timing.append(f"{title} {seconds:.0f} s")
        sections.append((title, tables))
    total = time.perf_counter() - start
    info: dict[str, Any] = machine()
    info["run"] = ("--quick" if args.quick else "full") + (
        f" (only {', '.join(args.only)})" if args.only else ""
    )
    info["duration"] = f"{total:.0f} s ({'; '.join(timing)})"
    if args.quick:
        info["full run duration"] = FULL_RUN_MINUTES
    header = [
        "Timings were taken on the machine above; on a shared machine they are noisy (other jobs compete for "
        "its cores).  Every case that reports time or memory ran in a fresh process.",
    ]
    text = write_results(out, sections, info, header)
    print(text)
    print(f"(written to {out})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
