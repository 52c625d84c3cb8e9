"""FSDP under the amp recipe: parameters are all-gathered in bf16 and their gradients reduce-scattered in fp32, as
FSDP2's ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` does (``AMP_BF16.gather_dtype`` /
``reduce_dtype``): priced so, listed so (``Plan.collectives``, the gathered-weights memory) and run so by the emitted
module under ``torch.autocast`` on 2 gloo ranks, with and without reshard-after-forward and prefetch.

The tiny LLaMA in fp32: a ``q_proj`` weight is 64 x 64 = 4096 elements, stored ``S(0)`` over 2 ranks.  By hand: its
gather moves the whole weight, 16 KiB in fp32 and 8 KiB in bf16; its gradient's reduce-scatter 16 KiB in fp32.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import torch

import autoshard
from autoshard import zoo
from autoshard.codegen import gather_outputs, parallel_info, parallelize, shard_inputs
from autoshard.plans import Plan
from autoshard.runtime.launch import launch
from autoshard.runtime.verify import cluster_for

FSDP = {
    "input_ids": ("S(0)",),
    "*_proj": ((2, 1, 1), (1, 1)),
    "*_proj.weight": ("S(0)",),
    "lm_head": ((2, 1, 1), (1, 1)),
    "lm_head.weight": ("S(0)",),
}
Q = 64 * 64  # q_proj's elements


def _case() -> tuple[torch.nn.Module, tuple[Any, ...]]:
    torch.manual_seed(0)
    case = zoo.build("llama-tiny", batch=4, seq=8)
    return case.model.float(), case.args


def _q_proj(plan: Plan) -> set[tuple[str, str, int]]:
    """(phase, kind, bytes) of layer 0's q_proj weight gather (its consumer, the first linear) and reduction;
    not the activations the linear moves too (which ones depends on the plan the ranking picks)."""
    return {
        (c.phase, str(c.kind), c.nbytes)
        for c in plan.collectives
        if c.node in ("linear", "model.layers.0.self_attn.q_proj.weight") and "q_proj" in c.tensor
    }


@pytest.fixture(scope="module")
def plans() -> dict[str, Plan]:
    model, args = _case()
    return {
        recipe: autoshard.plan(model, cluster_for("cpu", 2), args, annotations=FSDP, precision=recipe)
        for recipe in ("bf16", "amp")
    }


def test_amp_gathers_parameters_in_bf16_and_reduces_their_gradients_in_fp32(plans: dict[str, Plan]) -> None:
    fp32 = {("forward", "all_gather", 4 * Q), ("regather", "all_gather", 4 * Q)}
    assert _q_proj(plans["bf16"]) == fp32 | {("backward", "reduce_scatter", 4 * Q)}  # the model's own fp32
    bf16 = {("forward", "all_gather", 2 * Q), ("regather", "all_gather", 2 * Q)}
    assert _q_proj(plans["amp"]) == bf16 | {("backward", "reduce_scatter", 4 * Q)}
    # the gathered weights held while their consumers run: bf16, half the bytes
    gathered = {r: p.memory_breakdown["gathered weights"] for r, p in plans.items()}
    assert gathered["amp"] == gathered["bf16"] / 2 > 0


def _run(
    plan: Plan, overlap: bool
) -> tuple[Counter[tuple[str, str, int]], dict[str, torch.dtype], torch.Tensor]:
    from autoshard.runtime.prefetch import prefetch_gathers
    from autoshard.runtime.reshard import reshard_after_forward

    model, args = _case()
    module = parallelize(model, plan, args, record=True)
    if overlap:
        reshard_after_forward(module)
        prefetch_gathers(module)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = module(*shard_inputs(plan, *args))
    logits.float().square().sum().backward()
    log = parallel_info(module).comm.log or []
    ran = Counter((r.phase, r.kind, r.nbytes) for r in log if r.kind in ("all_gather", "reduce_scatter"))
    grads = {n: p.grad.dtype for n, p in module.named_parameters() if p.grad is not None}
    return ran, grads, gather_outputs(module, logits.detach().float())  # logs more: read the step's first


@pytest.mark.slow
@pytest.mark.parametrize("overlap", [False, True])
def test_the_emitted_module_gathers_in_bf16_under_autocast(plans: dict[str, Plan], overlap: bool) -> None:
    plan = plans["amp"]
    model, args = _case()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        reference = model(*args).logits.float()
    listed = Counter(
        (c.phase, str(c.kind), c.nbytes)
        for c in plan.collectives
        if c.kind in ("all_gather", "reduce_scatter") and (overlap or c.phase != "regather")
    )
    for ran, grads, logits in launch(_run, 2, plan, overlap):
        assert ran == listed  # every gather and reduce-scatter at the bytes the plan lists
        assert ran[("forward", "all_gather", 2 * Q)] > 0 and ran[("backward", "reduce_scatter", 4 * Q)] > 0
        assert set(grads.values()) == {torch.float32}  # fp32 gradients for the fp32 shards
        torch.testing.assert_close(logits, reference, atol=0.05, rtol=0.05)  # bf16 products on both sides
