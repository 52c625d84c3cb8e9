"""``autoshard explain PLAN.json [--node NAME] [--model SPEC]``: why each strategy, and not the runner-up."""

from __future__ import annotations

import argparse

__all__ = ["HELP", "add_arguments", "run"]

HELP = "why the plan chose each strategy and not the runner-up"


def add_arguments(e: argparse.ArgumentParser) -> None:
    e.add_argument("plan", help="a plan saved with search --out")
    e.add_argument(
        "--node",
        default=None,
        help="a graph node, module path or glob (default: the 10 costliest graph nodes)",
    )
    e.add_argument("--model", default=None, help="the model the plan was made for (default: the plan's)")


def run(args: argparse.Namespace) -> int:
    from autoshard.plan_model import check_spec
    from autoshard.plans import load_plan
    from autoshard.report.explain import explain, rebuild, render, render_summary
    from autoshard.report.figures import recipe_text
    from autoshard.report.proof import proof_line

    plan = load_plan(args.plan)
    check_spec(plan, args.model, args.plan)  # before the model is built and captured
    found = explain(plan, rebuild(plan, args.model), args.node)
    if args.node is None:
        print(render_summary(found))
    else:
        print("\n\n".join(render(e) for e in found))
    print(f"priced for: {recipe_text(plan.precision, plan.training)}")  # Plan.precision, as rebuilt
    print("proven: " + proof_line(plan))  # the same claim as the report's
    return 0
