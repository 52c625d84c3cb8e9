"""The runtime's gradient buckets against the plan's (Plan.grad_buckets), on 2 local gloo ranks.

``python -m benchmarks.grad_buckets [--hidden H] [--layers L] [--steps K]`` plans a LLaMA-style model
(float32, the zoo's llama-tiny widened to ``--hidden``, as :mod:`benchmarks.overlap_run`) data-parallel for 2
ranks under the default 25 MiB buckets, prints the plan's buckets (the backward unit after which each is
priced to start, its members and bytes), then trains ``--steps`` AdamW steps twice with
:func:`autoshard.runtime.overlap.apply_overlap`:

- ``plan's buckets``: the runtime follows ``Plan.grad_buckets``;
- ``own order``: the same plan with its buckets removed (as a file from before them): parameters in reverse
  registration order, a bucket closing at 25 MiB -- what the runtime ran before.

For each it prints the all-reduces that ran in one step (bytes, in order), whether they equal the plan's,
how many gradients were still to come when each was issued, and the median wall and CPU seconds of a step
after one warm-up.  Not a timed test: on a loaded 2-core machine the figures show what runs, not speed.
"""

from __future__ import annotations

import argparse
import dataclasses
import warnings
from typing import Any

import torch

import autoshard
from autoshard.codegen import parallel_info, parallelize, shard_inputs
from autoshard.runtime.launch import launch
from autoshard.runtime.verify import cluster_for
from benchmarks.overlap_run import DP, _model, timed_steps


def _variant(plan: Any, model: torch.nn.Module, ids: torch.Tensor, steps: int) -> dict[str, Any]:
    from autoshard.runtime.overlap import apply_overlap

    module = parallelize(model, plan, (ids,), record=True)
    opt = torch.optim.AdamW(module.parameters(), lr=1e-3)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        sync, _ = apply_overlap(module, opt)
    wall, cpu = timed_steps(module, opt, shard_inputs(plan, ids), steps)
    log = [r.nbytes for r in parallel_info(module).comm.log or () if r.phase == "backward"]
    per_step = len(log) // (steps + 1)
    return {
        "wall": wall,
        "cpu": cpu,
        "ran": log[-per_step:] if per_step else [],
        "waiting": [w for _, w in sync.events[-per_step:]] if per_step else [],
        "said": [str(w.message) for w in said],
    }


def _rank(plans: dict[str, Any], hidden: int, layers: int, steps: int) -> dict[str, dict[str, Any]]:
    model, ids = _model(hidden, layers)
    return {name: _variant(plan, model, ids, steps) for name, plan in plans.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)
    model, ids = _model(args.hidden, args.layers)
    dp = autoshard.plan(model, cluster_for("cpu", 2), (ids,), annotations=DP)
    params = sum(p.numel() for p in model.parameters())
    print(f"LLaMA-style, {params / 1e6:.1f} M parameters, float32, batch 4 x 64, DP on 2 gloo ranks")
    print(f"plan: {len(dp.grad_buckets)} buckets of {dp.overlap.bucket_bytes / 2**20:.0f} MiB")
    for b in dp.grad_buckets:
        print(
            f"  {b.index}: after {b.unit:<10} {len(b.params):>3} params {b.nbytes / 2**20:8.2f} MiB  {b.params[0]} .."
        )
    plans = {"plan's buckets": dp, "own order": dataclasses.replace(dp, grad_buckets=())}
    results = launch(_rank, 2, plans, args.hidden, args.layers, args.steps, timeout=600)[0]
    planned = [b.nbytes for b in dp.grad_buckets]
    print(f"{'variant':<16}{'wall s/step':>12}{'cpu s/step':>12}  all-reduces in a step")
    for name, r in results.items():
        sizes = ", ".join(f"{n / 2**20:.2f}" for n in r["ran"])
        same = "= the plan's" if r["ran"] == planned else "differ from the plan's"
        print(f"{name:<16}{r['wall']:>12.3f}{r['cpu']:>12.3f}  {len(r['ran'])}: [{sizes}] MiB {same}")
        print(f"{'':<16}gradients still to come at each issue: {r['waiting']}")
        for line in r["said"]:
            print(f"{'':<16}said: {line}")


if __name__ == "__main__":
    main()
