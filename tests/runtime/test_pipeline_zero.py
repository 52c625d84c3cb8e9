"""ZeRO and FSDP combined with pipelining through the one gradient-sync pass (runtime/grad_sync.py).

A 4-layer tiny LLaMA (float64) on 4 gloo ranks as 2 pipeline stages (1F1B, 4 microbatches) x 2 data-parallel
ranks.  With ZeRO-1 on each stage module the deferred gradient sums are reduce-scattered once per step by the
optimizer (never all-reduced); with an FSDP plan the gathered weights' reduce-scatter runs once per step on the
gradient summed over the microbatches, as priced -- not once per microbatch -- and the weights are freed after
use and re-gathered in backward (``regather``), as priced.  Both equal single-device AdamW.
"""

from __future__ import annotations

import dataclasses
import functools
from collections import Counter
from typing import Any

import pytest
import torch
from test_pipelining import (
    AFTER_ADAMW,
    BATCH_SPLIT,
    MICRO,
    STEPS,
    TWO,
    _batches,
    _model,
    _single_device,
    loss_fn,
)

import autoshard
from autoshard.codegen import parallel_info
from autoshard.codegen.collectives import parse_steps
from autoshard.plans import PipelinePlan, PipelineStage, Plan
from autoshard.runtime.launch import launch
from autoshard.runtime.pipelining import build_pipeline, full_state_dict, step
from autoshard.runtime.stages import prepare_stages
from autoshard.runtime.verify import cluster_for
from autoshard.runtime.zero import ZeroOptimizer

DP = {"input_ids": ("S(0)",), "*_proj": BATCH_SPLIT, "lm_head": BATCH_SPLIT}
FSDP = {**DP, "*_proj.weight": ("S(0)",), "lm_head.weight": ("S(0)",)}
LAYOUTS = {"zero1": DP, "fsdp": FSDP}


@functools.cache
def _plan(kind: str) -> Plan:
    model, ids = _model()
    intra = autoshard.plan(model, cluster_for("cpu", 2), (ids,), annotations=LAYOUTS[kind])
    stages = tuple(PipelineStage(i, mods, None, ((0, 1), (2, 3))[i]) for i, mods in enumerate(TWO))
    return dataclasses.replace(intra, pipeline=PipelinePlan(stages, "1f1b", 1), microbatches=MICRO)


@functools.cache
def _stages(kind: str) -> Any:
    model, ids = _model()
    return prepare_stages(model, _plan(kind), (ids,), LAYOUTS[kind])


def _run(kind: str) -> dict[str, Any]:
    model, ids = _model()
    run = build_pipeline(model, _plan(kind), (ids,), loss_fn, stages=_stages(kind), record=True)
    (module,) = run.modules
    if kind == "zero1":
        opt: Any = ZeroOptimizer(module, torch.optim.AdamW, stage=1, lr=1e-2)
        claimed = len(opt.deferred)
    else:
        opt, claimed = torch.optim.AdamW(run.parameters(), lr=1e-2), 0
    for inputs, labels in _batches():
        opt.zero_grad()
        step(run, inputs, labels)
        opt.step()
    ran = Counter(f"{r.phase}:{r.kind}" for r in parallel_info(module).comm.log or ())
    gathered = [d for d in run.deferred[0] if d.gathered]
    once = Counter(str(st.kind) for d in gathered for st in parse_steps(d.steps) if st.is_collective)
    return {
        "weights": full_state_dict(run),
        "ran": ran,
        "claimed": claimed,
        "gathered": len(gathered),
        "once": once,
    }


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(LAYOUTS))
def test_zero_and_fsdp_combine_with_pipelining(kind: str) -> None:
    _stages(kind)  # planned once here; forked ranks inherit it
    ranks = launch(_run, 4, kind, timeout=300)
    _, _, ref_weights = _single_device()
    for r in ranks:
        for name, want in ref_weights.items():
            torch.testing.assert_close(r["weights"][name], want, **AFTER_ADAMW, msg=f"{kind}: {name}")
        ran = r["ran"]
        if kind == "zero1":
            assert r["claimed"] > 0
            # every deferred sum reduce-scattered once per step by the optimizer, none all-reduced in backward
            assert ran["optimizer:reduce_scatter"] == r["claimed"] * STEPS, ran
            assert ran["backward:all_reduce"] == 0, ran
        else:
            # the gathered weights' reduce-scatter once per step (as priced), not once per microbatch
            assert r["gathered"] > 0
            assert r["once"]["reduce_scatter"] >= r["gathered"] - 1, r["once"]  # lm_head may sum another way
            assert ran["backward:reduce_scatter"] == r["once"]["reduce_scatter"] * STEPS, ran
            assert ran["forward:all_gather"] >= r["gathered"] * MICRO * STEPS, ran
            # freed after use and gathered again in every microbatch's backward, as the plan prices it
            assert ran["regather:all_gather"] == r["gathered"] * MICRO * STEPS, ran
