"""ZeRO-1 on a replicated plan: the all-gathers the runtime runs are the plan's ``optimizer_gathers``, and the
plan's step (and the solver's objective) pays them (problem/zero_terms.py)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from runtime_cases import model, plan
from torch.utils import _pytree as pytree

from autoshard.codegen import parallel_info, parallelize, shard_inputs
from autoshard.runtime.launch import launch
from autoshard.runtime.zero import ZeroOptimizer

STEPS = 2
# every tensor pinned replicated: each rank computes the whole MLP, no gradient is ever reduced
PINS = (
    ("x", ("R",)),
    ("fc1.weight", ("R",)),
    ("fc1.bias", ("R",)),
    ("fc2.weight", ("R",)),
    ("fc2.bias", ("R",)),
)


def _train() -> tuple[list[tuple[str, str, int, int]], int]:
    m, p = model("mlp"), plan("mlp", 2, None, PINS)
    module = parallelize(m.model, p, m.args, captured=m.captured, record=True)
    opt = ZeroOptimizer(module, torch.optim.AdamW, stage=1, lr=1e-2)
    for _ in range(STEPS):
        opt.zero_grad()
        module(*shard_inputs(p, *m.args)).square().sum().backward()
        opt.step()
    log = parallel_info(module).comm.log or []
    return [(r.phase, r.kind, r.mesh_axis, r.nbytes) for r in log], len(opt.deferred)


@pytest.mark.slow
def test_a_replicated_plan_runs_exactly_the_gathers_its_step_priced() -> None:
    p = plan("mlp", 2, None, PINS)
    assert set(p.param_placements.values()) == {("R",)} and not p.collectives
    gathers = p.optimizer_gathers
    assert {c.module for c in gathers} == {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}
    listed = Counter(("optimizer", c.kind, c.mesh_axis, c.nbytes) for c in gathers)
    for records, deferred in launch(_train, 2):
        assert deferred == 0  # nothing to defer: no gradient is Partial
        # the only collectives that ran: one all-gather per parameter and step, at the listed sizes
        assert Counter(records) == Counter({k: n * STEPS for k, n in listed.items()})
    # priced: nothing else communicates, so the step is compute plus the gathers, and equals the objective
    paid = sum(c.seconds for c in gathers)
    assert paid > 0 and p.optimizer_gathers_priced
    assert p.predicted_step_time == pytest.approx(p.compute_time + paid, rel=1e-12)
    assert p.solver.objective == pytest.approx(p.predicted_step_time, rel=1e-6)


def _train_gpt2(pins: tuple) -> tuple[Counter[int], int, Counter[int]]:
    """One ZeRO-1 step of GPT-2 (tied embedding and head: one parameter, two uses) under the plan."""
    m, p = model("gpt2"), plan("gpt2", 2, None, pins)
    module = parallelize(m.model, p, m.args, m.kwargs, captured=m.captured, record=True)
    opt = ZeroOptimizer(module, torch.optim.AdamW, stage=1, lr=1e-2)
    outs = pytree.tree_leaves(module(*shard_inputs(p, *m.args, **m.kwargs)))
    sum(t.sum() for t in outs if isinstance(t, torch.Tensor) and t.requires_grad).backward()
    opt.step()
    log = parallel_info(module).comm.log or ()
    ran = Counter(r.nbytes for r in log if r.phase == "optimizer" and r.kind == "all_gather")
    listed = Counter(c.nbytes for c in p.optimizer_gathers if c.kind == "all_gather")
    return ran, len(opt.deferred), listed


@pytest.mark.slow
def test_gpt2_gathers_are_a_deferred_all_reduces_half_or_listed() -> None:
    """Every optimizer all-gather the runtime runs (one per replicated parameter on a 1-D mesh) is either half
    of a deferred gradient all-reduce or one the plan lists and its step pays -- the tied embedding's too,
    whose two uses must both reduce the axis for its gather to be paid by the all-reduce."""
    plan("gpt2", 2, None, ())  # captured and planned here once: the forked ranks inherit both
    for ran, deferred, listed in launch(_train_gpt2, 2, ()):  # the free plan: 4 deferred, 14 listed
        assert sum(ran.values()) == deferred + sum(listed.values())
        assert all(ran[size] >= n for size, n in listed.items())  # the listed sizes are the sizes that ran
