"""``autoshard dot PLAN.json [-o plan.svg] [--ops]``: the plan as a graph."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from autoshard.cli.args import CliError

if TYPE_CHECKING:
    from autoshard.report.dot import Level

__all__ = ["HELP", "add_arguments", "run"]

HELP = "write the graph of a saved plan (DOT, SVG, PNG, PDF)"


def add_arguments(dot: argparse.ArgumentParser) -> None:
    dot.add_argument("plan", help="a plan saved with search --out")
    dot.add_argument(
        "-o", "--output", default=None, help="file.dot, .svg, .png or .pdf (default: DOT on stdout)"
    )
    dot.add_argument("--ops", action="store_true", help="one box per operator instead of per module")


def run(args: argparse.Namespace) -> int:
    from autoshard.plans import load_plan
    from autoshard.report import dot

    plan = load_plan(args.plan)
    level: Level = "op" if args.ops else "module"
    if args.output is None:
        print(dot.to_dot(plan, level), end="")
        return 0
    suffix = Path(args.output).suffix.lower()
    if suffix not in (".dot", ".gv", *dot.RENDERED):
        known = ", ".join((".dot", ".gv", *dot.RENDERED))
        raise CliError(f"-o {args.output}: unknown format {suffix or '(no suffix)'}; name the file {known}")
    if not Path(args.output).resolve().parent.is_dir():
        raise CliError(
            f"-o {args.output}: directory {Path(args.output).parent} does not exist; create it first"
        )
    print(f"wrote {dot.write(plan, args.output, level)}")
    return 0
