"""``autoshard shapes``: one parameter layout for several (batch, sequence) shapes of a zoo model, weighted.

autoshard shapes --profile a100x8 --model gpt2 --mesh 4x2 --shapes 8x512:0.7,8x1024:0.3 --out gpt2.json
(writes gpt2.8x512.json and gpt2.8x1024.json: one plan per shape, the same parameter layout)
"""

from __future__ import annotations

import argparse
from pathlib import Path

from autoshard.cli.args import CliError, amount, positive, profile_help

__all__ = ["HELP", "add_arguments", "parse_shapes", "run", "shape_paths"]

HELP = "plan one parameter layout for several weighted input shapes (sequence buckets)"


def parse_shapes(text: str) -> list[tuple[int, int, float]]:
    """``"8x2048:0.7,8x8192:0.3"`` -> ``[(8, 2048, 0.7), (8, 8192, 0.3)]`` (batch x seq : weight).

    Every shape carries a weight or none does (then each weighs ``1 / n``): a mix is refused (new-user
    trial: a missing weight became 1 and the weighted step a sum)."""
    out, weighted = [], []
    for item in text.split(","):
        size, _, weight = item.strip().partition(":")
        batch, _, seq = size.partition("x")
        try:
            out.append((int(batch), int(seq), float(weight) if weight else 1.0))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"shape {item!r}: write BATCHxSEQ:WEIGHT, e.g. 8x2048:0.7 (weights on every shape or on none)"
            ) from None
        if out[-1][0] < 1 or out[-1][1] < 1 or not out[-1][2] > 0:
            raise argparse.ArgumentTypeError(f"shape {item!r}: batch, sequence and weight must be positive")
        weighted.append(bool(weight))
    if any(weighted) and not all(weighted):
        bare = ", ".join(item.strip() for item, w in zip(text.split(","), weighted, strict=True) if not w)
        raise argparse.ArgumentTypeError(
            f"{bare}: no weight where other shapes have one; give every shape a weight (e.g. 8x512:0.7,"
            "8x1024:0.3) or none (equal weights)"
        )
    return out if all(weighted) else [(b, s, 1 / len(out)) for b, s, _ in out]


def add_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("--profile", required=True, help=profile_help())
    s.add_argument("--model", default="gpt2", help="zoo name (default gpt2)")
    s.add_argument("--nodes", type=positive, default=1, help="number of nodes (default 1)")
    s.add_argument(
        "--mesh",
        default=None,
        help="mesh axis sizes, e.g. 4x2 (default: one axis of every device; shapes does not search meshes "
        "as search --mesh auto does: plan one shape with search to pick a mesh)",
    )
    s.add_argument(
        "--shapes",
        type=parse_shapes,
        required=True,
        metavar="BxS:W,...",
        help="e.g. 8x2048:0.7,8x8192:0.3 (no weights: equal)",
    )
    s.add_argument(
        "--memory-limit", type=amount, default=None, metavar="GiB", help="per-device budget in GiB"
    )
    s.add_argument(
        "--out",
        default=None,
        metavar="PLAN.json",
        help="save each shape's plan (one layout) as PLAN.BxS.json, e.g. plan.8x512.json: show, verify, "
        "parallelize read each",
    )


def shape_paths(out: str, shapes: list[tuple[int, int, float]]) -> list[Path]:
    """``plan.json`` and shapes 8x512, 8x1024 -> ``plan.8x512.json``, ``plan.8x1024.json``; refused when the
    directory is missing or two shapes would share a file."""
    path = Path(out)
    if not path.resolve().parent.is_dir():
        raise CliError(f"--out {out}: directory {path.parent} does not exist; create it first")
    names = [f"{b}x{s}" for b, s, _ in shapes]
    if len(set(names)) != len(names):
        raise CliError(f"--shapes: {', '.join(names)} repeats a shape; give each BATCHxSEQ once")
    suffix = path.suffix or ".json"
    return [path.with_name(f"{path.name.removesuffix(path.suffix)}.{n}{suffix}") for n in names]


def run(args: argparse.Namespace) -> int:
    import autoshard
    from autoshard import zoo
    from autoshard.cli.args import mesh
    from autoshard.multishape import plan_shapes
    from autoshard.report.groups import collapse_layers

    sizes = None
    if args.mesh is not None:
        sizes = mesh(args.mesh)
        if sizes == "auto":
            raise CliError("shapes plans on one mesh: give --mesh sizes, e.g. 4x2")
    paths = shape_paths(args.out, args.shapes) if args.out else []  # refused before planning, not after
    cluster = autoshard.load_cluster(args.profile, nodes=args.nodes, mesh=sizes)  # type: ignore[arg-type]
    cases = [(w, zoo.build(args.model, batch=b, seq=s)) for b, s, w in args.shapes]
    multi = plan_shapes(
        cases[0][1].model,
        cluster,
        [(w, c.args, dict(c.kwargs)) for w, c in cases],
        memory_limit=args.memory_limit * 2**30 if args.memory_limit is not None else None,
    )
    print(multi.summary())
    print("parameter placements (shared; repeated layers with one placement on one row):")
    for name, placement in collapse_layers(multi.param_placements):
        print(f"  {name}: {', '.join(placement)}")
    for plan, path in zip(multi.plans, paths, strict=True):
        try:
            plan.save(path)
        except OSError as e:
            raise CliError(f"cannot write {path}: {e.strerror}; check the path and its permissions") from e
        print(f"wrote {path}")
    return 0
