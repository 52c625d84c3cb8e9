"""The ``autoshard`` command: a thin shell over the Python API.

    autoshard search --profile a100x8.json [--model gpt2] [--nodes 2] [--mesh 2x8] [--batch 8] [--seq 1024]
                     [--annotate fc1=column ...] [--memory-limit 40] [--out plan.json] [--json]
    autoshard show plan.json

Errors print one line on stderr and exit with code 2; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from autoshard.errors import AutoshardError

__all__ = ["main"]

DEFAULT_MODEL = "gpt2"


def _mesh(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(p) for p in text.lower().replace(",", "x").split("x") if p)
    except ValueError:
        raise argparse.ArgumentTypeError(f"mesh {text!r}: write axis sizes like 2x8 or 64") from None
    if not sizes or any(s < 1 for s in sizes):
        raise argparse.ArgumentTypeError(f"mesh {text!r}: axis sizes must be positive integers, e.g. 2x8")
    return sizes


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def _annotation(text: str) -> tuple[str, str]:
    target, sep, choice = text.partition("=")
    if not sep or not target or not choice:
        raise argparse.ArgumentTypeError(f"annotation {text!r}: write TARGET=CHOICE, e.g. fc1=column")
    return target, choice


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="autoshard", description="Auto-parallel planner for PyTorch models.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("search", help="plan a model on a cluster and print the report")
    s.add_argument("--profile", required=True, help="bundled profile name (a100x8, h100x8, ...) or a JSON path")
    s.add_argument("--model", default=DEFAULT_MODEL, help="zoo name or path/to/file.py:function")
    s.add_argument("--nodes", type=_positive, default=1, help="number of nodes (default 1)")
    s.add_argument("--mesh", type=_mesh, default=None, help="mesh axis sizes, e.g. 2x8 (default: one axis)")
    s.add_argument("--batch", type=_positive, default=None, help="global batch size of the example input")
    s.add_argument("--seq", type=_positive, default=None, help="sequence length of the example input")
    s.add_argument("--annotate", type=_annotation, action="append", default=[], metavar="TARGET=CHOICE")
    s.add_argument("--memory-limit", type=float, default=None, metavar="GiB", help="per-device budget in GiB")
    s.add_argument("--inference", action="store_true", help="plan the forward pass only")
    s.add_argument("--time-limit", type=float, default=60.0, help="solver time limit in seconds")
    s.add_argument("--out", default=None, help="save the plan as JSON")
    s.add_argument("--json", action="store_true", help="print the plan as JSON instead of the report")
    show = sub.add_parser("show", help="print the report of a saved plan")
    show.add_argument("plan", help="a plan saved with search --out")
    return parser


def _search(args: argparse.Namespace) -> int:
    import autoshard

    t0 = time.perf_counter()
    _progress(f"loading cluster {args.profile}")
    cluster = autoshard.load_cluster(args.profile, nodes=args.nodes, mesh=args.mesh)
    _progress(f"building {args.model}")
    case = _model_case(args)
    _progress("capturing, pricing strategies and solving")
    limit = args.memory_limit * 2**30 if args.memory_limit is not None else None
    plan = autoshard.plan(
        case.model,
        cluster,
        case.args,
        case.kwargs,
        annotations=dict(args.annotate) or None,
        training=not args.inference,
        memory_limit=limit,
        time_limit=args.time_limit,
    )
    if args.out:
        plan.save(args.out)
    if args.json:
        print(json.dumps(plan.to_json(), indent=1))
    else:
        print(plan.summary())
        print(f"\nplanned in {time.perf_counter() - t0:.1f} s" + (f"; saved to {args.out}" if args.out else ""))
    return 0


def _model_case(args: argparse.Namespace) -> Any:
    from autoshard import zoo

    path, sep, _ = args.model.rpartition(":")
    if sep and path.endswith(".py"):
        if args.batch is not None or args.seq is not None:
            raise UsageError(f"--batch/--seq apply to zoo models; {args.model} builds its own inputs")
        return zoo.load_spec(args.model)
    return zoo.build(args.model, batch=args.batch, seq=args.seq)


class UsageError(AutoshardError, ValueError):
    """A command-line option that does not fit the others."""


def _show(args: argparse.Namespace) -> int:
    from autoshard.plans import load_plan

    print(load_plan(args.plan).summary())
    return 0


def _progress(message: str) -> None:
    if sys.stderr.isatty():
        print(f"… {message}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    handlers: dict[str, Any] = {"search": _search, "show": _show}
    try:
        return int(handlers[args.command](args))
    except AutoshardError as e:
        if args.debug:
            raise
        print(f"autoshard: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("autoshard: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
