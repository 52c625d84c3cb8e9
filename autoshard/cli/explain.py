"""``autoshard explain PLAN.json [--node NAME] [--model SPEC] [--stage K]``: why each strategy, and not the
runner-up.  A pipelined plan is explained in its stage problem (the stage sub-mesh at one microbatch's shapes,
as the pipeline search built it); ``--stage K`` keeps the graph nodes stage ``K`` runs."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from autoshard.plans import Plan
    from autoshard.problem.build import BuiltProblem

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
    e.add_argument(
        "--stage",
        type=int,
        default=None,
        metavar="K",
        help="pipelined plans: only the graph nodes stage K runs (default: every stage)",
    )


def run(args: argparse.Namespace) -> int:
    from autoshard.plan_model import check_spec
    from autoshard.plans import load_plan
    from autoshard.report.explain import explain, rebuild, render, render_summary
    from autoshard.report.figures import recipe_text
    from autoshard.report.proof import proof_line

    plan = load_plan(args.plan)
    check_spec(plan, args.model, args.plan)  # before the model is built and captured
    built = rebuild(plan, args.model)
    found = explain(plan, built, args.node, stage=args.stage)
    if plan.pipeline is not None:  # which problem the terms below come from
        print(_stage_line(plan, built))
    if args.node is None:
        print(render_summary(found))
    else:
        print("\n\n".join(render(e) for e in found))
    print(f"priced for: {recipe_text(plan.precision, plan.training)}")  # Plan.precision, as rebuilt
    print("proven: " + proof_line(plan))  # the same claim as the report's
    return 0


def _stage_line(plan: Plan, built: BuiltProblem) -> str:
    """``pipelined: PP 2 (gpipe), 2 microbatches; each stage's problem on sub-mesh (4,) at 1 x 16 ...``."""
    assert plan.pipeline is not None
    shapes = [tuple(o.shape) for i in built.infos.values() if i.kind == "user_input" for o in i.outputs if o]
    return (
        f"pipelined: PP {plan.pipeline.degree} ({plan.pipeline.schedule}), {plan.microbatches} microbatches, "
        f"{len(plan.pipeline.stages)} stages; terms are the stage problem's (sub-mesh "
        f"{built.cluster.mesh_shape}, inputs {', '.join(map(str, shapes)) or '-'} per microbatch)"
    )
