"""``autoshard search``: plan a model on a cluster, then plan it again as pure data parallel, print both."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import time
from typing import TYPE_CHECKING, Any

from autoshard.cli.args import (
    CliError,
    amount,
    annotation,
    check_memory_limit,
    count_or_auto,
    first_clause,
    mesh,
    one_line,
    pin_map,
    positive,
    profile_help,
    schedule,
    whole_in,
)
from autoshard.errors import AutoshardError

if TYPE_CHECKING:
    from autoshard.capture import Captured
    from autoshard.cluster import Cluster
    from autoshard.plans import Plan
    from autoshard.report.progress import Progress
    from autoshard.report.table import Baseline
    from autoshard.report.timing import Phase
    from autoshard.zoo import ModelCase

__all__ = ["HELP", "add_arguments", "run"]

HELP = "plan a model on a cluster, print the report"
DEFAULT_MODEL = "gpt2"
MAX_AXES = 4  # --max-axes: DP, FSDP/CP, TP and a pipeline or expert axis; more multiplies strategies per op


def add_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("--profile", required=True, help=profile_help())
    s.add_argument(
        "--model", default=DEFAULT_MODEL, help="zoo name (default gpt2) or path/to/file.py:function"
    )
    s.add_argument("--nodes", type=positive, default=1, help="number of nodes (default 1)")
    s.add_argument(
        "--mesh",
        type=mesh,
        default="auto",
        help="mesh axis sizes, e.g. 2x8, or auto (default): try 1-D to --max-axes-D meshes, keep the best",
    )
    s.add_argument(
        "--max-axes",
        type=whole_in(
            1, MAX_AXES, f"--mesh auto tries meshes of at most {MAX_AXES} axes; 4-D can take minutes"
        ),
        default=3,
        help=f"with --mesh auto: the most mesh axes to try, 1 to {MAX_AXES} (default 3; 4-D meshes can take minutes)",
    )
    s.add_argument("--batch", type=positive, default=None, help="global batch size (zoo models)")
    s.add_argument("--seq", type=positive, default=None, help="sequence length (zoo models)")
    s.add_argument("--layers", type=positive, default=None, help="repeated layers (zoo models)")
    s.add_argument(
        "--annotate",
        type=annotation,
        action="append",
        default=[],
        metavar="TARGET=CHOICE",
        help="pin a module or tensor: fc1=column, fc2=row@0, lm_head.weight='(R, S(0))', x=S(0)",
    )
    from autoshard.steering import FORBIDS

    kinds = "; ".join(f"{k}: {what}" for k, what in FORBIDS.items())
    s.add_argument(
        "--allow", action="append", default=[], metavar="KIND", help=f"use only these kinds ({kinds})"
    )
    s.add_argument(
        "--forbid",
        action="append",
        default=[],
        metavar="KIND",
        help="never use a kind, e.g. tp (kinds: --allow)",
    )
    s.add_argument(
        "--memory-limit", type=amount, default=None, metavar="GiB", help="per-device budget in GiB"
    )
    s.add_argument(
        "--pp", type=count_or_auto, default=None, metavar="N|auto", help="pipeline stages (default: none)"
    )
    s.add_argument(
        "--microbatches",
        type=count_or_auto,
        default=None,
        metavar="N|auto",
        help="microbatches per step (default: 1 without stages, else at least 2 per stage; auto: searched)",
    )
    s.add_argument(
        "--schedule",
        type=schedule,
        default="auto",
        metavar="NAME",
        help="pipeline schedule: auto, gpipe, 1f1b, interleaved_1f1b, zb_v, interleaved_zb",
    )
    s.add_argument(
        "--price-pins",
        choices=("mesh", "meshes"),
        default="mesh",
        help="with --mesh auto and --annotate/--allow/--forbid: the unpinned optimum the pins are priced "
        "against, of the chosen mesh (default) or of every mesh searched (a second mesh search)",
    )
    s.add_argument("--inference", action="store_true", help="plan the forward pass only")
    s.add_argument(
        "--precision",
        choices=("bf16", "amp"),
        default="bf16",
        help="training recipe priced: bf16 (the model's dtypes, fp32 master) or amp (fp32 weights, autocast)",
    )
    s.add_argument("--time-limit", type=amount, default=60.0, metavar="SECONDS", help="solver time limit")
    s.add_argument("--no-baseline", action="store_true", help="skip the pure data-parallel comparison")
    s.add_argument("--out", default=None, metavar="PLAN.json", help="save the plan as JSON")
    s.add_argument("--dot", default=None, metavar="PLAN.dot", help="write the plan's graph as DOT")
    s.add_argument("--svg", default=None, metavar="PLAN.svg", help="render the graph to SVG (needs graphviz)")
    s.add_argument("--json", action="store_true", help="print the plan and report as JSON")


def run(args: argparse.Namespace) -> int:
    import autoshard
    from autoshard.cli.files import check_outputs, write_outputs
    from autoshard.cli.stage_hint import with_stage_hint
    from autoshard.errors import InfeasibleError
    from autoshard.report.progress import Progress
    from autoshard.report.timing import Phase, timed, with_parts

    check_outputs(args)
    _check_kinds(args)
    start = time.perf_counter()
    auto = args.mesh == "auto"
    cluster = autoshard.load_cluster(args.profile, nodes=args.nodes, mesh=None if auto else args.mesh)
    check_memory_limit(args.memory_limit, cluster)
    phases: list[Phase] = []
    with Progress(f"building {args.model}") as progress:
        case = timed(phases, "model", lambda: _model_case(args))
        captured = None if args.no_baseline and not auto else _capture(case, progress)
        if captured is not None:
            phases.append(Phase("capture", captured.seconds))
        annotations = pin_map(args.annotate)
        staged = {"pipeline": args.pp, "microbatches": args.microbatches, "schedule": args.schedule}
        title = f"planning {case.name}"

        def staged_plan(d: int) -> Plan:  # the same search with d pipeline stages (cli/stage_hint.py)
            if auto:
                return _plan_auto(
                    case, args, annotations, progress, title, captured, staged | {"pipeline": d}
                )[0]
            return _plan(
                case,
                cluster,
                args,
                annotations,
                progress,
                title,
                captured=captured,
                staged=staged | {"pipeline": d},
            )

        try:
            if auto:  # every candidate mesh plans the same capture
                plan, cluster, tried = _plan_auto(case, args, annotations, progress, title, captured, staged)
                phases += tried
            else:
                plan = timed(
                    phases,
                    f"plan on {'x'.join(map(str, cluster.mesh_shape))}",
                    lambda: _plan(
                        case, cluster, args, annotations, progress, title, captured=captured, staged=staged
                    ),
                )
                phases[-1] = with_parts(phases[-1], plan.timings, captured is None)
        except InfeasibleError as e:  # no plan fits the budget: say what pipeline stages would do
            raise with_stage_hint(e, args, cluster.num_devices, staged_plan) from e
        timings = plan.timings | ({"capture": captured.seconds} if captured is not None else {})
        plan = dataclasses.replace(plan, source={**plan.source, **_source(args)}, timings=timings)
        baseline = (
            None
            if args.no_baseline
            else timed(
                phases,
                "data-parallel baseline",
                lambda: _baseline(case, cluster, plan, args, progress, captured),
            )
        )
    if args.out or args.dot or args.svg:
        timed(phases, "writing files", lambda: write_outputs(plan, args))
    _print_result(plan, baseline, args, time.perf_counter() - start, phases)
    return 0


def _check_kinds(args: argparse.Namespace) -> None:
    """Unknown or contradictory kinds, and --pp with pp forbidden, refused before the model is built."""
    from autoshard.steering import check_stages, forbidden_kinds

    check_stages(forbidden_kinds(args.allow, args.forbid), args.pp, stage_pin=False)


def _capture(case: ModelCase, progress: Progress) -> Captured:
    """One capture for both plans (the plan and its data-parallel baseline): capturing costs the most."""
    from autoshard.capture import capture

    progress.start(f"capturing {case.name}")
    return capture(case.model, case.args, dict(case.kwargs), blocks="auto")


def _source(args: argparse.Namespace) -> dict[str, Any]:
    """What ``verify --plan`` needs to rebuild the model (Plan.source)."""
    return {"spec": args.model, **{k: v for k in ("batch", "seq", "layers") if (v := getattr(args, k, None))}}


def _model_case(args: argparse.Namespace) -> ModelCase:
    from autoshard import zoo

    path, sep, _ = args.model.rpartition(":")
    if not (sep and path.endswith(".py")):
        return zoo.build(args.model, batch=args.batch, seq=args.seq, layers=getattr(args, "layers", None))
    if len(_source(args)) > 1:  # --batch, --seq or --layers
        raise CliError(f"--batch/--seq apply to zoo models (--layers too): drop them for {args.model}")
    try:
        return zoo.load_spec(args.model)
    except AutoshardError:
        raise
    except Exception as e:  # the user's own code failed: say where, keep the traceback for --debug
        raise CliError(f"{args.model}: building the model failed: {type(e).__name__}: {e}") from e


def _plan_auto(
    case: ModelCase,
    args: argparse.Namespace,
    annotations: dict[str, Any] | None,
    progress: Progress,
    title: str,
    captured: Captured | None,
    staged: dict[str, Any],
) -> tuple[Plan, Cluster, list[Phase]]:
    """--mesh auto: every candidate mesh planned from one capture; the best plan, its cluster, and each
    candidate's planning time (best first)."""
    import autoshard
    from autoshard.meshsearch import price_over_meshes, search_mesh
    from autoshard.report.timing import Phase, with_parts

    options: dict[str, Any] = {
        "annotations": annotations,
        "training": not args.inference,
        "memory_limit": args.memory_limit * 2**30 if args.memory_limit is not None else None,
        "time_limit": args.time_limit,
    }
    if getattr(args, "precision", "bf16") != "bf16":  # the amp recipe (cost_models.memory.RECIPES)
        options["precision"] = args.precision
    if args.allow or args.forbid:
        options |= {"allow": args.allow, "forbid": args.forbid}
    options |= staged  # pipeline stages, microbatches, schedule: planned on every candidate mesh
    progress.start(title)
    found = search_mesh(
        case.model,
        args.profile,
        case.args,
        case.kwargs,
        nodes=args.nodes,
        max_axes=args.max_axes,
        progress=progress.stage,
        captured=captured,
        **options,
    )
    plan = found.plan
    if getattr(args, "price_pins", "mesh") == "meshes" and plan.pinned:  # the pins' price over every mesh
        plan = price_over_meshes(
            found,
            case.model,
            args.profile,
            case.args,
            case.kwargs,
            progress.stage,
            captured=captured,
            **options,
        )
    tried = [
        Phase(f"mesh {'x'.join(map(str, c.mesh_shape))}", c.seconds, (("bounded, pruned", c.seconds),))
        if c.pruned and not c.timings  # bounded before it was planned (autoshard.meshbound)
        else with_parts(Phase(f"mesh {'x'.join(map(str, c.mesh_shape))}", c.seconds), c.timings, False)
        for c in found.candidates
    ]
    return (
        plan,
        autoshard.load_cluster(args.profile, nodes=args.nodes, mesh=found.mesh_shape),
        tried,
    )


def _plan(
    case: ModelCase,
    cluster: Cluster,
    args: argparse.Namespace,
    annotations: dict[str, Any] | None,
    progress: Progress,
    title: str,
    *,
    steer: bool = True,
    captured: Captured | None = None,
    staged: dict[str, Any] | None = None,
) -> Plan:
    import autoshard

    options: dict[str, Any] = {
        **(staged or {}),
        "annotations": annotations,
        "training": not args.inference,
        "memory_limit": args.memory_limit * 2**30 if args.memory_limit is not None else None,
        "time_limit": args.time_limit,
    }
    if getattr(args, "precision", "bf16") != "bf16":  # the amp recipe (cost_models.memory.RECIPES)
        options["precision"] = args.precision
    if steer and (args.allow or args.forbid):  # not for the baseline: it pins every tensor itself
        options |= {"allow": args.allow, "forbid": args.forbid}
    if captured is not None:
        options["captured"] = captured
    if "progress" in inspect.signature(autoshard.plan).parameters:  # when the pipeline reports its stages
        options["progress"] = progress.stage
    progress.start(title)
    return autoshard.plan(case.model, cluster, case.args, case.kwargs, **options)


def _baseline(
    case: ModelCase,
    cluster: Cluster,
    plan: Plan,
    args: argparse.Namespace,
    progress: Progress,
    captured: Captured | None = None,
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
        dp = _plan(
            case,
            cluster,
            args,
            annotations,
            progress,
            "planning data parallel",
            steer=False,
            captured=captured,
        )
        return Baseline.of(dp)
    except InfeasibleError as e:
        return Baseline.impossible(f"does not fit: {first_clause(e)}")
    except AnnotationError as e:
        return Baseline.impossible(f"not possible: {one_line(e)}")


def _batch_size(case: ModelCase) -> int | None:
    first = case.args[0] if case.args else next(iter(case.kwargs.values()), None)
    shape = getattr(first, "shape", None)
    return int(shape[0]) if shape is not None and len(shape) > 0 else None


def _print_result(
    plan: Plan, baseline: Baseline | None, args: argparse.Namespace, elapsed: float, phases: list[Phase]
) -> None:
    from autoshard.report.table import render, report_data

    if args.json:
        data = plan.to_json()
        data["report"] = report_data(plan, baseline) | {
            "planned_seconds": elapsed,
            "phases": [{"name": p.name, "seconds": p.seconds, "parts": dict(p.parts)} for p in phases],
        }
        print(json.dumps(data, indent=1, sort_keys=True))
        return
    budget = args.memory_limit * 2**30 if args.memory_limit is not None else None
    print(render(plan, baseline=baseline, planned_seconds=elapsed, memory_budget=budget, phases=phases))
    written = [p for p in (args.out, args.dot, args.svg) if p]
    if written:
        print(f"wrote {', '.join(written)}")
