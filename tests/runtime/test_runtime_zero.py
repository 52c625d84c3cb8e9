"""ZeRO-1/2 at run time equal single-process AdamW, shard the state, and run the collectives the plan priced.

A run prints nothing of torch's own: the bucketed gradient reduce-scatters and FSDP's use torch 2.13's
``reduce_scatter_single``, not ``reduce_scatter_tensor``, which warns (FutureWarning) on every rank and call; the
ranks turn FutureWarning into an error.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any, Literal

import pytest
import torch
from runtime_cases import LLAMA_FSDP, LLAMA_MEGATRON, model, plan

from autoshard.codegen import full_state_dict, parallel_info, parallelize, shard_inputs
from autoshard.runtime.launch import launch
from autoshard.runtime.zero import ZeroError, ZeroOptimizer

STEPS = 3
# the embedding pinned batch-split too: left free, the planner gathers the ids instead (256 B) and runs the lookup
# replicated, its output's one shared redistribution (fan-out) all-gathering 16 KiB of gradient in backward rather
# than all-reducing the 256 KiB weight gradient -- cheaper, but then that gradient has no all-reduce to defer
DP = (
    ("input_ids", ("S(0)",)),
    ("model.embed_tokens", ((1, 1), (2, 1))),
    ("*_proj", ((2, 1, 1), (1, 1))),
    ("lm_head", ((2, 1, 1), (1, 1))),
)
PLANS = {"dp": DP, "megatron": tuple(LLAMA_MEGATRON.items())}


def _batches() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(5)
    return [torch.randint(0, 512, (4, 8), generator=gen) for _ in range(STEPS)]


def _reference() -> dict[str, torch.Tensor]:
    reference = copy.deepcopy(model("llama").model)
    opt = torch.optim.AdamW(reference.parameters(), lr=1e-2, weight_decay=0.1)
    for ids in _batches():
        opt.zero_grad()
        reference(ids).logits.square().mean().backward()
        opt.step()
    return {k: v.detach().clone() for k, v in reference.state_dict().items()}


Trained = tuple[dict[str, torch.Tensor], dict[str, int], int, int, int, int, int]


def _train(kind: str, stage: Literal[1, 2, 3], overlap: bool) -> Trained:
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # a deprecated collective fails the rank
        return _train_steps(kind, stage, overlap)


def _train_steps(kind: str, stage: Literal[1, 2, 3], overlap: bool) -> Trained:
    m, p = model("llama"), plan("llama", 2, None, PLANS[kind])
    module = parallelize(m.model, p, m.args, captured=m.captured, record=True)
    opt = ZeroOptimizer(
        module,
        torch.optim.AdamW,
        stage=stage,
        overlap=overlap,
        bucket_bytes=64 << 10,
        lr=1e-2,
        weight_decay=0.1,
    )
    for ids in _batches():
        opt.zero_grad()
        logits = module(*shard_inputs(p, ids))
        # the mean over the global logits: each rank's local sum over the global count
        loss = logits.square().sum() / (4 * 8 * 512)
        loss.backward()
        if stage == 2:
            assert all(q.grad is None for q, f, _ in opt.params if f.axes)  # freed during backward
        opt.step()
    log = parallel_info(module).comm.log or []
    counts: dict[str, int] = {}
    for rec in log:
        counts[f"{rec.phase}:{rec.kind}"] = counts.get(f"{rec.phase}:{rec.kind}", 0) + 1
    held = sum(f.chunk for _, f, _ in opt.params)
    buckets = len(opt.buckets.buckets) if opt.buckets is not None else 0
    listed = len(p.optimizer_gathers)  # ZeRO-1's gathers no deferred all-reduce pays (priced in the step)
    return full_state_dict(module), counts, opt.state_elements(), held, len(opt.deferred), buckets, listed


@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "stage", "overlap"), [("dp", 1, False), ("dp", 2, True), ("megatron", 2, False)]
)
def test_zero_matches_single_process_adamw(kind: str, stage: Literal[1, 2, 3], overlap: bool) -> None:
    plan("llama", 2, None, PLANS[kind])  # captured and planned here once: the forked ranks inherit both
    ranks = launch(_train, 2, kind, stage, overlap)
    reference = _reference()
    # Megatron keeps the residual stream Partial and all-reduces it after LLaMA's RMSNorm casts it to float32 (half
    # the bytes): the float64 model is then exact to float32 only, and AdamW divides each element by its own
    # gradient's scale, so an element with a near-zero gradient moves by up to lr times its relative error (seen:
    # 1.4e-5; with the RMSNorm computing in float64 every weight agrees to 1e-12)
    rtol, atol = (1e-5, 1e-4) if kind == "megatron" else (1e-9, 1e-12)
    for state, counts, state_elements, held, deferred, buckets, listed in ranks:
        for name, value in reference.items():
            torch.testing.assert_close(state[name], value, rtol=rtol, atol=atol, msg=name)
        assert state_elements == 2 * held  # AdamW's two moments, over this rank's chunks only
        if kind == "dp":  # every parameter is replicated: each rank's chunks are half the model
            assert held == sum(-(-v.numel() // 2) for v in reference.values() if v.is_floating_point())
        if kind == "dp":
            assert deferred == len(reference)  # every parameter's gradient all-reduce became a reduce-scatter
            assert counts.get("backward:all_reduce", 0) == 0
            if overlap:  # bucketed, issued during backward: fewer, larger reduce-scatters
                assert 1 < buckets < deferred
                assert counts["backward:reduce_scatter"] == STEPS * buckets
            else:
                assert counts["optimizer:reduce_scatter"] == STEPS * deferred
            assert counts["optimizer:all_gather"] == STEPS * deferred
        else:
            assert counts.get("optimizer:reduce_scatter", 0) == 0  # norm gradients are already whole: sliced
            assert listed > 0  # the norms' gathers: the plan lists them apart from the deferred all-reduces
        # one gather per replicated parameter (1-D mesh): half of a deferred all-reduce, or listed by the plan
        assert counts["optimizer:all_gather"] == STEPS * (deferred + listed)


def test_zero3_refuses_a_replicated_plan() -> None:
    m, p = model("llama"), plan("llama", 2, None, DP)

    def work() -> str:
        module = parallelize(m.model, p, m.args, captured=m.captured)
        try:
            ZeroOptimizer(module, torch.optim.AdamW, stage=3, lr=1e-2)
        except ZeroError as e:
            return str(e)
        return ""

    import autoshard.runtime.zero as zero

    saved = zero.STAGE3_MAX_REPLICATED
    zero.STAGE3_MAX_REPLICATED = 1000  # the tiny model's matrices count as large here
    try:
        messages: list[Any] = launch(work, 2)
    finally:
        zero.STAGE3_MAX_REPLICATED = saved
    assert all("plan FSDP" in msg and "\n" not in msg for msg in messages)


def _train_fsdp() -> tuple[dict[str, torch.Tensor], dict[str, int], int]:
    from autoshard.runtime.reshard import reshard_after_forward

    m, p = model("llama"), plan("llama", 2, None, LLAMA_FSDP)
    module = parallelize(m.model, p, m.args, captured=m.captured, record=True)
    warnings.simplefilter("error", FutureWarning)  # this forked rank only: a deprecated collective fails it
    rewired = reshard_after_forward(module)
    opt = ZeroOptimizer(module, torch.optim.AdamW, stage=3, lr=1e-2, weight_decay=0.1)
    for ids in _batches():
        opt.zero_grad()
        (module(*shard_inputs(p, ids)).square().sum() / (4 * 8 * 512)).backward()
        opt.step()
    counts: dict[str, int] = {}
    for rec in parallel_info(module).comm.log or []:
        counts[f"{rec.phase}:{rec.kind}"] = counts.get(f"{rec.phase}:{rec.kind}", 0) + 1
    return full_state_dict(module), counts, rewired


@pytest.mark.slow
def test_zero3_fsdp_plan_reshards_after_forward_and_matches() -> None:
    plan("llama", 2, None, LLAMA_FSDP)  # captured and planned here once: the forked ranks inherit both
    ranks = launch(_train_fsdp, 2)
    reference = _reference()
    for state, counts, rewired in ranks:
        for name, value in reference.items():
            torch.testing.assert_close(state[name], value, rtol=1e-9, atol=1e-12, msg=name)
        assert rewired == 15  # 7 projections x 2 layers + the LM head
        assert counts["forward:all_gather"] >= rewired * STEPS
        assert counts["regather:all_gather"] == rewired * STEPS  # each gathered weight re-gathered once
        assert counts["backward:reduce_scatter"] >= (rewired - 1) * STEPS  # the sharded gradients
