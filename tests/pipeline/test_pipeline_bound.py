"""The busiest device's layers bound every pipelined step (:mod:`autoshard.pipeline.bound`).

- ``B(s) / L`` (:func:`layer_problem`'s objective) is at most one layer's per-microbatch time of ``s``, as
  :func:`~autoshard.pipeline.layers.part_costs` prices it, for the optimum and random plans;
- every split the stage DP prices steps at least ``F / L × (B(s) + r G(s))`` (:func:`schedule_factor` and
  :func:`gather_weight` of its schedule; ``G``: the layers' weight gathers, each chunk exposes its first);
- :func:`step_bound` is at most the step of every plan that fits, under every schedule it was given.
"""

from __future__ import annotations

import dataclasses
import random

import pytest

import autoshard
from autoshard.capture import capture
from autoshard.pipeline.bound import gather_weight, layer_compute, layer_problem, schedule_factor, step_bound
from autoshard.pipeline.layers import boundary_bytes, part_costs, stage_memory_problem
from autoshard.pipeline.schedules import Schedule, in_flight, p2p_time, torch_refuses, virtual_stage_options
from autoshard.pipeline.stages import best_split
from autoshard.problem.build import build_problem
from autoshard.problem.costs import CostOptions, Recompute
from autoshard.search import evaluate, memory_of, solve
from tests.pipeline.test_pipeline_pricing import _llama

pytest.importorskip("transformers")

DEGREE, MICROBATCHES = 2, 4


@pytest.fixture(scope="module")
def odd():
    """5 layers on 2 stages: one device holds 3 (the bound's ceil(L / p)), the mean is 2.5."""
    model, ids = _llama(layers=5, hidden=256, batch=8, seq=64)
    return capture(model, (ids,))


def _shapes(layers: int) -> list[tuple[Schedule, int]]:
    return [
        (s, v)
        for s in Schedule
        for v in virtual_stage_options(s, DEGREE, layers)
        if torch_refuses(s, DEGREE, v, MICROBATCHES) is None
    ]


@pytest.mark.parametrize("policy", list(Recompute))
def test_layer_bound_is_below_every_priced_step(odd, policy: Recompute) -> None:
    cluster = autoshard.load_cluster("a100x8", nodes=1, mesh=(2, 4))
    built = build_problem(odd, cluster, CostOptions(microbatches=MICROBATCHES, recompute=policy))
    flight = in_flight(Schedule.ONE_F_ONE_B, 0, DEGREE, 1, MICROBATCHES)
    problem = stage_memory_problem(built, DEGREE, flight)
    lower = layer_problem(built, problem)
    layers, shapes = built.num_blocks, _shapes(built.num_blocks)
    assert layers == 5 and shapes
    compute = layer_compute(built)  # priced once, shared by every weight (step_bound does so): the same costs
    weighted = {
        r: layer_problem(built, problem, r, compute)
        for r in {gather_weight(s, v, DEGREE, layers, MICROBATCHES) for s, v in shapes}
    }
    for shared in weighted.values():
        assert all(
            a.tobytes() == b.tobytes() for a, b in zip(shared.node_costs, lower.node_costs, strict=True)
        )
    best = solve(problem, method="exact")
    rng = random.Random(len(policy.value))
    plans = [best]
    while len(plans) < 8:  # random plans that mix TP, FSDP gathers and resharding
        choice = built.full_choice(
            [rng.randrange(len(s)) for s in (built.strategies[v] for v in built.variables)]
        )
        if evaluate(problem, choice) < float("inf"):
            plans.append(dataclasses.replace(best, choice=tuple(choice)))
    steps, gathered = [], 0
    for solution in plans:
        b = evaluate(lower, solution.choice)
        costs = part_costs(built, solution)
        assert 0 < b / layers <= (costs.layer.forward + costs.layer.backward) * (1 + 1e-9)
        hop = p2p_time(boundary_bytes(built, solution), 1e11, 1e-5)
        costs = dataclasses.replace(costs, p2p_seconds=hop)
        for schedule, v in shapes:
            split = best_split(costs, schedule, DEGREE, v, MICROBATCHES)
            assert split is not None
            factor = schedule_factor(schedule, v, DEGREE, layers, MICROBATCHES)
            r = gather_weight(schedule, v, DEGREE, layers, MICROBATCHES)
            with_gathers = evaluate(weighted[r], solution.choice)
            assert with_gathers >= b  # weights' moves are never negative
            gathered += with_gathers > b
            assert split.step_seconds >= factor * with_gathers / layers * (1 - 1e-9)
            steps.append((split.step_seconds, memory_of(problem, solution.choice)))
    assert gathered  # some plans gather their weights (FSDP): the gather term is exercised
    # the bound over every plan that fits: under the least memory any of these plans needs, and without
    tight = min(mem for _, mem in steps)
    for limit in (tight, None):
        budgeted = dataclasses.replace(problem, memory_limit=limit)
        bound = step_bound(built, budgeted, shapes, DEGREE, float("inf"), 60.0, 1e7)
        fitting = [step for step, mem in steps if limit is None or mem <= limit]
        assert 0 < bound <= min(fitting) * (1 + 1e-9)
        # a best step every bound reaches: the gathers' solves are skipped, the bound still holds and prunes
        early = step_bound(built, budgeted, shapes, DEGREE, 1e-12, 60.0, 1e7)
        assert 1e-12 <= early <= bound * (1 + 1e-9)


def test_factor_prices_the_bubble() -> None:
    """Zero-bubble schedules pay only the busiest device's layers; the others also the first microbatch's
    pass over every layer (1/v of it when interleaved); 126 layers on 16 stages: some stage holds 8."""
    assert schedule_factor(Schedule.ZB_V, 2, 16, 126, 16) == 16 * 8
    assert schedule_factor(Schedule.ONE_F_ONE_B, 1, 16, 126, 16) == 126 + 15 * 8
    assert schedule_factor(Schedule.INTERLEAVED_1F1B, 4, 16, 126, 16) == 126 / 4 + (16 - 0.25) * 8
    # each of a device's v chunks exposes its first gather; the busiest device holds 8 layers
    assert gather_weight(Schedule.ZB_V, 2, 16, 126, 16) == 2 / 8
