"""Per-schedule memory floors and the deferred refit (pipeline/floors.py, pipeline/walk.py).

- each shape's floors (the layers' harmonic one, the mean device's and the end stages') are at most the busiest
  device's memory of every cut of every plan (the optimum and random ones) under that shape;
- a candidate none of whose shapes' floors fits is refused without a refit, as the refit refused it;
- the walk defers the first candidate's refit, prunes it by its bound at the best step later, and walks the
  policies again in order when it finds a plan: the same best and lines as the in-order walk.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
from typing import Any

import pytest

import autoshard
import autoshard.pipeline.search as pipeline_search
from autoshard.capture import capture
from autoshard.errors import InfeasibleError
from autoshard.pipeline.floors import Live, harmonic_flight
from autoshard.pipeline.layers import part_costs
from autoshard.pipeline.refit import floor_problem
from autoshard.pipeline.schedules import Schedule, in_flight, torch_refuses, virtual_stage_options
from autoshard.pipeline.stages import price_split
from autoshard.pipeline.walk import RefitDeferred, Walk
from autoshard.problem.build import BuiltProblem, build_problem
from autoshard.problem.costs import CostOptions, Recompute
from autoshard.search import BoundExceeded, Solution, memory_of, solve
from tests.pipeline.test_pipeline_pricing import _llama

pytest.importorskip("transformers")

DEGREE, MICROBATCHES, LAYERS = 2, 4, 4


@pytest.fixture(scope="module")
def built():
    model, ids = _llama(layers=LAYERS, hidden=256, batch=8, seq=64, vocab=4096)
    cluster = autoshard.load_cluster("a100x8", nodes=1, mesh=(2, 4))
    return build_problem(capture(model, (ids,)), cluster, CostOptions(microbatches=MICROBATCHES))


def _shapes() -> list[tuple[Schedule, int]]:
    return [
        (s, v)
        for s in Schedule
        for v in virtual_stage_options(s, DEGREE, LAYERS)
        if torch_refuses(s, DEGREE, v, MICROBATCHES) is None
    ]


def random_plans(built: BuiltProblem, best: Solution, rng: random.Random, count: int) -> list[Solution]:
    """``best`` and ``count`` plans of random strategies (fan-out nodes as in ``best``)."""
    plans = [best]
    for _ in range(count):
        choice = [
            rng.randrange(n) if i < len(built.variables) else c
            for i, (c, n) in enumerate(zip(best.choice, built.problem.sizes, strict=True))
        ]
        plans.append(dataclasses.replace(best, choice=tuple(choice)))
    return plans


def test_each_shapes_floors_are_below_every_cut(built) -> None:
    best = solve(built.problem, method="exact")
    plans = random_plans(built, best, random.Random(3), 4)
    checked = 0
    for schedule, v in _shapes():
        fewest = min(in_flight(schedule, d, DEGREE, v, MICROBATCHES) for d in range(DEGREE))
        floors = [floor_problem(built, DEGREE, max(1.0, fewest), None, h) for h in (None, "pre", "post")]
        floors.append(
            floor_problem(built, DEGREE, harmonic_flight(schedule, v, DEGREE, MICROBATCHES), None, "layers")
        )
        chunks = DEGREE * v
        for solution in plans:
            costs = part_costs(built, solution)
            need = [memory_of(floor, solution.choice) for floor in floors]
            for inner in itertools.combinations(range(1, LAYERS), chunks - 1):  # every cut
                split = price_split(costs, (0, *inner, LAYERS), schedule, DEGREE, v, MICROBATCHES)
                assert max(need) <= max(split.memory) * (1 + 1e-9)
                checked += 1
    # the harmonic flight is above the least: 1F1B's devices hold 2 and 1 microbatches
    assert harmonic_flight(Schedule.ONE_F_ONE_B, 1, DEGREE, MICROBATCHES) == pytest.approx(4 / 3)
    assert checked >= 30


def test_no_shape_fits_refuses_without_refit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Just under the least per-shape floor nothing lives and the candidate is refused with that figure, no
    refit solved; the refit (every shape kept alive) refuses it too, after its own checks."""
    model, ids = _llama(layers=LAYERS, hidden=256, batch=8, seq=64, vocab=4096)
    cluster = autoshard.load_cluster("a100x8", nodes=1, mesh=(2, 4))
    pins: dict[str, Any] = {"pipeline": DEGREE, "microbatches": MICROBATCHES, "recompute": "none"}
    seen: list[Live] = []
    refits: list[int] = []
    live, refit = pipeline_search.live_shapes, pipeline_search.refit
    monkeypatch.setattr(pipeline_search, "live_shapes", lambda *a: seen.append(live(*a)) or seen[-1])
    monkeypatch.setattr(pipeline_search, "refit", lambda *a: refits.append(1) or refit(*a))
    with pytest.raises(InfeasibleError, match="under each schedule the stages may run"):
        autoshard.plan(model, cluster, (ids,), memory_limit=2**20, **pins)
    budget = 0.999 * seen[-1].least
    with pytest.raises(InfeasibleError, match="under each schedule the stages may run"):
        autoshard.plan(model, cluster, (ids,), memory_limit=budget, **pins)
    assert not refits and not seen[-1].shapes
    monkeypatch.setattr(
        pipeline_search, "live_shapes", lambda built, *a: Live(((_shapes()[0], built.problem),), 0.0)
    )
    with pytest.raises(InfeasibleError):
        autoshard.plan(model, cluster, (ids,), memory_limit=budget, **pins)
    assert refits


@dataclasses.dataclass(frozen=True)
class _Solution:
    choice: tuple[int, ...]
    budget_binding: bool | None = True


@dataclasses.dataclass(frozen=True)
class _Plan:
    step_seconds: float
    solution: _Solution
    name: str

    def describe(self) -> str:
        return f"{self.name}: {self.step_seconds} s"


def _price(steps: dict[Recompute, float], refit: float | None, bound: float, calls: list[str]) -> Any:
    """A fake price: ``none`` has only a refit (step ``refit``, its bound ``bound``); the others ``steps``;
    each plan's choice records the warm start it got."""

    def price(policy: Recompute, hint: Any, ceiling: float, defer: bool) -> _Plan | None:
        calls.append(policy.value)
        if policy is Recompute.NONE:

            def finish(at: float) -> _Plan | None:
                calls.append("refit")
                if bound >= at:
                    raise BoundExceeded(bound, at)
                return None if refit is None else _Plan(refit, _Solution((0,)), "none")

            if defer and math.isinf(ceiling):
                raise RefitDeferred(finish)
            return finish(ceiling)
        return _Plan(steps[policy], _Solution((list(Recompute).index(policy), *(hint or ()))), policy.value)

    return price


@pytest.mark.parametrize(
    ("refit", "bound", "pruned"),
    [(None, 5.0, True), (None, 1.0, False), (2.0, 1.0, False), (4.0, 1.0, False)],
)
def test_walk_defers_the_refit_and_keeps_the_in_order_answer(refit, bound, pruned) -> None:
    steps = {Recompute.SELECTIVE: 3.0, Recompute.FULL: 3.5}
    policies = list(Recompute)
    results = []
    for defer in (True, False):
        calls: list[str] = []
        walk: Walk[_Plan] = Walk()
        price = _price(steps, refit, bound, calls)
        if defer:
            walk = walk.candidate(price, policies, 2, 4, lambda stage: None)
        else:  # the in-order walk: the refit at its place
            walk._policies(price, policies, "pp 2 × 4 microbatches", False, {}, lambda stage: None)
        results.append((walk.best, walk.priced, calls))
    (deferred, lines, calls), (in_order, order_lines, _) = results
    assert deferred == in_order  # the same plan, warm starts included
    if pruned:  # the refit is not solved: named with its bound, where it would have stood
        assert lines == [
            "pp 2 × 4 microbatches (none recompute): at least 5 s (a proven lower bound), not solved",
            *order_lines,
        ]
    else:
        assert lines == order_lines
    assert calls[0] == "none" and "refit" in calls
