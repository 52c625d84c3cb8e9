"""Tables of the benchmark suite: one record per table, written as CSV and as markdown.

A section returns :class:`Table` records (plain strings and numbers, no torch); :func:`write_results` writes
``<section>.csv`` per table and one ``SUMMARY.md`` holding every table, the notes under each, and the machine
the numbers came from.  Keeping sections free of file handling means a section can be run and tested alone.

Example::

    t = Table("demo", "Demo", ("case", "seconds"), [("a", 1.25)], notes=("one note",))
    print(t.markdown())
"""

from __future__ import annotations

import csv
import datetime
import io
import os
import platform
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.machine_speed import speed

__all__ = ["Table", "fmt", "machine", "percent", "write_results"]

Cell = str | int | float | None


@dataclass(frozen=True)
class Table:
    """One result table.

    Attributes:
        name: file stem of its CSV (``results/<name>.csv``); lower case, no spaces.
        title: heading in the summary.
        columns: column headers (short: tables should fit 100 columns).
        rows: one tuple of cells per row; numbers are formatted for markdown by :func:`fmt`.
        notes: sentences printed under the table (what is compared, what could not be run and why).
    """

    name: str
    title: str
    columns: tuple[str, ...]
    rows: list[tuple[Cell, ...]] = field(default_factory=list)
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.name.replace("_", "").isalnum() or self.name.lower() != self.name:
            raise ValueError(
                f"table name {self.name!r}: use lower-case letters, digits and '_' (a file stem)"
            )
        for k, row in enumerate(self.rows):
            if len(row) != len(self.columns):
                raise ValueError(
                    f"table {self.name}: row {k} has {len(row)} cells for {len(self.columns)} columns {self.columns}"
                )

    def csv(self) -> str:
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(self.columns)
        writer.writerows(["" if c is None else c for c in row] for row in self.rows)
        return out.getvalue()

    def markdown(self) -> str:
        """Heading, pipe table with columns padded to a common width, then the notes (no table when empty)."""
        if not self.rows:
            return "\n".join([f"### {self.title}", ""] + [f"- {n}" for n in self.notes or ("(no rows)",)])
        cells = [list(self.columns)] + [[fmt(c) for c in row] for row in self.rows]
        widths = [max(len(r[i]) for r in cells) for i in range(len(self.columns))]
        numeric = [
            all(_is_number(row[i]) or row[i] is None for row in self.rows) and bool(self.rows)
            for i in range(len(self.columns))
        ]

        def line(row: Sequence[str]) -> str:
            parts = [
                c.rjust(w) if num else c.ljust(w) for c, w, num in zip(row, widths, numeric, strict=True)
            ]
            return "| " + " | ".join(parts) + " |"

        dashes = (
            "-" * (w + 1) + ":" if num else "-" * (w + 2) for w, num in zip(widths, numeric, strict=True)
        )
        lines = [f"### {self.title}", "", line(cells[0]), "|" + "|".join(dashes) + "|"]
        lines += [line(r) for r in cells[1:]]
        if self.notes:
            lines.append("")
            lines += [f"- {n}" for n in self.notes]
        return "\n".join(lines)


def _is_number(value: Cell) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def fmt(value: Cell) -> str:
    """A cell for markdown: ``-`` for missing, 3 significant digits for floats, as-is otherwise."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value == 0:
            return "0"
        if abs(value) >= 100:
            return f"{value:.0f}"
        if abs(value) >= 0.01:
            return f"{value:.3g}" if abs(value) < 10 else f"{value:.1f}"
        return f"{value:.2e}"
    return str(value)


def percent(x: float, signed: bool = False) -> str:
    """``x`` as a percentage with one decimal; no ``-0.0%``."""
    if abs(x) < 0.0005:
        return "0.0%"
    return f"{x:+.1%}" if signed else f"{x:.1%}"


def machine() -> dict[str, str]:
    """Where the numbers came from: platform, CPU model, cores, Python and torch versions, date, and the speed of
    two reference workloads (:mod:`benchmarks.machine_speed`), since the same VM kind differs 3x between sessions."""
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        cpu = platform.processor() or "unknown"
    try:
        import torch

        torch_version = str(torch.__version__)
        gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    except ImportError:
        torch_version, gpu = "not installed", "none"
    return {
        "date": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
        "platform": platform.platform(),
        "cpu": cpu,
        "cores": str(os.cpu_count()),
        "python": platform.python_version(),
        "torch": torch_version,
        "gpu": gpu,
        "speed": " ".join(f"{k}={v}" for k, v in speed().items()),
    }


def summary_markdown(
    sections: Sequence[tuple[str, Sequence[Table]]], info: dict[str, str], header: Sequence[str]
) -> str:
    """The whole summary: title, machine, any header lines, then each section's tables."""
    lines = ["# autoshard benchmark summary", ""]
    lines += [f"- {k}: {v}" for k, v in info.items()]
    if header:
        lines.append("")
        lines += list(header)
    for title, tables in sections:
        lines += ["", f"## {title}", ""]
        for t in tables:
            lines += [t.markdown(), ""]
    return "\n".join(lines).rstrip() + "\n"


def write_results(
    out_dir: Path,
    sections: Sequence[tuple[str, Sequence[Table]]],
    info: dict[str, str],
    header: Sequence[str],
) -> str:
    """Write ``<table>.csv`` for every table and ``SUMMARY.md``; return the summary text."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for _, tables in sections:
        for t in tables:
            (out_dir / f"{t.name}.csv").write_text(t.csv())
    text = summary_markdown(sections, info, header)
    (out_dir / "SUMMARY.md").write_text(text)
    return text
