"""``python -m benchmarks [--quick] [--only SECTION ...] [--out DIR | --write]``: run the suite, write CSV +
SUMMARY.md.

Sections run in the numbered order of the summary, each timed; a section that raises is reported in the
summary as FAILED with its error and the run goes on, so one broken stage never costs the other results.

Where the files go: ``out/benchmarks/`` (``out/benchmarks/quick/`` with ``--quick``; ``out/`` is ignored by git)
unless ``--out DIR`` says otherwise.  The committed results in ``benchmarks/results/`` change only when a full
run is asked to record itself there (``--write``); a ``--quick`` run never writes them.
"""

from __future__ import annotations

import importlib
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autoshard.cli.args import OneLineParser
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
SCRATCH = RESULTS.parents[1] / "out" / "benchmarks"  # the repository's out/, ignored by git


def _run_section(module: str, quick: bool, log: Callable[[str], None]) -> list[Table]:
    run: Callable[..., list[Table]] = importlib.import_module(module).run
    return run(quick, log)


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m benchmarks", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="the subset that runs in under 3 minutes")
    parser.add_argument("--only", action="append", choices=[k for k, _, _ in SECTIONS], help="run only these")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--out", type=Path, help="results folder (default out/benchmarks/, quick/ under it)")
    where.add_argument("--write", action="store_true", help="a full run: record it in benchmarks/results/")
    args = parser.parse_args(argv)
    if args.write and args.quick:
        parser.error("--write records a full run in benchmarks/results/; a --quick run writes to "
                     "out/benchmarks/quick/ (or --out DIR)")  # fmt: skip
    out = args.out or (RESULTS if args.write else SCRATCH / "quick" if args.quick else SCRATCH)

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
