"""Ring attention under the amp recipe: autocast runs attention in bf16, so the ring's K/V blocks travel in bf16
whatever the captured dtype.  The plan prices and lists that (``Plan.ring_transfers``), the emitted ring sends it
under ``torch.autocast`` on 2 gloo ranks, and verify (the model's own dtype, no autocast) counts the same hops.

A tiny causal grouped-query LLaMA: 8 query heads over 2 K/V heads of dim 4, 32 tokens on a ring of 2.  By hand,
one forward hop of a device is its K and V: 2 K/V heads x 16 tokens x 4 = 128 elements each, 256 in all; a
backward hop adds dK and dV: 512.  Per step: 2 layers x 1 forward hop, 2 layers x 2 backward hops.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch
import transformers

import autoshard
from autoshard.codegen import gather_outputs, parallel_info, parallelize, shard_inputs
from autoshard.errors import PlanFileError
from autoshard.plan_check import check_data
from autoshard.runtime.launch import launch
from autoshard.runtime.verify import cluster_for

HEADS, KV, HIDDEN, SEQ, RANKS = 8, 2, 32, 32, 2
ELEMENTS = 2 * KV * (SEQ // RANKS) * (HIDDEN // HEADS)  # one forward hop: K and V of this device
PINS = {"model.layers.*.self_attn": "ring", "input_ids": ("S(1)",)}


def _llama(dtype: torch.dtype) -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=2, num_attention_heads=HEADS,
        num_key_value_heads=KV, vocab_size=128, max_position_embeddings=64, use_cache=False,
        attn_implementation="sdpa", bos_token_id=0, eos_token_id=127,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config).to(dtype).eval()
    return model, torch.randint(0, 128, (1, SEQ), generator=torch.Generator().manual_seed(1))


def _hops(plan: autoshard.Plan) -> set[tuple[str, int, int, int]]:
    return {(r.phase, r.hops, r.nbytes, r.itemsize) for r in plan.ring_transfers}


@pytest.mark.parametrize(
    ("dtype", "precision", "itemsize"),
    [
        (torch.float32, "bf16", 4),  # the model's own dtype: fp32 K/V
        (torch.float32, "amp", 2),  # autocast casts attention's operands to bf16 before the ring
        (torch.bfloat16, "bf16", 2),
        (torch.bfloat16, "amp", 2),
    ],
)
def test_ring_hops_are_priced_in_the_dtype_attention_runs_in(
    dtype: torch.dtype, precision: str, itemsize: int
) -> None:
    model, ids = _llama(dtype)
    cluster = cluster_for("h100x8", RANKS)  # a profile with bf16 peaks
    plan = autoshard.plan(model, cluster, (ids,), annotations=PINS, cp_layout="zigzag", precision=precision)  # type: ignore[arg-type]
    assert plan.degrees == {"cp": RANKS}
    block = ELEMENTS * itemsize  # 1024 B in fp32, 512 B in bf16
    assert _hops(plan) == {("forward", 2, block, itemsize), ("backward", 4, 2 * block, itemsize)}


@pytest.fixture(scope="module")
def amp_plan() -> tuple[torch.nn.Module, torch.Tensor, autoshard.Plan]:
    model, ids = _llama(torch.float32)
    plan = autoshard.plan(
        model, cluster_for("cpu", RANKS), (ids,), annotations=PINS, cp_layout="zigzag", precision="amp"
    )
    assert _hops(plan) == {("forward", 2, 2 * ELEMENTS, 2), ("backward", 4, 4 * ELEMENTS, 2)}
    return model, ids, plan


@pytest.mark.slow
def test_the_emitted_ring_sends_bf16_blocks_under_autocast(
    amp_plan: tuple[torch.nn.Module, torch.Tensor, autoshard.Plan],
) -> None:
    model, ids, plan = amp_plan
    with torch.autocast("cpu", dtype=torch.bfloat16):
        reference = model(ids).logits.float()

    def work() -> tuple[list[tuple[str, int, int]], torch.Tensor]:
        module = parallelize(model, plan, (ids,), record=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = module(*shard_inputs(plan, ids))
            logits = logits[0] if isinstance(logits, tuple) else logits
        logits.float().sum().backward()
        hops = parallel_info(module).comm.hops or []
        return [(h.phase, h.nbytes, h.elements) for h in hops], gather_outputs(
            module, logits.detach()
        ).float()

    ranks = launch(work, RANKS)
    planned = Counter({(r.phase, r.nbytes): r.hops for r in plan.ring_transfers})
    for hops, _ in ranks:  # every rank sent exactly the listed hops, bf16 blocks: 2 bytes per element
        assert Counter((phase, nbytes) for phase, nbytes, _ in hops) == planned
        assert all(nbytes == 2 * elements for _, nbytes, elements in hops)
    torch.testing.assert_close(ranks[0][1], reference, atol=0.05, rtol=0.05)  # bf16 attention, both sides


@pytest.mark.slow
def test_verify_counts_the_amp_plans_hops_by_element(
    amp_plan: tuple[torch.nn.Module, torch.Tensor, autoshard.Plan],
) -> None:
    """verify runs fp32 without autocast, so its hops carry fp32: counted by elements, labelled as planned."""
    model, ids, plan = amp_plan
    report = autoshard.verify(model, (ids,), plan=plan)
    assert report.ok, str(report)
    assert report.ring_hops == {"backward 1.0 KiB on axis 0": 4, "forward 512 B on axis 0": 2}


def test_a_ring_transfers_itemsize_is_checked_when_a_plan_loads(
    amp_plan: tuple[torch.nn.Module, torch.Tensor, autoshard.Plan],
) -> None:
    data = json.loads(json.dumps(amp_plan[2].to_json()))  # as a file reads back
    check_data(data, "plan.json")  # as written
    data["ring_transfers"][0]["itemsize"] = 3
    with pytest.raises(
        PlanFileError, match=r"^plan.json: .*ring_transfers\[0\]\.itemsize.*3 is not 0, 1, 2, 4 or 8"
    ):
        check_data(data, "plan.json")
    del data["ring_transfers"][0]["itemsize"]  # an older file: counted by bytes
    check_data(data, "plan.json")
