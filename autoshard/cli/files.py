"""``autoshard search``'s output files: checked before planning (directories, graphviz), written after."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from autoshard.cli.args import CliError

if TYPE_CHECKING:
    from autoshard.plans import Plan

__all__ = ["check_outputs", "write_outputs"]


def check_outputs(args: argparse.Namespace) -> None:
    """Fail before planning, not after: output directories exist, graphviz is there for --svg."""
    for option in ("out", "dot", "svg"):
        path = getattr(args, option)
        if path is not None and not Path(path).resolve().parent.is_dir():
            raise CliError(
                f"--{option} {path}: directory {Path(path).parent} does not exist; create it first"
            )
    if args.svg is not None:
        from autoshard.report.dot import graphviz_binary

        if graphviz_binary() is None:
            raise CliError(
                f"--svg {args.svg}: graphviz's `dot` is not installed (apt install graphviz / brew install "
                "graphviz); use --dot plan.dot to write the graph as DOT instead"
            )


def write_outputs(plan: Plan, args: argparse.Namespace) -> None:
    """--out (the plan's JSON), --dot (DOT text, whatever the suffix) and --svg (rendered by graphviz)."""
    from autoshard.report import dot

    if args.out:
        _write_text(args.out, plan.save)
    if args.dot or args.svg:
        text = dot.to_dot(plan)
        if args.dot:
            _write_text(args.dot, lambda path: Path(path).write_text(text))
        if args.svg:
            dot.render_dot(text, Path(args.svg), "svg")


def _write_text(path: str, write: Callable[[str], object]) -> None:
    try:
        write(path)
    except OSError as e:
        raise CliError(f"cannot write {path}: {e.strerror}; check the path and its permissions") from e
