"""``autoshard verify``: check a plan numerically on gloo processes against the single-device model.

``--plan PLAN.json`` checks the plan you will deploy: its strategies mapped onto a scaled-down copy of its
model on a mesh whose axes are at most 2 wide (a ring's at most 4: ``runtime.mapping.shrink_mesh``).
``--model SPEC`` alone plans the model at its real size on ``--profile`` (``--nodes`` whole nodes, or
``--nproc`` devices) and checks that plan, mapped onto a scaled-down copy when it spans more than 8 devices
or the model is too big for real weights.  A model of your own built on meta is rebuilt small from its
Hugging Face config (``runtime.scaled.scale_hf``); a plain ``nn.Module`` on meta is refused: return a small
copy with real weights from the function.  A check in which no collective ran and nothing was split proves
nothing: it exits 1 unless ``--allow-replicated``.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys

from autoshard.cli.args import CliError, annotation, mesh, pin_map, positive

__all__ = ["HELP", "VERIFY_MODULE", "add_arguments", "run"]

HELP = "run a plan on gloo processes, compare with one device"
VERIFY_MODULE = "autoshard.runtime.verify"


def add_arguments(v: argparse.ArgumentParser) -> None:
    v.add_argument("--plan", default=None, metavar="PLAN.json", help="the saved plan to check (search --out)")
    v.add_argument("--model", default=None, help="zoo name or path/to/file.py:function (default: the plan's)")
    v.add_argument("--nproc", type=positive, default=None, help="gloo processes for --model (default 4)")
    v.add_argument("--nodes", type=positive, default=None, help="plan --model on whole nodes of --profile")
    v.add_argument("--mesh", type=mesh, default=None, help="mesh axis sizes, e.g. 2x2 (default: one axis)")
    v.add_argument("--profile", default="cpu", help="hardware profile to plan with (default cpu)")
    v.add_argument("--annotate", type=annotation, action="append", default=[], metavar="TARGET=CHOICE")
    v.add_argument("--float64", action="store_true", help="compare in float64 (tight tolerances)")
    v.add_argument(
        "--allow-replicated", action="store_true", help="accept a check in which nothing distributed ran"
    )
    v.add_argument(
        "--seed", type=int, default=0, help="seed of the random inputs and output gradients (default 0)"
    )


def run(args: argparse.Namespace) -> int:
    """Delegate to ``autoshard.runtime.verify.run_verify`` when this build has it (imported only here)."""
    _check_options(args)
    plan = None
    if args.plan is not None:  # a --model the plan was not made for: refused before torch is imported
        from autoshard.plan_model import check_identity, check_spec
        from autoshard.plans import load_plan

        plan = load_plan(args.plan)
        check_spec(plan, args.model, args.plan)
        # a plan saved from Python: its model built on meta and compared
        note = check_identity(plan, args.model, args.plan)
        if note:
            print(note, file=sys.stderr)
    try:
        found = importlib.util.find_spec(VERIFY_MODULE) is not None
    except ModuleNotFoundError:
        found = False
    if not found:
        raise CliError(
            f"verify is not available in this build ({VERIFY_MODULE} is missing); plan with `autoshard search`"
        )
    run = getattr(importlib.import_module(VERIFY_MODULE), "run_verify", None)
    if not callable(run):
        raise CliError(f"verify is not available in this build ({VERIFY_MODULE} has no run_verify())")
    options = {"annotations": pin_map(args.annotate), "float64": args.float64}
    if args.seed:
        options["seed"] = args.seed
    if plan is not None:
        options["plan"] = plan
    if args.allow_replicated:
        options["allow_replicated"] = True
    if args.nodes is not None:
        options["nodes"] = args.nodes
    report = run(args.model, args.nproc, args.mesh, args.profile, **options)
    print(report)
    return 0 if getattr(report, "ok", False) else 1


def _check_options(args: argparse.Namespace) -> None:
    """Options that cannot work together, refused before any file is read."""
    if args.mesh == "auto":
        raise CliError("verify checks one plan on one mesh: give --mesh sizes, e.g. 2x2 (auto is for search)")
    if args.plan is None and args.model is None:
        raise CliError("verify needs --plan PLAN.json (the plan you will deploy) or --model SPEC")
    if args.plan is not None and (args.nproc or args.nodes or args.mesh or args.annotate):
        raise CliError(
            "--nproc, --nodes, --mesh and --annotate apply to --model without --plan: the plan fixes them"
        )
    if args.nodes is not None and args.nproc is not None:
        raise CliError("--nodes and --nproc both size the cluster: give one")
