"""What the amp recipe moves: FSDP parameter gathers and ring-attention K/V hops, priced per recipe.

    OMP_NUM_THREADS=1 python -m benchmarks.amp_moves

LLaMA-3-8B on one H100 node (h100x8, 8 devices), built on meta, planned with pins so that both cases are the
same layout under every recipe (the figures compare bytes, not choices):

- FSDP: batch 8 x 4096 split over the 8 devices, every projection and ``lm_head`` weight stored ``S(0)`` and
  all-gathered before use.  Recipes: ``bf16`` (the model's own bf16), ``amp`` with fp32 gathers (the recipe
  before ``PrecisionPolicy.gather_dtype``: autocast alone, FSDP2 without a ``MixedPrecisionPolicy``) and
  ``amp`` (bf16 gathers, fp32 reduce-scatters: FSDP2's ``MixedPrecisionPolicy(bf16, fp32)``).
- Ring: the model in fp32 (as amp users keep it), batch 1 x 8192, attention ringed over the 8 devices.
  ``bf16`` here prices the captured fp32 (what amp priced before ``ring_itemsize``), ``amp`` autocast's bf16.

Prints, per case and recipe, the forward all-gather and backward reduce-scatter bytes per device and step
(``Plan.collectives``), the gathered-weights memory, the ring's bytes per forward hop (``Plan.ring_transfers``),
the communication seconds and the predicted step.
"""

from __future__ import annotations

import dataclasses
import time

import torch

import autoshard
from autoshard import zoo
from cost_models import memory

FSDP = {
    "input_ids": ("S(0)",),
    "*_proj": ((8, 1, 1), (1, 1)),
    "*_proj.weight": ("S(0)",),
    "lm_head": ((8, 1, 1), (1, 1)),
    "lm_head.weight": ("S(0)",),
}
RING = {"model.layers.*.self_attn": "ring", "input_ids": ("S(1)",)}
OLD_AMP = "amp (fp32 gathers)"


def _row(case: str, recipe: str, plan: autoshard.Plan, cpu: float) -> str:
    by = {
        kind: sum(c.nbytes for c in plan.collectives if c.kind == kind and c.phase == phase) / 2**30
        for kind, phase in (("all_gather", "forward"), ("reduce_scatter", "backward"))
    }
    hop = max((r.nbytes for r in plan.ring_transfers if r.phase == "forward"), default=0) / 2**20
    gathered = plan.memory_breakdown.get("gathered weights", 0.0) / 2**30
    return (
        f"{case:5} {recipe:19} gather {by['all_gather']:7.2f} GiB  reduce-scatter {by['reduce_scatter']:7.2f} GiB  "
        f"gathered {gathered:6.2f} GiB  hop {hop:6.2f} MiB  comm {plan.communication_time * 1e3:8.2f} ms  "
        f"step {plan.predicted_step_time * 1e3:8.2f} ms  (plan {cpu:.1f} s CPU)"
    )


def main() -> None:
    memory.RECIPES[OLD_AMP] = dataclasses.replace(memory.AMP_BF16, gather_dtype=None, reduce_dtype=None)
    cluster = autoshard.load_cluster("h100x8", nodes=1, mesh=(8,))
    for case, pins, batch, seq, dtype, recipes in (
        ("fsdp", FSDP, 8, 4096, torch.bfloat16, ("bf16", OLD_AMP, "amp")),
        ("ring", RING, 1, 8192, torch.float32, ("bf16", "amp")),
    ):
        built = zoo.build("llama3-8b", batch=batch, seq=seq, device="meta")
        model = built.model.to(dtype)
        for recipe in recipes:
            t0 = time.process_time()
            plan = autoshard.plan(
                model, cluster, built.args, built.kwargs, annotations=pins, precision=recipe,  # type: ignore[arg-type]
                cp_layout="zigzag" if case == "ring" else "auto",
            )  # fmt: skip
            print(_row(case, recipe, plan, time.process_time() - t0), flush=True)


if __name__ == "__main__":
    main()
