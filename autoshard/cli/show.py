"""``autoshard show PLAN.json``: print the report of a saved plan."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

__all__ = ["HELP", "add_arguments", "run"]

HELP = "print the report of a saved plan"


def add_arguments(show: argparse.ArgumentParser) -> None:
    show.add_argument("plan", help="a plan saved with search --out (or search --json)")


def run(args: argparse.Namespace) -> int:
    from autoshard.plans import load_plan
    from autoshard.report.table import Baseline, render

    plan = load_plan(args.plan)
    baseline = Baseline.from_report(_saved_report(args.plan))
    print(render(plan, baseline=baseline))
    return 0


def _saved_report(path: str) -> dict[str, Any]:
    """The ``report`` block of a file written by ``search --json`` (absent from ``--out`` files)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    report = data.get("report") if isinstance(data, dict) else None
    return report if isinstance(report, dict) else {}
