"""Pipeline stages run by torch.distributed.pipelining equal the single-device model, and really communicate.

A 4-layer tiny LLaMA (float64, untied embeddings) on 4 gloo ranks as 2 pipeline stages x 2 ranks, with tensor
parallelism inside each stage (Megatron, pinned) and separately data parallelism inside each stage; 4
microbatches; GPipe, 1F1B, interleaved 1F1B, interleaved zero bubble (4 stages, 2 per pipeline rank, loop
order) and ZB-V (4 stages in V order).  One launch per family runs
every schedule for three AdamW steps: the loss and every gradient after the first step and every weight after
the third equal the single-device model's; every activation and gradient crossing a stage boundary went
through an ``isend``/``irecv`` of the pipeline group (counted by wrapping c10d), and every stage module ran
its planned intra-stage collectives once per microbatch (the codegen's collective log), except data
parallel's gradient all-reduces, which run once per step.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
import torch.nn.functional as F
from torch import nn

import autoshard
from autoshard import zoo
from autoshard.codegen import parallel_info
from autoshard.codegen.collectives import parse_steps
from autoshard.codegen.shard import gather_full
from autoshard.plans import PipelinePlan, PipelineStage, Plan
from autoshard.runtime.launch import launch
from autoshard.runtime.pipelining import (
    PipelineRun,
    PipelineRunError,
    build_pipeline,
    full_state_dict,
    local_batch,
    step,
)
from autoshard.runtime.stages import StageBuild, intra_layout, prepare_stages
from autoshard.runtime.verify import cluster_for

BATCH, SEQ, VOCAB, MICRO, STEPS = 8, 8, 512, 4, 3
SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b", "interleaved_zb", "zb_v")
V_ROWS = (0, 1, 1, 0)  # zb_v: stages 0 and 3 on the first pipeline rank, 1 and 2 on the second
MEGATRON = {
    **{f"*.{m}": "column" for m in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")},
    **{f"*.{m}": "row" for m in ("o_proj", "down_proj")},
    "lm_head": "column",  # vocab-split logits: the last stage gathers them for the loss
}
BATCH_SPLIT = ((2, 1, 1), (1, 1))  # a linear on (B, S, H): batch over the 2 ranks, weight whole
DATA_PARALLEL = {"input_ids": ("S(0)",), "*_proj": BATCH_SPLIT, "lm_head": BATCH_SPLIT}
FAMILIES: dict[str, dict[str, Any]] = {"tp": MEGATRON, "dp": DATA_PARALLEL}
TWO = (
    ("model.embed_tokens", "model.layers.0", "model.layers.1"),
    ("model.layers.2", "model.layers.3", "model.norm", "lm_head"),
)
FOUR = (
    ("model.embed_tokens", "model.layers.0"),
    ("model.layers.1",),
    ("model.layers.2",),
    ("model.layers.3", "model.norm", "lm_head"),
)


def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten())


@functools.cache
def _model() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    case = zoo.build("llama-tiny", batch=BATCH, seq=SEQ, layers=4)
    return case.model.to(torch.float64), case.args[0]


@functools.cache
def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(1)
    draw = lambda: torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen)  # noqa: E731
    return [(draw(), draw()) for _ in range(STEPS)]


@functools.cache
def _intra_plan(family: str) -> Plan:
    """The intra-op plan of one stage's 2 ranks (what the stage search would fill in per stage)."""
    model, ids = _model()
    return autoshard.plan(model, cluster_for("cpu", 2), (ids,), annotations=FAMILIES[family])


def _with_pipeline(plan: Plan, schedule: str) -> Plan:
    """``plan`` (on one stage's 2 ranks) with 2 or 4 stages on 4 ranks.

    The TP family gets the record as the planner fills it: the mesh gains the pipeline axis first, every
    placement an ``R`` for it, and the first stage names the rotary embedding (a module without parameters,
    which every stage keeps).  The DP family keeps the stage's own mesh (an intra-op plan given a pipeline).
    """
    groups = TWO if schedule in ("gpipe", "1f1b") else FOUR
    virtual = len(groups) // 2
    rows = V_ROWS if schedule == "zb_v" else tuple(i % 2 for i in range(len(groups)))
    widen = plan.param_placements["model.layers.0.self_attn.q_proj.weight"] == ("S(0)",)  # the TP family
    if widen:
        groups = (("model.rotary_emb", *groups[0]), *groups[1:])
    stages = tuple(PipelineStage(i, mods, None, ((0, 1), (2, 3))[rows[i]]) for i, mods in enumerate(groups))
    pipeline = PipelinePlan(stages, schedule, virtual)
    if not widen:
        return dataclasses.replace(plan, pipeline=pipeline, microbatches=MICRO)
    return dataclasses.replace(
        plan,
        mesh_shape=(2, *plan.mesh_shape),
        param_placements={k: ("R", *v) for k, v in plan.param_placements.items()},
        input_placements={k: ("R", *v) for k, v in plan.input_placements.items()},
        output_placements=tuple(("R", *v) for v in plan.output_placements),
        pipeline=pipeline,
        microbatches=MICRO,
    )


@functools.cache
def _stages(family: str, schedule: str) -> tuple[StageBuild, ...]:
    model, ids = _model()
    plan = _with_pipeline(_intra_plan(family), schedule)
    if schedule in ("1f1b", "interleaved_1f1b"):
        return prepare_stages(model, plan, (ids,), FAMILIES[family])
    # the same cut as another schedule's, on other ranks: reuse its modules and plans
    base = _stages(family, "1f1b" if schedule == "gpipe" else "interleaved_1f1b")
    assert plan.pipeline is not None
    return tuple(
        dataclasses.replace(b, ranks=s.ranks) for b, s in zip(base, plan.pipeline.stages, strict=True)
    )


@contextmanager
def _count_p2p(log: list[tuple[str, tuple[int, ...], torch.dtype]]) -> Iterator[None]:
    """Record every point-to-point op that reaches c10d (what the schedules' batched sends/recvs run)."""
    originals = {name: getattr(c10d, name) for name in ("isend", "irecv")}

    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def recorded(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            log.append((name, tuple(tensor.shape), tensor.dtype))
            return fn(tensor, *args, **kwargs)

        return recorded

    for name, fn in originals.items():
        setattr(c10d, name, wrap(name, fn))
        setattr(dist, name, getattr(c10d, name))
    try:
        yield
    finally:
        for name, fn in originals.items():
            setattr(c10d, name, fn)
            setattr(dist, name, fn)


def _whole(run: PipelineRun, what: Callable[[nn.Parameter], Any]) -> dict[str, torch.Tensor]:
    """Every parameter of this rank's stages, whole (gathered over the stage's own ranks only)."""
    out = {}
    for module in run.modules:
        info = parallel_info(module)
        for attr in info.attrs:
            if attr.kind == "parameter":
                local = what(module.get_parameter(attr.fqn))
                out[attr.fqn] = gather_full(local, attr.spec, attr.global_shape, info.comm)
    return out


def _family(family: str) -> dict[str, dict[str, Any]]:
    """On every rank: each schedule for STEPS AdamW steps; what to compare and what ran.  Then a plan torch's
    1F1B refuses (fewer microbatches than stages)."""
    model, ids = _model()
    results: dict[str, dict[str, Any]] = {}
    for schedule in SCHEDULES:
        plan = _with_pipeline(_intra_plan(family), schedule)
        stages = _stages(family, schedule)
        p2p: list[tuple[str, tuple[int, ...], torch.dtype]] = []
        run = build_pipeline(model, plan, (ids,), loss_fn, stages=stages, record=True)
        opt = torch.optim.AdamW(run.parameters(), lr=1e-2)
        losses: list[torch.Tensor | None] = []
        grads: dict[str, torch.Tensor] = {}
        for i, (inputs, labels) in enumerate(_batches()):
            opt.zero_grad()
            with _count_p2p(p2p):
                losses.append(step(run, inputs, labels))
            logs = [
                [r for r in parallel_info(m).comm.log or () if r.phase in ("forward", "backward")]
                for m in run.modules
            ]
            if i == 0:
                grads = _whole(run, lambda p: p.grad)
            opt.step()
        # the planned collectives of each stage graph, plus the gather of the logits for the loss
        gather = Counter(str(st.kind) for st in parse_steps(run.loss_steps) if st.is_collective)
        per_step = [
            Counter(parallel_info(m).collective_counts()) + (gather if i == plan_last(plan) else Counter())
            for m, i in zip(run.modules, run.stage_indices, strict=True)
        ]
        results[schedule] = {
            "stages": run.stage_indices,
            "losses": losses,
            "grads": grads,
            "weights": full_state_dict(run),  # the whole model on every rank
            "p2p": p2p,
            "ran": [Counter(str(r.kind) for r in log) for log in logs],
            "planned": [{str(k): n for k, n in c.items()} for c in per_step],
            "gather": run.loss_steps,
            # gradient all-reduces taken out of the backward: once per step instead of once per microbatch
            "deferred": [
                sum(st.is_collective for d in ds for st in parse_steps(d.steps)) for ds in run.deferred
            ],
        }
    few = dataclasses.replace(_with_pipeline(_intra_plan(family), "1f1b"), microbatches=1)
    with pytest.raises(PipelineRunError) as refused:
        build_pipeline(model, few, (ids,), loss_fn, stages=_stages(family, "1f1b"))
    results["refused"] = {"error": str(refused.value)}
    return results


def plan_last(plan: Plan) -> int:
    assert plan.pipeline is not None
    return len(plan.pipeline.stages) - 1


def _single_device() -> tuple[list[torch.Tensor], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    model = copy.deepcopy(_model()[0])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses: list[torch.Tensor] = []
    grads: dict[str, torch.Tensor] = {}
    for i, (inputs, labels) in enumerate(_batches()):
        opt.zero_grad()
        loss = loss_fn(model(inputs).logits, labels)
        loss.backward()
        losses.append(loss.detach())
        if i == 0:
            grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
        opt.step()
    return losses, grads, {k: p.detach().clone() for k, p in model.named_parameters()}


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_pipeline_equals_single_device(family: str) -> None:
    for schedule in SCHEDULES:
        _stages(family, schedule)  # planned once here; forked ranks inherit them
    ranks = launch(_family, 4, family, timeout=300)
    for result in ranks:
        error = result["refused"]["error"]
        assert (
            error.startswith("torch's Schedule1F1B refuses 1 microbatches over 2 stages")
            and "\n" not in error
        )
    ref_losses, ref_grads, ref_weights = _single_device()
    local_rows = BATCH // MICRO // (2 if family == "dp" else 1)
    activation = (local_rows, SEQ, 64)
    for schedule in SCHEDULES:
        grads: dict[str, torch.Tensor] = {}
        weights: dict[str, torch.Tensor] = {}
        n_stages = 2 if schedule in ("gpipe", "1f1b") else 4
        for rank, result in enumerate(ranks):
            r = result[schedule]
            grads.update(r["grads"])
            assert sorted(r["weights"]) == sorted(ref_weights)  # every rank gets the whole model
            weights.update(r["weights"])
            last = n_stages - 1 in r["stages"]
            for got, want in zip(r["losses"], ref_losses, strict=True):
                assert (got is not None) == last
                if last:
                    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
            # p2p: per step and microbatch, one activation out of every non-last stage and one gradient out of
            # every non-first stage of this rank whose neighbour is on the other pipeline rank; as many received;
            # all of the boundary activation's local shape
            rows = V_ROWS if schedule == "zb_v" else [s % 2 for s in range(n_stages)]
            crossings = sum(
                rows[s] != rows[t] for s in r["stages"] for t in (s - 1, s + 1) if 0 <= t < n_stages
            )
            sends = crossings * MICRO * STEPS
            moved = Counter(kind for kind, shape, dtype in r["p2p"] if dtype == torch.float64)
            assert moved == {"isend": sends, "irecv": sends}, (schedule, rank, moved)
            assert {shape for _, shape, dtype in r["p2p"] if dtype == torch.float64} == {activation}
            # intra-stage: every planned collective once per microbatch and step, and there are some
            if family == "tp" and last:
                assert r["gather"].startswith("all_gather(axis=0, dim=2"), r["gather"]
            assert (min(r["deferred"]) > 0) == (family == "dp"), r["deferred"]  # DP's gradient all-reduces
            for ran, planned, once in zip(r["ran"], r["planned"], r["deferred"], strict=True):
                expected = Counter({k: n * MICRO * STEPS for k, n in planned.items()})
                expected["all_reduce"] -= once * (MICRO - 1) * STEPS
                assert planned and ran == +expected, (schedule, rank, ran, expected)
        assert sorted(grads) == sorted(ref_grads) == sorted(weights)
        for name, want in ref_grads.items():
            torch.testing.assert_close(grads[name], want, rtol=0, atol=1e-12, msg=f"{schedule}: grad {name}")
        for name, want in ref_weights.items():
            torch.testing.assert_close(weights[name], want, rtol=0, atol=1e-12, msg=f"{schedule}: {name}")


# -- bad input: one line, before any process group is needed -------------------------------------------------
def _plan_with(
    schedule: str = "1f1b", modules: tuple[tuple[str, ...], ...] = TWO, micro: int = MICRO
) -> Plan:
    plan = _with_pipeline(_intra_plan("tp"), "1f1b")
    assert plan.pipeline is not None
    stages = tuple(
        dataclasses.replace(s, modules=m) for s, m in zip(plan.pipeline.stages, modules, strict=True)
    )
    return dataclasses.replace(
        plan,
        pipeline=dataclasses.replace(plan.pipeline, stages=stages, schedule=schedule),
        microbatches=micro,
    )


@pytest.mark.parametrize(
    ("plan", "match"),
    [
        (lambda: dataclasses.replace(_intra_plan("tp"), pipeline=None), "no pipeline stages"),
        (
            lambda: _plan_with(
                modules=(
                    ("model.embed_tokens", "model.layers.0", "model.layers.1"),
                    ("model.layers.9", "model.norm", "lm_head"),
                )
            ),
            "names module 'model.layers.9'",
        ),
        (
            lambda: _plan_with(
                modules=(
                    ("model.embed_tokens", "model.layers.0"),
                    ("model.layers.2", "model.layers.3", "model.norm", "lm_head"),
                )
            ),
            "model.layers.1.* belongs to no pipeline stage",
        ),
        (lambda: _plan_with(micro=3), "3 microbatches do not divide the batch of 8"),
        (lambda: _plan_with(schedule="zigzag"), "unknown pipeline schedule 'zigzag'"),
    ],
    ids=["no-pipeline", "unknown-module", "uncovered-parameter", "microbatches", "schedule"],
)
def test_bad_pipeline_input_is_one_line(plan: Callable[[], Plan], match: str) -> None:
    model, ids = _model()
    with pytest.raises(PipelineRunError, match=match) as err:
        build_pipeline(model, plan(), (ids,), loss_fn)
    assert "\n" not in str(err.value)


def test_local_batch_cuts_microbatches_before_ranks() -> None:
    from autoshard.placement import ShardingSpec

    rows = torch.arange(8).unsqueeze(1)
    split = ShardingSpec.parse(("S(0)",))
    # microbatches {0..3}, {4..7}; rank 1 holds the second half of each
    assert local_batch(rows, split, 2, (2,), (1,)).flatten().tolist() == [2, 3, 6, 7]
    with pytest.raises(PipelineRunError, match="3 microbatches do not divide the batch of 8"):
        local_batch(rows, split, 3, (2,), (0,))


def test_intra_layout_reads_both_records() -> None:
    # the planner's record (pipeline axis first in the mesh) and an intra-op plan given a pipeline afterwards
    assert intra_layout(_with_pipeline(_intra_plan("tp"), "1f1b")) == ((2,), 0)
    assert intra_layout(_with_pipeline(_intra_plan("dp"), "1f1b")) == ((2,), None)
    odd = dataclasses.replace(_with_pipeline(_intra_plan("tp"), "1f1b"), mesh_shape=(4, 2))
    with pytest.raises(PipelineRunError, match=r"plan mesh \(4, 2\) fits neither one stage"):
        intra_layout(odd)


class _Doubler(nn.Module):
    """Reads its embedding as more than a pass-through (``embed(x) * 2``): cut into stages, stage 1 would
    double the hidden states it receives."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(16, 8)
        self.layers = nn.ModuleList([nn.Linear(8, 8), nn.Linear(8, 8)])
        self.head = nn.Linear(8, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x) * 2.0
        for layer in self.layers:
            h = layer(h)
        return self.head(h)


def test_stages_that_do_not_compute_the_model_are_refused() -> None:
    plan = _with_pipeline(_intra_plan("dp"), "1f1b")
    assert plan.pipeline is not None
    cut = (("embed", "layers.0"), ("layers.1", "head"))
    stages = tuple(dataclasses.replace(s, modules=m) for s, m in zip(plan.pipeline.stages, cut, strict=True))
    plan = dataclasses.replace(plan, pipeline=dataclasses.replace(plan.pipeline, stages=stages))
    with pytest.raises(PipelineRunError, match="the stages of _Doubler chained do not compute the model"):
        prepare_stages(_Doubler(), plan, (torch.randint(0, 16, (8, 4)),))
