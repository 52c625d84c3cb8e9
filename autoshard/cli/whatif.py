"""``autoshard whatif PLAN.json --against OTHER.json --vary batch=1..1024``: where another plan wins.

Reads saved plans, turns each into its step time as a sympy expression (:mod:`autoshard.whatif`) and
prints, for every varied symbol (batch, seq, devices, bandwidth), the values where one of the other plans
becomes faster, naming both, or, for a plan that never crosses the first in the range, which of the two is
faster throughout and by how much.  Nothing is re-planned.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from autoshard.cli.args import CliError

__all__ = ["HELP", "add_arguments", "run", "vary"]

HELP = "print where another saved plan becomes faster as batch, seq, devices or bandwidth vary"


def vary(text: str) -> tuple[str, float, float]:
    """``batch=1..1024`` -> ``("batch", 1.0, 1024.0)``."""
    from autoshard.whatif import SYMBOLS

    name, _, span = text.partition("=")
    low, _, high = span.partition("..")
    try:
        lo, hi = float(low), float(high)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--vary {text!r}: write NAME=LOW..HIGH, e.g. batch=1..1024"
        ) from None
    if name not in SYMBOLS:
        raise argparse.ArgumentTypeError(f"--vary {text!r}: NAME is one of {', '.join(SYMBOLS)}")
    if not 0 < lo < hi:
        raise argparse.ArgumentTypeError(f"--vary {text!r}: need 0 < LOW < HIGH")
    return name, lo, hi


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("plan", help="a plan saved with search --out")
    parser.add_argument(
        "--against", nargs="+", required=True, metavar="PLAN.json", help="the other plans to compare with"
    )
    parser.add_argument(
        "--vary",
        type=vary,
        action="append",
        required=True,
        metavar="NAME=LOW..HIGH",
        help="batch, seq, devices (plans on one mesh axis) or bandwidth (x the profile's); repeatable",
    )
    parser.add_argument("--show", action="store_true", help="print each plan's step-time expression")


def run(args: argparse.Namespace) -> int:
    from autoshard.plans import load_plan
    from autoshard.whatif import check_same_model, check_varies, crossovers, lead, plan_cost

    paths = [args.plan, *args.against]
    names = _names(paths)
    plans = [load_plan(p) for p in paths]
    check_same_model(plans, names)
    costs = [plan_cost(plan, n) for plan, n in zip(plans, names, strict=True)]
    base, others = costs[0], costs[1:]
    for cost in costs:  # refuse before printing anything
        for name, _, _ in args.vary:
            check_varies(cost, name)
    for cost in costs:
        point = ", ".join(f"{k}={v:g}" for k, v in cost.reference.items())
        print(f"{cost.name}: {cost.at() * 1e3:.4g} ms at {point}")
        if args.show:
            print(f"  = {cost.expr}")
    for name, lo, hi in args.vary:
        found = crossovers(base, others, name, lo, hi)
        print(f"{name} in {lo:g}..{hi:g}:")
        for c in found:
            print(f"  {c}")
        crossed = {c.below for c in found} | {c.above for c in found}
        for other in others:  # a pair that never crosses here: who leads, and by how much
            if other.name not in crossed:
                print(f"  {lead(base, other, name, lo, hi)}")
    return 0


def _names(paths: list[str]) -> list[str]:
    """File stems, or whole paths where two stems collide."""
    for p in paths:
        if not Path(p).is_file():
            raise CliError(f"plan file {p} does not exist; save one with autoshard search --out {p}")
    stems = [Path(p).stem for p in paths]
    return stems if len(set(stems)) == len(stems) else list(paths)
