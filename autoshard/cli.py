"""The ``autoshard`` command: a thin shell over the Python API and :mod:`autoshard.report`.

    autoshard search --profile a100x8.json [--model gpt2] [--nodes 2 --mesh 2x8] [--batch 8] [--seq 1024]
                     [--annotate fc1=column ...] [--memory-limit 40] [--out plan.json] [--dot plan.dot]
                     [--svg plan.svg] [--json] [--no-baseline]
    autoshard show plan.json
    autoshard dot plan.json [-o plan.svg] [--ops]
    autoshard verify --model SPEC --nproc 4 [--mesh 2x2] [--profile cpu]

``search`` plans the model, then plans it again as pure data parallel (every parameter replicated, the batch
split over all devices) and prints both side by side.  Errors print one line on stderr and exit with code 2
(usage errors too); ``--debug`` shows the traceback.  A progress line runs on stderr while planning, only
when stderr is a terminal.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import inspect
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autoshard.errors import AutoshardError

if TYPE_CHECKING:
    from autoshard.cluster import Cluster
    from autoshard.plans import Plan
    from autoshard.report.dot import Level
    from autoshard.report.progress import Progress
    from autoshard.report.table import Baseline
    from autoshard.zoo import ModelCase

__all__ = ["CliError", "main"]

DEFAULT_MODEL = "gpt2"
VERIFY_MODULE = "autoshard.runtime.verify"
PATTERNS = ("column", "row", "vocab", "replicate")


class CliError(AutoshardError, ValueError):
    """A command-line option that cannot work (a bad value, a missing file or tool)."""


# -- argument types --------------------------------------------------------------------------------------------


def _mesh(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(p) for p in text.lower().replace(",", "x").split("x") if p)
    except ValueError:
        raise argparse.ArgumentTypeError(f"mesh {text!r}: write axis sizes like 2x8 or 16") from None
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


def _amount(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number, e.g. 40 or 0.5") from None
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive finite number, e.g. 40 or 0.5")
    return value


def _annotation(text: str) -> tuple[str, Any]:
    """``TARGET=CHOICE`` → ``(target, choice)`` in a form ``autoshard.plan(annotations=...)`` accepts."""
    target, sep, choice = (s.strip() for s in text.partition("="))
    if not sep or not target or not choice:
        raise argparse.ArgumentTypeError(f"annotation {text!r}: write TARGET=CHOICE, e.g. fc1=column")
    return target, parse_choice(choice)


def parse_choice(choice: str) -> Any:
    """A pattern (``column``, ``row@0``), a split tuple (``((2, 1), (1, 4))``) or placements (``(R, S(0))``)."""
    name, _, axis = choice.partition("@")
    if name in PATTERNS:
        if axis and not axis.isdigit():
            raise argparse.ArgumentTypeError(f"{choice!r}: write the axis as a number, e.g. {name}@0")
        return choice
    if choice.replace(" ", "").startswith("(("):
        return _split_tuple(choice)
    from autoshard.errors import ShardingError
    from autoshard.placement import ShardingSpec

    try:
        return ShardingSpec.parse(choice).as_strings()
    except ShardingError as e:
        raise argparse.ArgumentTypeError(
            f"{choice!r} is neither a pattern ({', '.join(PATTERNS)}, optionally @AXIS) nor placements "
            f"like S(0) or '(R, S(1))' ({e})"
        ) from None


def _split_tuple(choice: str) -> tuple[tuple[int, ...], ...]:
    try:
        value = ast.literal_eval(choice)
    except (ValueError, SyntaxError):
        value = None
    ok = isinstance(value, tuple) and all(
        isinstance(t, tuple) and all(isinstance(i, int) and i >= 1 for i in t) for t in value
    )
    if not ok:
        raise argparse.ArgumentTypeError(f"{choice!r}: a split tuple looks like '((2, 1), (1, 4))'")
    return value


# -- parser ----------------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks")
    parser = argparse.ArgumentParser(
        prog="autoshard", description="Auto-parallel planner for PyTorch models.", parents=[common]
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_search(
        sub.add_parser("search", parents=[common], help="plan a model on a cluster, print the report")
    )
    show = sub.add_parser("show", parents=[common], help="print the report of a saved plan")
    show.add_argument("plan", help="a plan saved with search --out (or search --json)")
    dot = sub.add_parser("dot", parents=[common], help="write the graph of a saved plan (DOT, SVG, PNG, PDF)")
    dot.add_argument("plan", help="a plan saved with search --out")
    dot.add_argument(
        "-o", "--output", default=None, help="file.dot, .svg, .png or .pdf (default: DOT on stdout)"
    )
    dot.add_argument("--ops", action="store_true", help="one box per operator instead of per module")
    verify = sub.add_parser(
        "verify", parents=[common], help="run a plan on N gloo processes, compare outputs"
    )
    _add_verify(verify)
    return parser


def _add_search(s: argparse.ArgumentParser) -> None:
    s.add_argument(
        "--profile", required=True, help="bundled profile (a100x8, h100x8, v100x8, cpu) or JSON path"
    )
    s.add_argument(
        "--model", default=DEFAULT_MODEL, help="zoo name (default gpt2) or path/to/file.py:function"
    )
    s.add_argument("--nodes", type=_positive, default=1, help="number of nodes (default 1)")
    s.add_argument("--mesh", type=_mesh, default=None, help="mesh axis sizes, e.g. 2x8 (default: one axis)")
    s.add_argument("--batch", type=_positive, default=None, help="global batch size (zoo models)")
    s.add_argument("--seq", type=_positive, default=None, help="sequence length (zoo models)")
    s.add_argument(
        "--annotate",
        type=_annotation,
        action="append",
        default=[],
        metavar="TARGET=CHOICE",
        help="pin a module or tensor: fc1=column, fc2=row@0, lm_head.weight='(R, S(0))', x=S(0)",
    )
    s.add_argument(
        "--memory-limit", type=_amount, default=None, metavar="GiB", help="per-device budget in GiB"
    )
    s.add_argument("--inference", action="store_true", help="plan the forward pass only")
    s.add_argument("--time-limit", type=_amount, default=60.0, metavar="SECONDS", help="solver time limit")
    s.add_argument("--no-baseline", action="store_true", help="skip the pure data-parallel comparison")
    s.add_argument("--out", default=None, metavar="PLAN.json", help="save the plan as JSON")
    s.add_argument("--dot", default=None, metavar="PLAN.dot", help="write the plan's graph as DOT")
    s.add_argument("--svg", default=None, metavar="PLAN.svg", help="render the graph to SVG (needs graphviz)")
    s.add_argument("--json", action="store_true", help="print the plan and report as JSON")


def _add_verify(v: argparse.ArgumentParser) -> None:
    v.add_argument("--model", required=True, help="zoo name (a tiny one) or path/to/file.py:function")
    v.add_argument("--nproc", type=_positive, required=True, help="number of gloo processes")
    v.add_argument("--mesh", type=_mesh, default=None, help="mesh axis sizes, e.g. 2x2 (default: one axis)")
    v.add_argument("--profile", default="cpu", help="hardware profile to plan with (default cpu)")
    v.add_argument("--annotate", type=_annotation, action="append", default=[], metavar="TARGET=CHOICE")
    v.add_argument("--float64", action="store_true", help="compare in float64 (tight tolerances)")


# -- search ----------------------------------------------------------------------------------------------------


def _search(args: argparse.Namespace) -> int:
    import autoshard
    from autoshard.report.progress import Progress

    _check_outputs(args)
    start = time.perf_counter()
    cluster = autoshard.load_cluster(args.profile, nodes=args.nodes, mesh=args.mesh)
    with Progress(f"building {args.model}") as progress:
        case = _model_case(args)
        plan = _plan(case, cluster, args, dict(args.annotate) or None, progress, f"planning {case.name}")
        baseline = None if args.no_baseline else _baseline(case, cluster, plan, args, progress)
    elapsed = time.perf_counter() - start
    _write_outputs(plan, args)
    _print_result(plan, baseline, args, elapsed)
    return 0


def _check_outputs(args: argparse.Namespace) -> None:
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


def _model_case(args: argparse.Namespace) -> ModelCase:
    from autoshard import zoo

    path, sep, _ = args.model.rpartition(":")
    if not (sep and path.endswith(".py")):
        return zoo.build(args.model, batch=args.batch, seq=args.seq)
    if args.batch is not None or args.seq is not None:
        raise CliError(f"--batch/--seq apply to zoo models; {args.model} builds its own inputs: drop them")
    try:
        return zoo.load_spec(args.model)
    except AutoshardError:
        raise
    except Exception as e:  # the user's own code failed: say where, keep the traceback for --debug
        raise CliError(f"{args.model}: building the model failed: {type(e).__name__}: {e}") from e


def _plan(
    case: ModelCase,
    cluster: Cluster,
    args: argparse.Namespace,
    annotations: dict[str, Any] | None,
    progress: Progress,
    title: str,
) -> Plan:
    import autoshard

    options: dict[str, Any] = {
        "annotations": annotations,
        "training": not args.inference,
        "memory_limit": args.memory_limit * 2**30 if args.memory_limit is not None else None,
        "time_limit": args.time_limit,
    }
    if "progress" in inspect.signature(autoshard.plan).parameters:  # when the pipeline reports its stages
        options["progress"] = progress.stage
    progress.start(title)
    return autoshard.plan(case.model, cluster, case.args, case.kwargs, **options)


def _baseline(
    case: ModelCase, cluster: Cluster, plan: Plan, args: argparse.Namespace, progress: Progress
) -> Baseline:
    """The same model as pure data parallel: every parameter replicated, the batch split over all devices."""
    from autoshard.errors import AnnotationError, InfeasibleError
    from autoshard.report.table import Baseline

    devices = cluster.num_devices
    batch = _batch_size(case)
    if batch is not None and batch % devices:
        multiple = devices * max(1, round(batch / devices))
        return Baseline.impossible(
            f"not possible: a batch of {batch} does not split over {devices} devices (try --batch {multiple})"
        )
    axes = len(cluster.mesh_shape)
    replicate = ("R",) * axes
    annotations: dict[str, Any] = {name: replicate for name, _ in case.model.named_parameters()}
    annotations |= {name: ("S(0)",) * axes for name in plan.input_placements}
    try:
        return Baseline.of(_plan(case, cluster, args, annotations, progress, "planning data parallel"))
    except InfeasibleError as e:
        return Baseline.impossible(f"does not fit: {_first_clause(e)}")
    except AnnotationError as e:
        return Baseline.impossible(f"not possible: {_one_line(e)}")


def _batch_size(case: ModelCase) -> int | None:
    first = case.args[0] if case.args else next(iter(case.kwargs.values()), None)
    shape = getattr(first, "shape", None)
    return int(shape[0]) if shape is not None and len(shape) > 0 else None


def _write_outputs(plan: Plan, args: argparse.Namespace) -> None:
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


def _print_result(plan: Plan, baseline: Baseline | None, args: argparse.Namespace, elapsed: float) -> None:
    from autoshard.report.table import render, report_data

    if args.json:
        data = plan.to_json()
        data["report"] = report_data(plan, baseline) | {"planned_seconds": elapsed}
        print(json.dumps(data, indent=1, sort_keys=True))
        return
    budget = args.memory_limit * 2**30 if args.memory_limit is not None else None
    print(render(plan, baseline=baseline, planned_seconds=elapsed, memory_budget=budget))
    written = [p for p in (args.out, args.dot, args.svg) if p]
    if written:
        print(f"wrote {', '.join(written)}")


# -- show, dot, verify -----------------------------------------------------------------------------------------


def _show(args: argparse.Namespace) -> int:
    from autoshard.plans import load_plan
    from autoshard.report.table import Baseline, render

    plan = load_plan(args.plan)
    baseline = Baseline.from_report(_saved_report(args.plan))
    print(render(plan, baseline=baseline))
    return 0


def _saved_report(path: str) -> dict[str, Any]:
    """The ``report`` block of a file written by ``search --json`` (absent from ``--out`` files)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    report = data.get("report") if isinstance(data, dict) else None
    return report if isinstance(report, dict) else {}


def _dot(args: argparse.Namespace) -> int:
    from autoshard.plans import load_plan
    from autoshard.report import dot

    plan = load_plan(args.plan)
    level: Level = "op" if args.ops else "module"
    if args.output is None:
        print(dot.to_dot(plan, level), end="")
        return 0
    if not Path(args.output).resolve().parent.is_dir():
        raise CliError(
            f"-o {args.output}: directory {Path(args.output).parent} does not exist; create it first"
        )
    print(f"wrote {dot.write(plan, args.output, level)}")
    return 0


def _verify(args: argparse.Namespace) -> int:
    """Delegate to ``autoshard.runtime.verify.run_verify`` when this build has it (imported only here)."""
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


# -- entry point -----------------------------------------------------------------------------------------------


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())


def _first_clause(error: BaseException) -> str:
    """The message up to its first '; ' or '. ' (the what, without the how-to-fix that follows)."""
    text = _one_line(error)
    cut = min((i for i in (text.find("; "), text.find(". ")) if i > 0), default=len(text))
    return text[:cut]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (0 ok, 1 verify found a difference, 2 error, 130 interrupted)."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:  # argparse: --help (0) or a usage error (2), message already printed
        return int(e.code) if isinstance(e.code, int) else 2
    handlers = {"search": _search, "show": _show, "dot": _dot, "verify": _verify}
    debug = getattr(args, "debug", False)
    try:
        return handlers[args.command](args)
    except AutoshardError as e:
        if debug:
            raise
        print(f"autoshard: error: {_one_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("autoshard: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
