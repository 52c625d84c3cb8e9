"""``autoshard diff A.json B.json``: two plans side by side, the terms that differ first."""

from __future__ import annotations

import argparse

__all__ = ["HELP", "add_arguments", "run"]

HELP = "compare two saved plans: step time, memory, collectives, placements"


def add_arguments(d: argparse.ArgumentParser) -> None:
    d.add_argument("a", metavar="A.json", help="a plan saved with search --out")
    d.add_argument("b", metavar="B.json", help="another plan (of the same model, typically)")
    d.add_argument("--limit", type=int, default=20, help="placements / strategies listed per section")


def run(args: argparse.Namespace) -> int:
    from autoshard.plans import load_plan
    from autoshard.report.diff import render

    print(render(load_plan(args.a), load_plan(args.b), args.a, args.b, limit=args.limit))
    return 0
