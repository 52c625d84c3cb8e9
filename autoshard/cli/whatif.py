"""``autoshard whatif PLAN.json --against OTHER.json --vary batch=1..1024``: where another plan wins.

Reads saved plans, turns each into its step time as a sympy expression (:mod:`autoshard.whatif`) and
prints, for every varied symbol (batch, seq, devices, bandwidth), where each plan cannot run (a batch below
its batch split, memory over its budget: the rules ``search`` plans under), the values where one of the
other plans becomes faster, naming both, or, for a plan that never crosses the first in the range, which of
the two is faster where both run and by how much.  Nothing is re-planned: each plan keeps its strategies
and the precision recipe it was priced for (named beside each plan when one is not bf16).

``autoshard whatif PP.json --set inter_bandwidth=2 --set memory=40``: a pipelined plan re-priced on a changed
cluster, its stage cut, schedule, microbatches and strategies kept (:mod:`autoshard.whatif_pipeline`).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import TYPE_CHECKING

from autoshard.cli.args import CliError

if TYPE_CHECKING:
    from autoshard.whatif import PlanCost

__all__ = ["HELP", "add_arguments", "run", "setting", "vary"]

HELP = (
    "print where another saved plan becomes faster as batch, seq, devices or bandwidth vary, or re-price a "
    "pipelined plan on faster links or less memory (--set)"
)


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


def setting(text: str) -> tuple[str, float]:
    """``inter_bandwidth=2`` -> ``("inter_bandwidth", 2.0)``."""
    name, _, value = text.partition("=")
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--set {text!r}: write NAME=VALUE, e.g. inter_bandwidth=2 or memory=40"
        ) from None
    return name, number


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("plan", help="a plan saved with search --out")
    parser.add_argument(
        "--against", nargs="+", default=None, metavar="PLAN.json", help="the other plans to compare with"
    )
    parser.add_argument(
        "--vary",
        type=vary,
        action="append",
        default=None,
        metavar="NAME=LOW..HIGH",
        help="batch, seq, devices (plans on one mesh axis) or bandwidth (x the profile's); repeatable",
    )
    parser.add_argument("--show", action="store_true", help="print each plan's step-time expression")
    parser.add_argument(
        "--set",
        type=setting,
        action="append",
        default=None,
        metavar="NAME=VALUE",
        help="pipelined plans: re-price on bandwidth, inter_bandwidth or intra_bandwidth (x the profile's) or "
        "memory (GiB per device); repeatable",
    )
    parser.add_argument(
        "--model", default=None, help="with --set: the model the plan was made for (default: the plan's)"
    )


def run(args: argparse.Namespace) -> int:
    from autoshard.plans import load_plan

    if args.set:
        return _run_set(args)
    if not args.against or not args.vary:
        raise CliError(
            "whatif needs --against OTHER.json and --vary NAME=LOW..HIGH (or, for a pipelined plan, "
            "--set NAME=VALUE)"
        )
    from autoshard.whatif import check_same_model, check_varies, common, crossovers, lead, plan_cost

    paths = [args.plan, *args.against]
    names = _names(paths)
    plans = [load_plan(p) for p in paths]
    check_same_model(plans, names)
    costs = [plan_cost(plan, n) for plan, n in zip(plans, names, strict=True)]
    base, others = costs[0], costs[1:]
    for cost in costs:  # refuse before printing anything
        for name, _, _ in args.vary:
            check_varies(cost, name)
    recipes = {plan.precision for plan in plans}  # each plan keeps the recipe it was priced for
    for cost, plan in zip(costs, plans, strict=True):
        point = ", ".join(f"{k}={v:g}" for k, v in cost.reference.items())
        said = f" ({plan.precision} recipe)" if recipes != {"bf16"} else ""  # Plan.precision
        print(f"{cost.name}: {cost.at() * 1e3:.4g} ms at {point}{said}")
        if args.show:
            print(f"  = {cost.expr}")
    for name, lo, hi in args.vary:
        found = crossovers(base, others, name, lo, hi)
        print(f"{name} in {lo:g}..{hi:g}:")
        for cost in costs:  # where a plan cannot run, as search would refuse to plan it there
            for line in _cannot_run(cost, name, lo, hi):
                print(f"  {line}")
        for c in found:
            print(f"  {c}")
        crossed = {c.below for c in found} | {c.above for c in found}
        for other in others:  # a pair that never crosses here: who leads where both run, and by how much
            if other.name in crossed:
                continue
            both = [(a, b) for a, b in common(base.spans(name, lo, hi), other.spans(name, lo, hi)) if a < b]
            for a, b in both:
                print(f"  {lead(base, other, name, a, b)}")
            if not both:
                print(f"  {base.name} and {other.name} never both run in {name} {lo:g}..{hi:g}")
    return 0


def _run_set(args: argparse.Namespace) -> int:
    """``--set``: one pipelined plan re-priced under the settings (:mod:`autoshard.whatif_pipeline`)."""
    from autoshard.plan_model import check_spec
    from autoshard.plans import load_plan
    from autoshard.whatif_pipeline import check_setting, pipeline_whatif, render

    if args.against or args.vary:
        raise CliError("--set re-prices one pipelined plan: drop --against and --vary (or drop --set)")
    _names([args.plan])
    settings = dict(args.set)
    for name, value in settings.items():
        check_setting(name, value)  # before the rebuild: a refused setting costs nothing
    plan = load_plan(args.plan)
    check_spec(plan, args.model, args.plan)  # before the model is built and captured
    if plan.pipeline is None:
        raise CliError(
            f"--set re-prices a pipelined plan; {args.plan} has no stages: compare it with --against OTHER.json "
            "--vary NAME=LOW..HIGH (bandwidth scales its links)"
        )
    print(render(pipeline_whatif(plan, settings, args.model)))
    return 0


def _cannot_run(cost: PlanCost, name: str, lo: float, hi: float) -> list[str]:
    """``dp cannot run at batch 1..7 (at batch 1: batch 1 < DP 8)``: one line per gap in the plan's spans,
    the reason read at the gap's end that is an end of the range (else its middle).  Integer symbols
    (batch, seq, devices) print the integers the gap holds: it ends before the first value that runs."""
    spans, out, start = cost.spans(name, lo, hi), [], lo
    for a, b in [*cost.spans(name, lo, hi), (hi, hi)]:
        if a > start:
            first, last = _gap_ends(name, start, a, lo, hi)
            if first <= last:
                point = first if start == lo else last if a == hi else _middle(name, first, last)
                why = cost.why_not(**{name: point})
                out.append(
                    f"{cost.name} cannot run at {name} {first:g}..{last:g} (at {name} {point:g}: {why})"
                )
        start = b
    return out if spans or not out else [out[0].replace("cannot run at", "cannot run anywhere in", 1)]


_TOLERANCE = 1e-9  # a span end within this of an integer is that integer (sympy's roots come back as floats)


def _gap_ends(name: str, start: float, end: float, lo: float, hi: float) -> tuple[float, float]:
    """The gap between spans ``start..end`` as printed: its whole values for an integer symbol (a span's
    ends run, so an inner end that is an integer is left out of the gap), else the ends as they are."""
    from autoshard.whatif import INTEGER_SYMBOLS  # sympy: imported when run, not at CLI start

    if name not in INTEGER_SYMBOLS:
        return start, end
    first = math.ceil(start - _TOLERANCE) if start == lo else math.floor(start + _TOLERANCE) + 1
    last = math.floor(end + _TOLERANCE) if end == hi else math.ceil(end - _TOLERANCE) - 1
    return float(max(first, math.ceil(lo - _TOLERANCE))), float(min(last, math.floor(hi + _TOLERANCE)))


def _middle(name: str, first: float, last: float) -> float:
    from autoshard.whatif import INTEGER_SYMBOLS

    return float((first + last) // 2) if name in INTEGER_SYMBOLS else (first + last) / 2


def _names(paths: list[str]) -> list[str]:
    """File stems, or whole paths where two stems collide."""
    for p in paths:
        if not Path(p).is_file():
            raise CliError(f"plan file {p} does not exist; save one with autoshard search --out {p}")
    stems = [Path(p).stem for p in paths]
    return stems if len(set(stems)) == len(stems) else list(paths)
