"""The sequence-layout search (planner_layout.py) prices the bound's own plan under each layout before solving:
that price is a plan of the layout's problem, so it is never below the bound nor below that layout's optimum,
and where it reaches the bound the layout is optimal with no solve (LLaMA-3-70B: contiguous, 2.2 s CPU saved)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import autoshard
import autoshard.planner_layout as layout
from autoshard import zoo
from autoshard.capture import capture
from autoshard.problem.context import ring_variable, zigzag_masks
from autoshard.runtime.verify import cluster_for


class Causal(nn.Module):
    """One head over a long sequence: only a ring splits it."""

    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.proj, self.back = nn.Linear(d, 3 * d), nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.proj(x).unsqueeze(1).chunk(3, dim=-1)
        return self.back(nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).squeeze(1))


def _spy(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Any]]:
    seen: dict[str, list[Any]] = {"priced": [], "solved": []}
    bound_plan, solve = layout._bound_plan, layout.solve

    def priced(built: Any, bound: Any, cand: Any) -> Any:
        got = bound_plan(built, bound, cand)
        seen["priced"].append((bound.objective, cand.cluster, got))
        return got

    def solved(problem: Any, **kwargs: Any) -> Any:
        got = solve(problem, **kwargs)
        seen["solved"].append((problem, kwargs["ceiling"], got))
        return got

    monkeypatch.setattr(layout, "_bound_plan", priced)
    monkeypatch.setattr(layout, "solve", solved)
    return seen


@pytest.mark.parametrize("case", ["toy", "llama-tiny"])
def test_the_bound_plan_priced_under_a_layout_bounds_it_and_keeps_the_optimum(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.manual_seed(0)
    model: nn.Module
    if case == "toy":
        model, args, pins = Causal(), (torch.randn(1, 4096, 32),), None
    else:
        built = zoo.build("llama-tiny", batch=1, seq=32)
        model, args = built.model, built.args
        pins = {"model.layers.*.self_attn": "ring", "input_ids": ("S(1)",)}
    cluster = cluster_for("cpu", 4)
    captured = capture(model, args)  # one capture for the three plans
    ref = {
        lay: autoshard.plan(
            model, cluster, args, annotations=pins, cp_layout=lay, captured=captured
        ).solver.objective
        for lay in ("zigzag", "contiguous")
    }
    seen = _spy(monkeypatch)
    plan = autoshard.plan(model, cluster, args, annotations=pins, cp_layout="auto", captured=captured)
    assert plan.solver.objective == pytest.approx(min(ref.values()), rel=1e-12) and plan.solver.optimal
    assert seen["priced"], "the bound's plan was priced under no layout"
    for bound, _, got in seen["priced"]:
        assert got is None or got.objective >= bound * (1 - 1e-12)
    # every solve after the first has the best so far as its ceiling
    ceilings = [c for _, c, _ in seen["solved"]]
    assert all(c < float("inf") for c in ceilings[2:])
    (searched,) = [n for n in plan.notes if "layout searched" in n]
    if (
        case == "toy"
    ):  # contiguous first (it would win a tie): solved; then the bound's plan reaches the bound
        # under zigzag, which is strictly better: no zigzag solve
        assert len(seen["solved"]) == 2 and plan.context_layout == "zigzag"
        assert searched.startswith("context-parallel layout searched: contiguous ")
        assert "; zigzag on axis 0 " in searched
    else:  # both layouts priced; the cheaper wins (contiguous at 32 tokens until ZeRO-1's gathers were priced:
        # the ringed plan's weights now split where they were replicated, and zigzag's balance pays)
        assert plan.context_layout == min(ref, key=lambda lay: ref[lay])
        assert "zigzag on axis 0" in searched and "contiguous" in searched


def test_the_layout_problems_bound_and_dominate_one_another_plan_by_plan() -> None:
    """The facts the search stands on (planner_layout.py F1-F3), checked on random plans of a 4-layer LLaMA on
    a 2 x 2 x 2 mesh: the balanced bound prices every plan at most as C and each Z_a do; a plan that rings
    on no node over ``a`` costs at least as much under Z_a as under C; and every plan holds the same memory
    under B, C and each Z_a (so a budget refuses the same plans under every layout)."""
    from autoshard.problem.build import build_problem
    from autoshard.problem.context import ring_axis_of, zigzag_cluster
    from autoshard.problem.costs import CostOptions
    from autoshard.search.problem import evaluate, memory_of

    case = zoo.build("llama-tiny", layers=4, batch=8, seq=32, device="meta")
    captured = capture(case.model, case.args, case.kwargs)
    cluster = autoshard.load_cluster("a100x8", mesh=(2, 2, 2))
    bound = build_problem(captured, cluster, CostOptions(cp_layout="auto"), memory_limit=1e12)
    contiguous = build_problem(captured, cluster, CostOptions(cp_layout="contiguous"), memory_limit=1e12)
    ring = ring_variable(bound)
    assert ring is not None
    rng = np.random.default_rng(0)
    for a in range(3):
        zig = build_problem(
            captured, zigzag_cluster(cluster, a), CostOptions(cp_layout="contiguous"), memory_limit=1e12
        )
        rings_on_a = 0
        for _ in range(150):
            choice = [int(rng.integers(len(bound.strategies[v]))) for v in bound.variables]
            prices = [evaluate(b.problem, b.full_choice(choice)) for b in (bound, contiguous, zig)]
            assert prices[0] <= prices[1] and prices[0] <= prices[2]  # F1
            k = bound.variables.index(ring)
            if ring_axis_of(bound.infos, bound.infos[ring], bound.strategies[ring][choice[k]]) == a:
                rings_on_a += 1
            else:
                assert prices[2] >= prices[1]  # F2
            memories = [memory_of(b.problem, b.full_choice(choice)) for b in (bound, contiguous, zig)]
            assert memories[0] == memories[1] == memories[2]  # F3
        assert 0 < rings_on_a < 150


def test_under_a_binding_budget_the_stop_at_the_bound_keeps_the_best_of_every_layout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """F3 with the budget binding.  The zigzag cluster's cheapest path of a weight gathers other sizes than
    the plain cluster's, but the plain one is what runs (codegen lowers a zigzag plan on the plain cluster),
    so every layout's problem prices those: the search's answer is the best of every layout solved in full."""
    from autoshard.codegen.parallelize import plan_cluster
    from autoshard.problem.build import build_problem
    from autoshard.problem.context import zigzag_axis_of, zigzag_cluster
    from autoshard.problem.costs import CostOptions, StepCache
    from autoshard.problem.extras import _gathered

    model, args = Causal(1024).to("meta"), (torch.randn(8, 4096, 1024, device="meta"),)
    cluster = autoshard.load_cluster("a100x8", nodes=2, mesh=(2, 2, 4))
    opts = CostOptions(cp_layout="contiguous")
    captured = capture(model, args)
    plain, zig = (build_problem(captured, c, opts) for c in (cluster, zigzag_cluster(cluster, 2)))
    assert plain.extras is not None and zig.extras is not None
    cheapest = StepCache(zig.cluster, specs=plain.cache)  # the zigzag cluster's own shortest paths
    shapes = {g.producer: tuple(plain.infos[g.producer].outputs[0].shape) for g in plain.extras.gathers}  # type: ignore[union-attr]
    assert any(
        _gathered(cheapest, h, w, shapes[g.producer], 4) != size
        for g in plain.extras.gathers
        for (h, w), size in g.sizes.items()
    ), "no gather whose zigzag path differs: F3 would hold here without the runtime's paths"
    assert zig.extras.gathers is plain.extras.gathers

    free = autoshard.plan(model, cluster, args, memory_limit=float("inf"), captured=captured)
    limit = 0.98 * free.memory_per_device
    plan = autoshard.plan(model, cluster, args, memory_limit=limit, captured=captured)
    assert plan.memory_per_device <= limit and plan.solver.objective > free.solver.objective  # it binds
    assert plan.solver.optimal and any("layout searched" in n for n in plan.notes)
    if plan.context_layout == "zigzag":
        assert zigzag_axis_of(plan_cluster(plan)) is None  # what parallelize lowers on

    contiguous = layout._Search.contiguous

    def everything(
        self: Any,
    ) -> None:  # no stop at the bound, no dominance: every layout solved below the best
        contiguous(self)
        self.reach, self.proven = -1.0, None

    monkeypatch.setattr(layout._Search, "contiguous", everything)
    full = autoshard.plan(model, cluster, args, memory_limit=limit, captured=captured)
    assert plan.solver.objective == pytest.approx(full.solver.objective, rel=1e-12)


def test_a_masked_bound_under_a_binding_budget_skips_what_the_unbudgeted_bound_cannot() -> None:
    """Step 2 of planner_layout.py under a binding budget: B masked to the plans a zigzag on the other axes
    could win with is solved *with* the budget (F3: a plan fits under Z_a iff under B).  Its optimum is
    below every such Z_a's budgeted optimum held to its rings (F1), and above the unbudgeted masked optimum,
    so a best between the two is skipped by the budgeted bound and not by the unbudgeted one.  Z_a's
    Lagrangian bound at B's multiplier (the solver's first probe, search/hinted.py) never reaches a ceiling
    just above Z_a's optimum, and reaches the unbudgeted masked optimum here."""
    from autoshard.problem.build import build_problem
    from autoshard.problem.context import zigzag_cluster
    from autoshard.problem.costs import CostOptions
    from autoshard.search import BoundExceeded, solve
    from autoshard.search.hinted import probe_hint
    from autoshard.search.problem import memory_of, peak_floor
    from autoshard.search.reduce import reduce_problem
    from autoshard.search.run import Run

    model, args = Causal(1024).to("meta"), (torch.randn(8, 4096, 1024, device="meta"),)
    cluster = autoshard.load_cluster("a100x8", nodes=2, mesh=(2, 2, 4))
    captured = capture(model, args)
    free = build_problem(captured, cluster, CostOptions(cp_layout="auto"))
    limit = 0.98 * memory_of(free.problem, solve(free.problem).choice)
    built = build_problem(captured, cluster, CostOptions(cp_layout="auto"), memory_limit=limit)
    bound = solve(built.problem)
    axis, ring = layout._ring_axis(built, bound), ring_variable(built)
    assert axis is not None and ring is not None and bound.multiplier is not None  # rings; budget binds
    others = tuple(a for a in range(3) if a != axis)
    masked = dataclasses.replace(built.problem, allowed=zigzag_masks(built, others, ring, built.problem))
    unbudgeted = solve(dataclasses.replace(masked, memory_limit=None)).objective
    budgeted = solve(masked).objective
    assert unbudgeted < budgeted * (1 - 1e-6)

    def rebuild(cl: Any, opts: Any) -> Any:
        got = build_problem(captured, cl, opts, memory_limit=limit)
        return got, got

    search = layout._Search(built, bound, rebuild, "auto", 60.0, float("inf"))
    for a in others:  # F1 + F3: the budgeted bound is below Z_a's budgeted optimum over its ringing plans
        zig = build_problem(
            captured, zigzag_cluster(cluster, a), CostOptions(cp_layout="contiguous"), memory_limit=limit
        )
        held = dataclasses.replace(zig.problem, allowed=zigzag_masks(built, (a,), ring, zig.problem))
        optimum = solve(held).objective
        assert budgeted <= optimum * (1 + 1e-12)
        lam = bound.multiplier  # a true lower bound: no BoundExceeded just above the optimum
        assert solve(held, multiplier=lam, ceiling=optimum * (1 + 1e-9)).objective == optimum
        plain = dataclasses.replace(held, peak=None, memory_limit=limit - peak_floor(held))  # as peak.py

        def probed(ceiling: float, plain: Any = plain, lam: Any = lam) -> bool | None:
            run = Run(plain, [reduce_problem(plain)], time.perf_counter(), 60.0, ceiling=ceiling)
            return probe_hint(run, lam)  # the hinted probe, as the wide path makes it

        assert probed(optimum * (1 + 1e-9)) is not None  # probed, not pruned
        with pytest.raises(BoundExceeded) as e:  # and no weaker than the unbudgeted masked bound here
            probed(unbudgeted)
        assert unbudgeted <= e.value.bound <= optimum
        with pytest.raises(BoundExceeded):
            solve(held, multiplier=lam, ceiling=unbudgeted)
    assert search._bounded(others, "zigzag on axes", (unbudgeted + budgeted) / 2)
    assert search.prices and "at least" in search.prices[-1]
    assert not search._bounded(others, "zigzag on axes", budgeted * (1 + 1e-9))
