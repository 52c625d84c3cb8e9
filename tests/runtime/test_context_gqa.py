"""Ring attention of a grouped-query LLaMA (8 query heads over 2 K/V heads, HF's own ``repeat_kv`` and causal
mask) on 4 gloo ranks: K and V travel un-expanded, a quarter of the copies' bytes; the plan prices and lists
exactly what gloo sent; verify counts every rank's hops against the plan and refuses a plan that lists others."""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import autoshard
from autoshard.codegen.collectives import RingHop
from autoshard.errors import VerifyError
from autoshard.runtime.ring_check import check_ring_hops
from autoshard.runtime.verify import cluster_for

HEADS, KV, HIDDEN, SEQ, RANKS = 8, 2, 32, 32, 4


def _gqa_llama() -> tuple[torch.nn.Module, torch.Tensor]:
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=2, num_attention_heads=HEADS,
        num_key_value_heads=KV, vocab_size=128, max_position_embeddings=64, use_cache=False,
        attn_implementation="sdpa", bos_token_id=0, eos_token_id=127,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config).double().eval()
    return model, torch.randint(0, 128, (1, SEQ), generator=torch.Generator().manual_seed(1))


def _count_p2p(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every batch of point-to-point ops any (forked) rank hands gloo: one line with the bytes it sends."""
    real = dist.batch_isend_irecv

    def counted(ops):  # type: ignore[no-untyped-def]
        sent = sum(op.tensor.numel() * op.tensor.element_size() for op in ops if op.op is dist.isend)
        with path.open("a") as f:
            f.write(f"{sent}\n")
        return real(ops)

    monkeypatch.setattr(dist, "batch_isend_irecv", counted)


@pytest.fixture(scope="module")
def gqa_plan() -> tuple[torch.nn.Module, torch.Tensor, autoshard.Plan]:
    model, ids = _gqa_llama()
    pins = {"model.layers.*.self_attn": "ring", "input_ids": ("S(1)",)}
    plan = autoshard.plan(model, cluster_for("cpu", RANKS), (ids,), annotations=pins, cp_layout="zigzag")
    assert plan.degrees == {"cp": RANKS} and plan.context_layout == "zigzag"
    return model, ids, plan


@pytest.mark.slow
def test_gqa_ring_sends_un_expanded_kv_and_matches_one_device(
    gqa_plan: tuple[torch.nn.Module, torch.Tensor, autoshard.Plan],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model, ids, plan = gqa_plan
    # one forward hop: this rank's K and V, 2 K/V heads of a quarter of the sequence in float64 (not the 8 copies)
    head_dim = HIDDEN // HEADS
    block = 2 * KV * (SEQ // RANKS) * head_dim * 8
    assert {(r.phase, r.nbytes) for r in plan.ring_transfers} == {("forward", block), ("backward", 2 * block)}
    path = tmp_path / "p2p"
    _count_p2p(path, monkeypatch)
    report = autoshard.verify(model, (ids,), plan=plan)
    assert report.ok, str(report)  # outputs and every gradient against one device, float64
    sent = Counter(int(line) for line in path.read_text().splitlines())
    # 2 layers x 4 ranks x (3 hops forward + 4 backward), each of the un-expanded size the plan prices
    assert sent == {block: 2 * RANKS * (RANKS - 1), 2 * block: 2 * RANKS * RANKS}
    assert block == 1024  # and the report says per device what ran: 2 layers x 3 forward, 2 x 4 backward
    assert report.ring_hops == {"backward 2.0 KiB on axis 0": 8, "forward 1.0 KiB on axis 0": 6}
    assert "ring K/V hops per device and step: backward 2.0 KiB on axis 0 x8" in str(report)


@pytest.mark.slow
def test_verify_refuses_a_plan_listing_other_ring_hops_in_one_line(
    gqa_plan: tuple[torch.nn.Module, torch.Tensor, autoshard.Plan],
) -> None:
    model, ids, plan = gqa_plan
    tampered = tuple(
        dataclasses.replace(r, hops=r.hops + 1) if r.phase == "forward" else r for r in plan.ring_transfers
    )
    with pytest.raises(VerifyError) as caught:
        autoshard.verify(model, (ids,), plan=dataclasses.replace(plan, ring_transfers=tampered))
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("verify: rank 0 sent 6 ring K/V hops of forward 1.0 KiB on axis 0 in one step")
    assert "where the plan lists 7" in message and "re-plan it" in message


@pytest.mark.slow  # the plan fixture
def test_a_listing_of_the_expanded_copies_is_caught_per_rank(
    gqa_plan: tuple[torch.nn.Module, torch.Tensor, autoshard.Plan],
) -> None:
    """What the plan listed before grouped-query K/V travelled un-expanded: 4x the bytes per hop."""
    _, _, plan = gqa_plan
    ran = [RingHop(r.phase, r.mesh_axis, r.nbytes, 2) for r in plan.ring_transfers for _ in range(r.hops)]
    assert check_ring_hops(plan, [ran] * RANKS)
    old = tuple(dataclasses.replace(r, nbytes=r.nbytes * HEADS // KV) for r in plan.ring_transfers)
    with pytest.raises(VerifyError, match=r"rank 0 sent 8 ring K/V hops of backward 2.0 KiB .* plan lists 0"):
        check_ring_hops(dataclasses.replace(plan, ring_transfers=old), [ran] * RANKS)


@pytest.mark.slow
@pytest.mark.parametrize(("recompute", "runs"), [("selective", 1), ("full", 2)])
def test_recomputation_runs_the_ring_as_priced_and_listed(recompute: str, runs: int) -> None:
    """Selective recomputation keeps the ring's output (a matmul-like op: priced kept); full recomputation
    runs its forward hops again in backward, priced and listed.  verify counts them either way."""
    model, ids = _gqa_llama()
    pins = {"model.layers.*.self_attn": "ring", "input_ids": ("S(1)",)}
    cluster = cluster_for("cpu", 2)
    plan = autoshard.plan(model, cluster, (ids,), annotations=pins, cp_layout="zigzag", recompute=recompute)  # type: ignore[arg-type]
    assert plan.recompute == recompute
    report = autoshard.verify(model, (ids,), plan=plan)
    assert report.ok, str(report)
    forward = [r for r in plan.ring_transfers if r.phase == "forward"]
    assert sum(r.hops for r in forward) == 2 * 1 * runs  # 2 layers x 1 hop on 2 ranks, once or twice


@pytest.mark.slow
def test_a_pipelined_ring_verifies_as_deployed_with_its_hops_counted() -> None:
    """2 stages x CP 2 through torch.distributed.pipelining: the ring's own sends are not the stages' p2p
    (they were counted as such, and the check failed), and all ranks together sent the plan's hops per stage."""
    from autoshard.runtime.verify_pipeline import verify_pipelined

    model, ids = _gqa_llama()
    ids = torch.cat([ids, ids.roll(1, 1)])  # 2 microbatches of 1
    pins = {"model.layers.*.self_attn": "ring"}
    plan = autoshard.plan(
        model, cluster_for("cpu", 4), (ids,), annotations=pins, pipeline=2, microbatches=2, schedule="1f1b"
    )
    assert plan.degrees == {"pp": 2, "cp": 2}
    report = verify_pipelined(plan, model, ids)
    assert report.ok, str(report)
    assert report.emitted["p2p send"] == report.planned["p2p send"] == 2 * 2 * 1 * 2
    # per CP rank of one stage row: 2 layers x 2 microbatches x (1 hop forward, 2 backward)
    assert report.ring_hops == {"backward 4.0 KiB": 8, "forward 2.0 KiB": 4}  # 16 tokens of 2 K/V heads
