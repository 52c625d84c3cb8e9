"""A mesh's floor (autoshard/meshbound.py) is below every plan the planner could return on it: each part's
budgeted bound against the exact optimum of every recomputation count, solved one by one."""

from __future__ import annotations

import dataclasses
import functools
import math

import autoshard
from autoshard import zoo
from autoshard.capture import capture
from autoshard.errors import InfeasibleError
from autoshard.meshbound import mesh_floor, prove_above
from autoshard.planner_rerank import lower_bound_problem
from autoshard.planner_steps import build
from autoshard.problem.costs import CostOptions, Recompute, recipe
from autoshard.problem.mix import share_problem
from autoshard.search import memory_of, solve

LAYERS = 8


@functools.cache
def _case():
    case = zoo.build("llama-tiny", layers=LAYERS, batch=8, seq=256, device="meta")
    return case, capture(case.model, case.args, case.kwargs), autoshard.load_cluster("a100x8", mesh=(4, 2))


@functools.cache
def _limit() -> float:
    """Halfway between the memory of the optimum keeping every activation and of full recomputation's."""
    _, captured, cluster = _case()
    none = build(captured, cluster, CostOptions(recompute=Recompute.NONE), None, math.inf, {})[1].problem
    full = build(captured, cluster, CostOptions(recompute=Recompute.FULL), None, math.inf, {})[1].problem
    return (memory_of(none, solve(none).choice) + memory_of(full, solve(full).choice)) / 2


def _steps_lower_bound(policy: Recompute, k: int | None) -> float:
    """The exact budgeted optimum of the lower-bound problem at ``k`` of ``N`` blocks (uniform: None)."""
    _, captured, cluster = _case()

    def pinned(share: float):
        opts = CostOptions(recompute=policy, recompute_share=share)
        return build(captured, cluster, opts, None, _limit(), {})[1]

    built = pinned(1.0) if k is None else share_problem(pinned(0.0), pinned(1.0), k)
    lower = lower_bound_problem(built)
    assert lower is not None
    return solve(lower).objective


def test_every_part_is_below_each_count_it_covers() -> None:
    _, captured, cluster = _case()
    floor = mesh_floor(captured, cluster, {"memory_limit": _limit()})
    assert floor is not None
    parts = [p for p in floor.parts if p is not None]
    assert [p.name.split(",")[0] for p in parts] == ["none", "selective", "full"]
    for part in parts:
        policy = Recompute(part.name.split(",")[0])
        try:
            bound = solve(part.problem).lower_bound
        except InfeasibleError:
            bound = math.inf
        assert part.free <= bound * (1 + 1e-12)
        counts = [None] if policy is Recompute.NONE else range(1, LAYERS + 1)
        for k in counts:
            try:
                exact = _steps_lower_bound(policy, k)
            except InfeasibleError:
                continue  # nothing fits at this count: nothing to bound
            assert bound <= exact * (1 + 1e-12), (part.name, k)


def test_prove_above_proves_only_what_holds() -> None:
    _, captured, cluster = _case()
    floor = mesh_floor(captured, cluster, {"memory_limit": _limit()})
    assert floor is not None
    best = min(
        _steps_lower_bound(p, k)
        for p in Recompute
        for k in ([None] if p is Recompute.NONE else range(1, LAYERS + 1))
        if _fits(p, k)
    )
    assert prove_above(floor, best * (1 + 1e-6)) is None  # a plan steps below that
    least = min(p.free for p in floor.parts if p is not None)
    assert floor.floor >= least  # the ordering key: the first part's (none) optimum without the budget
    proven = prove_above(floor, least * (1 - 1e-6))
    assert proven is not None and least * (1 - 1e-6) <= proven[0] <= best * (1 + 1e-12)
    assert len(proven[1]) == 3


def _fits(policy: Recompute, k: int | None) -> bool:
    try:
        _steps_lower_bound(policy, k)
    except InfeasibleError:
        return False
    return True


def test_no_floor_where_the_plan_space_is_wider() -> None:
    _, captured, cluster = _case()
    assert mesh_floor(captured, cluster, {"pipeline": 2}) is None
    assert mesh_floor(captured, cluster, {"search": "propagate"}) is None
    assert mesh_floor(captured, cluster, {"unknown_option": 1}) is None
    pinned = mesh_floor(captured, cluster, {"recompute": "full", "memory_limit": _limit()})
    assert pinned is not None and [p and p.name for p in pinned.parts] == ["full"]
    inference = mesh_floor(captured, cluster, {"training": False})
    assert inference is not None and [p and p.name for p in inference.parts] == ["none"]


def test_the_floor_prices_the_recipe_the_planner_prices() -> None:
    """``precision="amp"`` (fp32 weights, autocast copies): the floor is the amp problem's bound, not bf16's."""
    _, captured, cluster = _case()
    amp, bf16 = (mesh_floor(captured, cluster, {"precision": p}) for p in ("amp", "bf16"))
    opts = CostOptions(recompute=Recompute.NONE, precision=recipe("amp"))
    lower = lower_bound_problem(build(captured, cluster, opts, None, float(cluster.device_memory), {})[1])
    assert lower is not None and amp is not None and bf16 is not None
    assert amp.floor == solve(dataclasses.replace(lower, memory_limit=None, peak=None)).lower_bound
    assert amp.floor != bf16.floor
