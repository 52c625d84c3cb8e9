"""Memory no node owns is inside the budget (problem/extras.py), and recomputation is a per-block count
(problem/mix.py): the plan's memory is what the solver constrained, and the mixed count is the exact best."""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest

import autoshard
from autoshard import zoo
from autoshard.annotations import pin_problem
from autoshard.capture import capture
from autoshard.errors import InfeasibleError
from autoshard.planner_candidates import SYNC_EXPOSED, kind_allowed, sync_exposed_problem
from autoshard.planner_rerank import hand_plan_masks, lower_bound_problem
from autoshard.problem.build import BuiltProblem, build_problem
from autoshard.problem.costs import CostOptions, Recompute
from autoshard.problem.mix import best_share, share_problem
from autoshard.search import SearchProblem, memory_of, solve

DATA_PARALLEL = {
    "input_ids": ("S(0)",),
    # the batch split over all 8 devices, weights whole: replicated weights alone let this tiny model run
    # replicated (every device the whole batch, no gradient sync) once causal attention is priced as such
    "*_proj": ((8, 1, 1), (1, 1)),
    "lm_head": ((8, 1, 1), (1, 1)),
    "model.embed_tokens": "replicate",
}
LAYERS = 8


@functools.cache
def _case():
    case = zoo.build("llama-tiny", layers=LAYERS, batch=8, seq=256, device="meta")
    return case, capture(case.model, case.args, case.kwargs), autoshard.load_cluster("a100x8", mesh=(8,))


@functools.cache
def _built(
    policy: Recompute, share: float = 1.0, limit: float | None = None, pinned: bool = True
) -> BuiltProblem:
    """Built once per argument set and shared by the tests (a built problem is frozen; no test mutates its
    arrays): ``pinned`` pins DATA_PARALLEL."""
    _, captured, cluster = _case()
    opts = CostOptions(recompute=policy, recompute_share=share)
    built = build_problem(captured, cluster, opts, memory_limit=limit)
    return pin_problem(built, DATA_PARALLEL, frozenset(), "model.layers", 0) if pinned else built


@functools.cache
def _halfway() -> float:
    """A budget halfway between keeping everything and recomputing every block, data parallel pinned."""
    none, full = _built(Recompute.NONE), _built(Recompute.FULL)
    return (
        memory_of(none.problem, solve(none.problem).choice)
        + memory_of(full.problem, solve(full.problem).choice)
    ) / 2


@functools.cache
def _data_parallel_plan(limit: float, time_limit: float = 60.0) -> autoshard.Plan:
    """The data-parallel plan under ``limit``, made once for the tests that read it (they do not mutate it)."""
    case, captured, cluster = _case()
    return autoshard.plan(
        case.model,
        cluster,
        case.args,
        case.kwargs,
        annotations=DATA_PARALLEL,
        memory_limit=limit,
        time_limit=time_limit,
        captured=captured,
    )


def _candidate(built: BuiltProblem, name: str) -> tuple[SearchProblem, tuple[np.ndarray | None, ...] | None]:
    """The problem and masks of the ranking's candidate ``name`` (planner_rerank, planner_candidates)."""
    base, _, kind = name.partition(" without ")
    problem = {
        "solver optimum": built.problem,
        "lower-bound optimum": lower_bound_problem(built),
        SYNC_EXPOSED: sync_exposed_problem(built),
    }.get(base)
    if problem is None:  # a hand plan: the linear problem under its masks
        return built.problem, hand_plan_masks(built, name)
    return problem, kind_allowed(built, kind) if kind else None


def test_fsdp_gathers_and_the_temporary_are_inside_the_budget() -> None:
    """Unpinned on 8 devices with a budget that forces sharding: the plan's memory (its breakdown included)
    is exactly the memory the solver held under the budget, and it fits."""
    case, captured, cluster = _case()
    free = autoshard.plan(case.model, cluster, case.args, case.kwargs, recompute="none", captured=captured)
    limit = free.memory_per_device * 0.999
    built = _built(Recompute.NONE, limit=limit, pinned=False)
    assert built.extras is not None and built.extras.gathers  # parameter uses that can all-gather
    plan = autoshard.plan(
        case.model, cluster, case.args, case.kwargs, recompute="none", memory_limit=limit, captured=captured
    )
    # the plan is the candidate with the lowest reported step (autoshard.planner_rerank): solve that one
    problem, masks = _candidate(built, plan.solver.chosen.split(" = ")[0])
    solution = solve(dataclasses.replace(problem, allowed=masks) if masks else problem)
    assert plan.memory_per_device <= limit
    assert plan.memory_per_device == pytest.approx(memory_of(built.problem, solution.choice), rel=1e-9)
    assert set(plan.memory_breakdown) == {"runtime reserve", "gathered weights", "largest temporary"}


def test_a_budget_below_every_plan_is_refused_with_the_overshoot() -> None:
    case, captured, cluster = _case()
    with pytest.raises(InfeasibleError, match=r"over.*Fix: .*devices.*(recompute|fsdp)|no plan fits"):
        autoshard.plan(case.model, cluster, case.args, case.kwargs, memory_limit=1.0e9, captured=captured)


@pytest.mark.parametrize("k", [1, 3, LAYERS - 1])
def test_the_mixed_problem_is_the_build_at_that_share(k: int) -> None:
    zero, whole = _built(Recompute.FULL, 0.0), _built(Recompute.FULL, 1.0)
    mixed, direct = share_problem(zero, whole, k).problem, _built(Recompute.FULL, k / LAYERS).problem
    for a, b in zip(mixed.node_costs, direct.node_costs, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-24)
    for a, b in zip(mixed.memory, direct.memory, strict=True):  # type: ignore[arg-type]
        np.testing.assert_allclose(a, b, rtol=1e-12)
    for e, f in zip(mixed.edges, direct.edges, strict=True):
        np.testing.assert_allclose(e.cost, f.cost, rtol=1e-12, atol=1e-24)


def test_recomputing_some_blocks_beats_every_uniform_choice_and_equals_brute_force_over_k(tmp_path) -> None:
    """Data parallel pinned, a budget halfway between keeping everything and recomputing every block: the
    scan's count equals the best of solving every k = 0..N exactly, strictly inside, and beats both uniform
    policies (none does not fit; full costs more)."""
    none = _built(Recompute.NONE)
    limit = _halfway()
    zero = _built(Recompute.FULL, 0.0, limit)
    whole = _built(Recompute.FULL, 1.0, limit)
    every = {}
    for k in range(LAYERS + 1):
        try:
            every[k] = solve(share_problem(zero, whole, k).problem).objective
        except InfeasibleError:
            continue
    best_k = min(every, key=lambda k: every[k])
    assert 0 < best_k < LAYERS and every[best_k] < every[LAYERS]
    with pytest.raises(InfeasibleError):
        solve(dataclasses.replace(none.problem, memory_limit=limit))
    found = best_share(zero, whole, solve, incumbent=every[LAYERS])
    assert found is not None and found[0] == best_k and found[2].objective == pytest.approx(every[best_k])
    plan = _data_parallel_plan(limit)
    # the planner searches selective counts too: with the batch split pinned on every linear, selective in 6
    # blocks beats the best full count (it did before the causal pricing as well); a full plan is best_k's
    assert plan.recompute in ("full", "selective") and plan.recompute_blocks is not None
    assert plan.recompute == "selective" or plan.recompute_blocks == best_k
    assert plan.memory_per_device <= limit
    count = f"{plan.recompute} recomputation of the first {plan.recompute_blocks} of {LAYERS}"
    assert count in " ".join(plan.summary().split())
    plan.save(tmp_path / "plan.json")
    assert autoshard.load_plan(tmp_path / "plan.json").recompute_blocks == plan.recompute_blocks


@pytest.mark.slow
def test_the_per_block_search_does_not_depend_on_the_time_limit() -> None:
    """The per-block count search stops by its interval count (mix.MAX_INTERVALS), never by the clock: a
    time limit spent before its first interval (as on a loaded machine) gives the same plan, count and
    certificate as a generous one."""
    slow, hurried = (_data_parallel_plan(_halfway(), t) for t in (60.0, 1e-9))
    assert slow.recompute_blocks is not None  # the per-block search ran and chose a count
    same = ("recompute", "recompute_blocks", "predicted_step_time", "memory_per_device", "param_placements")
    assert [getattr(hurried, k) for k in same] == [getattr(slow, k) for k in same]
    assert (hurried.solver.objective, hurried.solver.lower_bound, hurried.solver.optimal) == (
        slow.solver.objective,
        slow.solver.lower_bound,
        slow.solver.optimal,
    )
    assert slow.solver.optimal


@pytest.mark.slow
def test_the_count_search_stops_after_its_intervals_and_says_so() -> None:
    """Out of intervals, best_count keeps what it found and does not claim it optimal (same answer each
    time: a count, not a clock, stops it)."""
    limit = _halfway()
    zero, whole = _built(Recompute.FULL, 0.0, limit), _built(Recompute.FULL, 1.0, limit)
    whole_cost = solve(whole.problem).objective
    found = best_share(zero, whole, solve, incumbent=whole_cost)
    assert found is not None and found[2].optimal
    runs = [best_share(zero, whole, solve, incumbent=whole_cost, max_intervals=m) for m in (1, 1, 3, 3)]
    assert runs[0] is None or not runs[0][2].optimal
    assert [None if r is None else (r[0], r[2].objective, r[2].optimal) for r in runs[::2]] == [
        None if r is None else (r[0], r[2].objective, r[2].optimal) for r in runs[1::2]
    ]
