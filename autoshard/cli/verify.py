"""``autoshard verify``: run a plan on N gloo processes and compare with the single-device model."""

from __future__ import annotations

import argparse
import importlib
import importlib.util

from autoshard.cli.args import CliError, annotation, mesh, positive

__all__ = ["HELP", "VERIFY_MODULE", "add_arguments", "run"]

HELP = "run a plan on N gloo processes, compare outputs"
VERIFY_MODULE = "autoshard.runtime.verify"


def add_arguments(v: argparse.ArgumentParser) -> None:
    v.add_argument("--model", required=True, help="zoo name (a tiny one) or path/to/file.py:function")
    v.add_argument("--nproc", type=positive, required=True, help="number of gloo processes")
    v.add_argument("--mesh", type=mesh, default=None, help="mesh axis sizes, e.g. 2x2 (default: one axis)")
    v.add_argument("--profile", default="cpu", help="hardware profile to plan with (default cpu)")
    v.add_argument("--annotate", type=annotation, action="append", default=[], metavar="TARGET=CHOICE")
    v.add_argument("--float64", action="store_true", help="compare in float64 (tight tolerances)")


def run(args: argparse.Namespace) -> int:
    """Delegate to ``autoshard.runtime.verify.run_verify`` when this build has it (imported only here)."""
    try:
        found = importlib.util.find_spec(VERIFY_MODULE) is not None
    except ModuleNotFoundError:
        found = False
    if not found:
        raise CliError(
            f"verify is not available in this build ({VERIFY_MODULE} is missing); plan with `autoshard search`"
        )
    if args.mesh == "auto":
        raise CliError("verify checks one plan on one mesh: give --mesh sizes, e.g. 2x2 (auto is for search)")
    run = getattr(importlib.import_module(VERIFY_MODULE), "run_verify", None)
    if not callable(run):
        raise CliError(f"verify is not available in this build ({VERIFY_MODULE} has no run_verify())")
    report = run(
        args.model,
        args.nproc,
        args.mesh,
        args.profile,
        annotations=dict(args.annotate) or None,
        float64=args.float64,
    )
    print(report)
    return 0 if getattr(report, "ok", False) else 1
