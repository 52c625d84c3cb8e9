"""The pipeline search skips a candidate whose compute alone is no faster than the best step so far.

- :func:`~autoshard.pipeline.search.compute_floor` is a lower bound on the step of every plan of a candidate
  (the optimum and random plans, every schedule the stage DP prices, each recomputation policy);
- pruning by it returns the same plan as pricing every candidate (the pruned policy is named, not solved).
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest

import autoshard
import autoshard.pipeline.search as pipeline_search
from autoshard.capture import capture
from autoshard.errors import PipelineError
from autoshard.pipeline.layers import part_costs
from autoshard.pipeline.schedules import Schedule, torch_refuses, virtual_stage_options
from autoshard.pipeline.search import compute_floor
from autoshard.pipeline.stages import best_split
from autoshard.problem.build import build_problem
from autoshard.problem.costs import CostOptions, Recompute
from autoshard.search import solve
from cost_models.profile import load_profile
from tests.pipeline.test_pipeline_pricing import _llama

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def small():
    model, ids = _llama(layers=4, hidden=256, batch=8, seq=64)
    return capture(model, (ids,))


@pytest.mark.parametrize("policy", list(Recompute))
def test_compute_floor_is_below_every_priced_step(small, policy: Recompute) -> None:
    """Every plan (the optimum and random ones), cut by every schedule the search prices, is at least as
    slow as the floor: its slowest device runs m microbatches of at least the mean compute."""
    captured = small
    cluster = autoshard.load_cluster("a100x8", nodes=1, mesh=(2, 4))
    degree, microbatches = 2, 4
    built = build_problem(captured, cluster, CostOptions(microbatches=microbatches, recompute=policy))
    floor = compute_floor(built, degree)
    assert floor > 0
    best = solve(built.problem, method="exact")
    rng = random.Random(len(policy.value))
    plans = [best]
    for _ in range(4):
        choice = [rng.randrange(n) if i < len(built.variables) else c for i, (c, n) in
                  enumerate(zip(best.choice, built.problem.sizes, strict=True))]  # fmt: skip
        plans.append(dataclasses.replace(best, choice=tuple(choice)))
    steps = []
    for solution in plans:
        costs = part_costs(built, solution)
        for schedule in Schedule:
            for v in virtual_stage_options(schedule, degree, costs.layers):
                if torch_refuses(schedule, degree, v, microbatches) is None:
                    split = best_split(costs, schedule, degree, v, microbatches)
                    if split is not None:
                        steps.append(split.step_seconds)
    assert steps and min(steps) >= floor
    # the floor of a policy that recomputes more is higher: recomputation only adds compute
    if policy is not Recompute.NONE:
        less = build_problem(captured, cluster, CostOptions(microbatches=microbatches))
        assert compute_floor(less, degree) < floor


@pytest.fixture(scope="module")
def fast_links() -> autoshard.Cluster:
    """2 nodes of 8 A100s whose links are 1000x faster than the profile's: compute decides the step, so the
    compute floor of full recomputation passes the step of a plan that recomputes less."""
    a100 = load_profile("a100x8")
    bus = a100.intra_node.bus_bandwidth
    bus = dataclasses.replace(bus, **{f: getattr(bus, f) * 1000 for f in type(bus).__slots__})
    intra = dataclasses.replace(
        a100.intra_node, bus_bandwidth=bus, step_latency=a100.intra_node.step_latency / 1000
    )
    inter = dataclasses.replace(
        a100.inter_node, nic_bandwidth=a100.inter_node.nic_bandwidth * 1000,
        step_latency=a100.inter_node.step_latency / 1000,
    )  # fmt: skip
    return autoshard.load_cluster(
        dataclasses.replace(a100, intra_node=intra, inter_node=inter), nodes=2, mesh=(2, 8)
    )


def test_pruned_policy_gives_the_plan_of_pricing_every_policy(
    fast_links, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Budgets a little under the no-recompute plan's memory: recomputation is priced, full recomputation's
    floor is above the best step, so it is named and not solved; the same plan (step, strategies, schedule,
    cuts) as with pruning switched off.  The busiest device's bound (pipeline/bound.py) alone prunes it too.

    The budgets sit under selective recomputation's own memory (0.91 of the no-recompute plan's here), so
    its budget binds and full is priced; at 0.95 selective fits unbound and full is rightly never priced
    (0.95 passed only while the recompute working set counted a block's parameters twice)."""
    model, ids = _llama(layers=4, hidden=512, batch=32, seq=512)
    # every schedule: the layer bound of a recomputing policy leaves out the zero-bubble ones, which never run
    # recomputation (pipeline/pick.priced_shapes); with them, 0.92's bound was ZB-V's 0.01279 s, under the best
    # step 0.01394 s, and full recomputation was solved (0.01568 s)
    pins: dict[str, Any] = {"pipeline": 2, "microbatches": 4, "schedule": "auto"}
    none = autoshard.plan(model, fast_links, (ids,), recompute="none", **pins)

    def priced(plan: autoshard.Plan) -> str:
        return next((n for n in plan.notes if n.startswith("pipeline search priced")), "")

    def same(a: autoshard.Plan, b: autoshard.Plan) -> None:
        assert a.recompute == b.recompute
        assert a.predicted_step_time == b.predicted_step_time
        assert [n.strategy for n in a.nodes] == [n.strategy for n in b.nodes]
        assert a.pipeline == b.pipeline

    bounded: list[tuple[Schedule, int]] = []
    step_bound = pipeline_search.step_bound

    def recorded(built, problem, shapes, *rest):  # type: ignore[no-untyped-def]
        if built.options.recompute is not Recompute.NONE:
            bounded.extend(shapes)
        return step_bound(built, problem, shapes, *rest)

    skipped = 0
    for share in (0.93, 0.92):
        budget = share * none.memory_per_device
        with monkeypatch.context() as m:
            m.setattr(pipeline_search, "step_bound", recorded)
            pruned = autoshard.plan(model, fast_links, (ids,), recompute="auto", memory_limit=budget, **pins)
        skipped += "(full recompute): at least" in priced(pruned) and "not solved" in priced(pruned)
        with monkeypatch.context() as m:
            m.setattr(pipeline_search, "compute_floor", lambda built, degree: 0.0)
            if share == 0.93:  # the layer bound without the compute floor
                layered = autoshard.plan(
                    model, fast_links, (ids,), recompute="auto", memory_limit=budget, **pins
                )
                assert "(full recompute): at least" in priced(layered) and "not solved" in priced(layered)
                same(layered, pruned)
            m.setattr(pipeline_search, "step_bound", lambda *args: 0.0)
            every = autoshard.plan(model, fast_links, (ids,), recompute="auto", memory_limit=budget, **pins)
        assert "not solved" not in priced(every)
        same(pruned, every)
    assert skipped  # the pruning did happen
    assert bounded and not any(schedule.zero_bubble for schedule, _ in bounded)


def test_a_schedule_refused_with_one_policy_of_several_keeps_the_plan_of_another() -> None:
    """zb_v pinned, recomputation searched: once the budget binds, selective recomputation is refused with zb_v
    (torch re-runs checkpointed layers in both halves of its backward), and that refusal used to abort the
    whole search although no recomputation fits.  Now it is one policy's refusal; pinned, it stays an error."""
    model, ids = _llama(layers=8, hidden=256, batch=8, seq=256)
    cluster = autoshard.load_cluster("a100x8", nodes=1, mesh=(8,))
    kw: dict[str, Any] = dict(pipeline=4, microbatches=8, forbid=["tp"], schedule="zb_v")
    free = autoshard.plan(model, cluster, (ids,), recompute="none", **kw)
    plan = autoshard.plan(
        model, cluster, (ids,), recompute="auto", memory_limit=free.memory_per_device * 1.0000001, **kw
    )
    assert plan.recompute == "none" and plan.pipeline is not None and plan.pipeline.schedule == "zb_v"
    assert plan.memory_per_device <= free.memory_per_device * 1.0000001
    with pytest.raises(PipelineError, match=r"^4 pipeline stages: zb_v with selective recomputation refused"):
        autoshard.plan(model, cluster, (ids,), recompute="selective", **kw)
