"""``autoshard ops MODEL``: the op-coverage report -- every op kind with count, FLOPs share, rule or fallback.

    autoshard ops llama3-8b
    autoshard ops path/to/my_model.py:make --json

Captures the model (repeated blocks count once per block of the model) and lists, largest FLOPs first, each
op kind, how many times it runs, its share of the forward FLOPs and the rule that shards it -- or
``fallback: replicated`` when it has none, with the total share of FLOPs that would then run whole on
every device.  Exit code 0 either way: the report is the answer.
"""

from __future__ import annotations

import argparse
import json
import warnings

from autoshard.cli.args import positive

__all__ = ["HELP", "add_arguments", "run"]

HELP = "list a model's ops with count, FLOPs share and sharding rule (or fallback)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="zoo name (e.g. gpt2) or path/to/file.py:function")
    p.add_argument("--batch", type=positive, default=None, help="global batch size (zoo models)")
    p.add_argument("--seq", type=positive, default=None, help="sequence length (zoo models)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")


def run(args: argparse.Namespace) -> int:
    from autoshard.capture import capture
    from autoshard.cli.search import _model_case
    from autoshard.strategies import UnsupportedOpWarning
    from autoshard.strategies.coverage import op_coverage

    case = _model_case(args)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnsupportedOpWarning)  # the report below says it, op by op
        rows = op_coverage(capture(case.model, case.args, case.kwargs))
    replicated = [r for r in rows if r.replicated]
    share = sum(r.share for r in replicated)
    if args.json:
        data = {
            "model": case.name,
            "ops": [
                {"op": r.op, "count": r.count, "flops": r.flops, "share": r.share, "rule": r.rule}
                for r in rows
            ],
            "replicated_share": share,
        }
        print(json.dumps(data, indent=1))
        return 0
    print(f"op coverage of {case.name}: {len(rows)} op kinds, {sum(r.count for r in rows)} ops")
    print(f"  {'op':<48} {'count':<6} {'FLOPs':>7}  rule")
    for r in rows:
        print(f"  {r}")
    if replicated:
        names = ", ".join(r.op for r in replicated)
        print(
            f"{len(replicated)} op kinds have no rule and run replicated ({share:.2%} of the FLOPs): {names}"
        )
    else:
        print("every op has a sharding rule")
    return 0
