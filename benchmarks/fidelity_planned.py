"""Korthikanti et al.'s runs through ``autoshard.plan`` itself: the published configuration pinned, stages searched.

Each Megatron run of :mod:`benchmarks.fidelity_runs` is planned on the meta device with its published
configuration pinned and everything else left to the planner's own pricing:

* the model: a Megatron-shaped GPT (:func:`benchmarks.fidelity._gpt_module`: learned positions, GELU MLP of
  4 x hidden, tied embedding and head, Megatron 2022's unfused attention) at full depth, bf16;
* the cluster: ``gpus / 8`` DGX A100 nodes (``a100x8``), mesh ``(nodes, 8)``;
* ``pipeline=<published PP>``, ``microbatches=<global batch / (micro-batch x DP)>``, ``schedule`` Megatron's
  (``interleaved_1f1b`` where the run interleaves, ``1f1b`` otherwise), and the published chunking pinned
  by ``"stage"`` cuts every ``layers / (PP x v)`` layers (so the interleaving depth ``v`` is Megatron's);
* annotations pinning Megatron's tensor parallelism on the node's 8 GPUs (QKV and MLP-in column, the two
  output projections row, the embedding over the vocabulary), and the published recomputation
  (``full``; ``selective`` for the SP + selective column: autoshard's selective policy is torchtitan's
  op-level one, which keeps the matmul outputs and re-runs the rest, Korthikanti's the attention core).

The planner then searches only what Megatron leaves open (activation layouts, hence sequence parallelism)
and prices every stage with the critical path of :mod:`autoshard.problem.step` and the schedule of
:mod:`autoshard.pipeline.schedules`: no composition by hand.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from benchmarks.fidelity_runs import RUNS, Run

__all__ = ["MEGATRON_PINS", "planned_case", "planned_step"]

MEGATRON_PINS: dict[str, str] = {
    "*.attn.q": "column", "*.attn.k": "column", "*.attn.v": "column", "*.mlp.fc": "column",
    "*.attn.proj": "row", "*.mlp.out": "row", "wte": "vocab",
}  # fmt: skip


def _pins(run: Run) -> dict[str, Any]:
    pins: dict[str, Any] = dict(MEGATRON_PINS)
    chunks = run.pp * run.virtual_stages
    if run.pp > 1 and chunks > 1:
        size = run.model.layers // chunks
        pins.update({f"blocks.{c * size}": "stage" for c in range(1, chunks)})
    return pins


def planned_case(key: str) -> dict[str, Any]:
    """Plan run ``key`` (child process): step time, schedule and the plan's headline."""
    import torch

    import autoshard
    from benchmarks.fidelity import SEQ, _gpt_module
    from benchmarks.report import percent

    run = next(r for r in RUNS if r.key == key)
    m = run.model
    model = _gpt_module(m.hidden, m.heads, m.layers)
    ids = torch.zeros((run.global_batch // run.dp, SEQ), dtype=torch.long, device="meta")
    nodes = run.gpus // 8
    cluster = autoshard.load_cluster("a100x8", nodes=nodes, mesh=(nodes, 8) if nodes > 1 else (8,))
    recompute: Literal["full", "selective"] = "full" if run.recompute == "full" else "selective"
    schedule = "interleaved_1f1b" if run.virtual_stages > 1 else "1f1b"
    t0, cpu0 = time.perf_counter(), time.process_time()
    plan = autoshard.plan(
        model, cluster, (ids,), annotations=_pins(run), recompute=recompute,
        pipeline=run.pp if run.pp > 1 else None, microbatches=run.microbatches,
        schedule=schedule if run.pp > 1 else "auto", memory_limit=float("inf"),
    )  # fmt: skip
    pp = plan.pipeline
    why = ""
    if pp is not None and pp.virtual_stages == 1 and len(pp.stages) > 2:
        # 1F1B's steady state is paced by its slowest stage: the last, which also runs the LM head and loss
        last, middle = pp.stages[-1].compute_seconds, pp.stages[len(pp.stages) // 2].compute_seconds
        balanced = plan.predicted_step_time - (run.microbatches - 1) * (last - middle)
        why = (
            f"the last stage (LM head + fp32 loss on {m.layers // run.pp} layers) takes "
            f"{percent(last / middle - 1, signed=True)} per microbatch over a middle stage and paces 1F1B's "
            f"steady state; paced by a middle stage the step would be {balanced:.1f} s "
            f"({percent(balanced / run.step_seconds - 1, signed=True)}); the 1F1B bubble "
            f"(p - 1) / (m + p - 1) is {percent(pp.bubble_fraction)} of the step"
        )
    return {
        "step_s": plan.predicted_step_time,
        "headline": plan.summary().splitlines()[0],
        "schedule": f"{pp.schedule} v={pp.virtual_stages}" if pp else "none",
        "bubble": pp.bubble_fraction if pp else 0.0,
        "recompute": plan.recompute,
        "plan_s": time.perf_counter() - t0,
        "plan_cpu_s": time.process_time() - cpu0,
        "why": why,
    }


def planned_step(key: str) -> dict[str, Any]:
    """:func:`planned_case` in a fresh process (its figures, or ``{"error": ...}``)."""
    from benchmarks.isolate import run_isolated

    return run_isolated("benchmarks.fidelity_planned:planned_case", {"key": key})
