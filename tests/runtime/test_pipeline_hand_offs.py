"""A hand-off between two stages on the same pipeline rank is no p2p send: ZB-V's V puts stages ``p - 1`` and
``p`` on the last rank, and torch hands the activations (and gradients) over in memory.  Verify expected a
send at every cut (24 where 16 ran on 2 stages x CP 2) and the pricing charged the turning rank two sends a
microbatch too many; both now count by :func:`~autoshard.pipeline.schedules.hand_offs`, whose stage-to-rank
map is torch's own.

1. The map is torch's (``generate_stage_to_rank_mapping``) for every schedule and size.
2. The pricing charges the turn no p2p time (ZB-V), and every cut of a looped schedule.
3. On 2 gloo ranks, LLaMA with 4 one-layer chunks: ZB-V runs 2 sends per microbatch and cut that crosses
   ranks (8), interleaved 1F1B (stage ``i`` and ``i + 1`` always on different ranks) 12, each as verify
   expects; a verify expecting a send at the turn (the old rule) reports the mismatch in one line; and the
   case found, 2 stages x CP 2 on 4 ranks under ZB-V, verifies its 16 sends.
"""

from __future__ import annotations

import functools
import re

import pytest
import torch
from torch.distributed.pipelining.schedules import generate_stage_to_rank_mapping

import autoshard
from autoshard import zoo
from autoshard.errors import VerifyError
from autoshard.pipeline.schedules import Schedule, chunk_sends, device_of_chunk, hand_offs
from autoshard.pipeline.stages import Part, StageCosts, price_split
from autoshard.plans import Plan
from autoshard.runtime import verify_pipeline
from autoshard.runtime.verdict import VerifyReport
from autoshard.runtime.verify import cluster_for


@pytest.mark.parametrize("schedule", list(Schedule))
@pytest.mark.parametrize(("degree", "virtual"), [(2, 1), (2, 2), (4, 2), (3, 2), (4, 3)])
def test_the_stage_to_rank_map_is_torchs(schedule: Schedule, degree: int, virtual: int) -> None:
    chunks = degree * virtual
    style = "v" if schedule is Schedule.ZB_V else "loop"
    if style == "v" and virtual != 2:
        return
    torch_map = generate_stage_to_rank_mapping(degree, chunks, style)
    assert {c: device_of_chunk(schedule, c, degree) for c in range(chunks)} == torch_map
    local = [c for c, crosses in enumerate(hand_offs(schedule, chunks, degree)) if not crosses]
    assert local == ([degree - 1] if style == "v" else [])  # only ZB-V's turn, stages p - 1 and p


def test_the_turn_of_the_v_is_not_priced_as_a_send() -> None:
    costs = StageCosts(Part(forward=1.0, backward=2.0), Part(), Part(), 4, p2p_seconds=0.5)
    assert chunk_sends(Schedule.ZB_V, 1, 4, 2) == (False, True)  # activations to chunk 2 on its own rank
    assert chunk_sends(Schedule.ZB_V, 2, 4, 2) == (True, False)
    v = price_split(costs, (0, 1, 2, 3, 4), Schedule.ZB_V, 2, 2, 4)
    # rank 0 holds chunks 0 and 3 (one send each way), rank 1 chunks 1 and 2 (one send each way, not two)
    assert v.forward == (2 * 1.0 + 0.5, 2 * 1.0 + 0.5)
    assert v.backward == (2 * 2.0 + 0.5, 2 * 2.0 + 0.5)
    looped = price_split(costs, (0, 1, 2, 3, 4), Schedule.INTERLEAVED_1F1B, 2, 2, 4)
    assert looped.forward == (2.0 + 2 * 0.5, 2.0 + 0.5) and looped.backward == (4.0 + 0.5, 4.0 + 2 * 0.5)


@functools.cache
def _planned(schedule: str) -> tuple[torch.nn.Module, torch.Tensor, Plan]:
    torch.manual_seed(0)
    case = zoo.build("llama-tiny", batch=4, seq=8, layers=4)
    model, ids = case.model.to(torch.float64), case.args[0]
    plan = autoshard.plan(model, cluster_for("cpu", 2), (ids,), pipeline=2, microbatches=2, schedule=schedule)
    assert plan.pipeline is not None and len(plan.pipeline.stages) == 4  # one layer a chunk, 2 a rank
    return model, ids, plan


def _verify(schedule: str, tamper: pytest.MonkeyPatch | None = None) -> VerifyReport:
    model, ids, plan = _planned(schedule)
    if tamper is not None:  # the old rule: every cut a send
        tamper.setattr(verify_pipeline, "hand_offs", lambda s, chunks, degree: (True,) * (chunks - 1))
    return verify_pipeline.verify_pipelined(plan, model, ids)


def test_the_drawing_shows_the_turn_as_local() -> None:
    from autoshard.report.dot import to_dot

    text = to_dot(_planned("zb_v")[2])
    edges = [line for line in text.splitlines() if re.search(r"stage\d -> stage\d", line)]
    assert len(edges) == 3 and sum("local" in e for e in edges) == 1 and "stage1 -> stage2" in edges[1]
    assert "local" in edges[1] and "p2p" in edges[0] and "p2p" in edges[2]


@pytest.mark.slow
@pytest.mark.parametrize(("schedule", "sends"), [("zb_v", 2 * 2 * 2), ("interleaved_1f1b", 2 * 2 * 3)])
def test_verify_counts_the_sends_that_cross_ranks(schedule: str, sends: int) -> None:
    """2 microbatches x 2 directions x the cuts between ranks (ZB-V 2 of 3, interleaved 3 of 3), as counted
    on the ranks' ``isend`` s."""
    report = _verify(schedule)
    assert report.ok, str(report)
    assert report.emitted["p2p send"] == report.planned["p2p send"] == sends


@pytest.mark.slow
def test_a_verify_expecting_a_send_at_the_turn_reports_the_mismatch(monkeypatch: pytest.MonkeyPatch) -> None:
    report = _verify("zb_v", monkeypatch)
    assert not report.ok and report.verdict == "MISMATCH"
    assert report.emitted["p2p send"] == 8 and report.planned["p2p send"] == 12
    line = next(x for x in str(report).splitlines() if x.startswith("collectives per step"))
    assert "p2p send x8 (plan: " in line and line.endswith("p2p send x12)")


def test_a_schedule_that_ran_another_stage_map_is_refused_in_one_line() -> None:
    loop = {0: 0, 1: 1, 2: 0, 3: 1}  # what a looped schedule would have run for ZB-V's 4 stages
    with pytest.raises(
        VerifyError, match=r"^verify: torch's zb_v put stages on pipeline ranks .*device_of_chunk"
    ):
        verify_pipeline._cuts("zb_v", 4, 2, [{"ranks": loop}, {"ranks": None}])
    assert verify_pipeline._cuts("zb_v", 4, 2, [{"ranks": {0: 0, 1: 1, 2: 1, 3: 0}}]) == (True, False, True)


@pytest.mark.slow
def test_zb_v_with_a_ring_verifies_its_16_sends() -> None:
    """The case found: 2 stages x CP 2 on 4 ranks under ZB-V (a grouped-query LLaMA whose attention is pinned
    to the ring).  Verify expected 2 microbatches x 2 directions x 3 cuts x 2 ranks = 24 sends; 16 ran (the
    turn is local), and 16 are now expected; the ring's own hops are still checked apart."""
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(  # type: ignore[call-arg]  # HF takes attn_implementation as **kwargs
        hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
        vocab_size=128, max_position_embeddings=64, use_cache=False, attn_implementation="sdpa", bos_token_id=0,
        eos_token_id=127,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config).double().eval()
    ids = torch.randint(0, 128, (2, 32), generator=torch.Generator().manual_seed(1))
    pins = {"model.layers.*.self_attn": "ring"}
    plan = autoshard.plan(
        model, cluster_for("cpu", 4), (ids,), annotations=pins, pipeline=2, microbatches=2, schedule="zb_v"
    )
    assert plan.degrees == {"pp": 2, "cp": 2} and plan.pipeline is not None and len(plan.pipeline.stages) == 4
    report = verify_pipeline.verify_pipelined(plan, model, ids)
    assert report.ok, str(report)
    assert report.emitted["p2p send"] == report.planned["p2p send"] == 2 * 2 * 2 * 2
    assert sum(report.ring_hops.values()) > 0
