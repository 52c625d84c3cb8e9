"""The plan's figures are the solver's objective, hand plans never beat it, and collapsing repeated layers
loses nothing against solving every layer."""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

import autoshard
from autoshard import zoo
from autoshard.capture import Captured, capture
from autoshard.plans import Plan
from autoshard.problem.build import build_problem
from autoshard.problem.costs import CostOptions
from autoshard.search import evaluate, solve
from cost_models.overlap import OverlapPolicy


class DeepMLP(nn.Module):
    def __init__(self, depth: int, hidden: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            *[nn.Sequential(nn.Linear(hidden, hidden, bias=False), nn.ReLU()) for _ in range(depth)]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def test_tiny_mlp_is_fastest_replicated_and_megatron_costs_more() -> None:
    """Replicated was this tiny MLP's optimum while ZeRO-1's gathers were free; priced (problem/zero_terms.py),
    a replicated plan pays an all-gather of each 256 KiB weight after the step, and splitting weights wins:
    the free plan beats both the replicated and the Megatron pins, and is no longer replicated."""
    model, x = DeepMLP(4, 256), torch.randn(32, 256)
    cluster = autoshard.load_cluster("a100x8")
    free = autoshard.plan(model, cluster, (x,), annotations={"x": ("R",)})
    replicated = autoshard.plan(model, cluster, (x,), annotations={"x": ("R",), "*.weight": ("R",)})
    assert set(replicated.param_placements.values()) == {("R",)} and len(replicated.optimizer_gathers) == 4
    assert set(free.param_placements.values()) != {("R",)}
    megatron = {f"layers.{i}.0": ("column" if i % 2 == 0 else "row") for i in range(4)}
    forced = autoshard.plan(model, cluster, (x,), annotations={"x": ("R",), **megatron})
    assert forced.predicted_step_time >= free.predicted_step_time
    assert replicated.predicted_step_time > free.predicted_step_time


def solver_optimum_step(plan: Plan) -> float:
    """The reported step of the solver's own optimum, from ``SolverReport.ranked`` (6 significant digits)."""
    for entry in plan.solver.ranked:
        name, _, seconds = entry.rpartition(": ")
        if name.split(" = ")[0] == "solver optimum":
            return float(seconds.removesuffix(" s"))
    raise AssertionError(f"no solver optimum in {plan.solver.ranked}")


@pytest.mark.parametrize("name", ["seed", "gpt2-tiny", "llama-tiny"])
def test_predicted_step_time_is_the_solver_objective(name: str) -> None:
    case = zoo.build(name)
    plan = autoshard.plan(case.model, autoshard.load_cluster("a100x8"), case.args, case.kwargs)
    # the objective carries a sub-nanosecond memory tie-break; everything else is the same cost functions, but
    # for the gradient sync, which the objective takes as hidden under the layers after it (problem/step.py):
    # since ZeRO-1's gathers are priced these tiny models no longer run replicated, and their syncs show
    sync = plan.grad_sync.seconds if plan.grad_sync is not None else 0.0
    if plan.solver.chosen.split(" = ")[0] == "solver optimum":
        assert abs(plan.predicted_step_time - plan.solver.objective) <= sync + 1e-9
    else:  # the ranking priced a faster candidate than the solver's optimum (planner_candidates): its step
        assert plan.predicted_step_time <= solver_optimum_step(plan) * (1 + 1e-5)  # is of another plan
    hidden = plan.grad_sync.seconds - plan.grad_sync.exposed if plan.grad_sync is not None else 0.0
    step = plan.compute_time + plan.communication_time - hidden  # communication: ZeRO-1's gathers too
    assert step == pytest.approx(plan.predicted_step_time)
    assert 0 < plan.memory_per_device <= plan.device_memory


HAND_PLANS = {
    "data parallel": {"*.weight": ("R",), "*.bias": ("R",)},
    "fsdp": {"*.weight": ("S(0)",)},
}


@pytest.mark.parametrize("hand", sorted(HAND_PLANS))
def test_no_hand_plan_beats_the_search(hand: str) -> None:
    case = zoo.build("gpt2-tiny")
    cluster = autoshard.load_cluster("a100x8", mesh=(8,))
    best = autoshard.plan(case.model, cluster, case.args, case.kwargs)
    try:
        forced = autoshard.plan(case.model, cluster, case.args, case.kwargs, annotations=HAND_PLANS[hand])
    except (
        autoshard.AnnotationError
    ) as e:  # a hand plan that cannot be expressed on this model is no baseline
        pytest.fail(f"hand plan {hand} not expressible: {e}")
    # by the reported step: the ranking's plan (the sync-exposed optimum, 1.25304 ms on 8 devices) against the
    # data-parallel hand plan (1.25308 ms) and FSDP (1.27440 ms); the search's linear optimum (TP 8) steps
    # 1.261 ms, its c_proj biases' syncs showing.  Not proven (bound 1.239 ms), but the ranking prices both hand
    # plans or proves them slower (planner_rerank.HAND_PLANS), so neither beats it
    assert best.solver.objective <= forced.solver.objective * (1 + 1e-9)
    assert best.predicted_step_time <= forced.predicted_step_time * (1 + 1e-9)
    bound = best.solver.step_bound
    assert bound is not None and bound <= best.predicted_step_time * (1 + 1e-9)


@functools.cache
def _llama4_capture(blocks: str) -> Captured:
    """LLaMA-tiny of 4 layers captured once per ``blocks`` for both meshes (a problem build leaves it as it is)."""
    case = zoo.build("llama-tiny", layers=4)
    return capture(case.model, case.args, case.kwargs, blocks=blocks)


def _problem(cap, cluster):
    """Without overlapped gradient sync: the collapsed problem prices a repeated layer's sync once and hides
    its other copies, which an uncollapsed graph (no repeated layers) cannot (arrays.py ``edge_arrays``).
    That never showed while these toys ran replicated; with ZeRO-1's gathers priced they run data parallel."""
    opts = CostOptions(overlap=OverlapPolicy(overlap_grad_sync=False))
    return cap, build_problem(cap, cluster, opts)


def _map_choice(cut, full, cut_choice) -> list[int]:
    """The collapsed plan's choice on the full graph: block nodes by position, the rest in graph order."""
    chosen = dict(zip(cut.variables, cut_choice, strict=True))
    outside_cut = [n for n in cut.variables if cut.infos[n].block is None]
    outside_full = [n for n in full.variables if full.infos[n].block is None]
    assert [cut.infos[n].target for n in outside_cut] == [full.infos[n].target for n in outside_full]
    by_position = {cut.infos[n].block[1]: n for n in cut.variables if cut.infos[n].block is not None}
    mapped = []
    for name in full.variables:
        info = full.infos[name]
        source = by_position[info.block[1]] if info.block else outside_cut[outside_full.index(name)]
        assert [str(s) for s in cut.strategies[source]] == [str(s) for s in full.strategies[name]]
        mapped.append(chosen[source])
    return mapped


@pytest.mark.parametrize("mesh", [(8,), (2, 8)])
def test_collapsed_layers_are_exact_on_the_full_graph(mesh) -> None:
    """Solve LLaMA (4 layers) with layers 1..3 sharing layer 0's variables, map that choice onto the graph
    of every layer and evaluate it there: the cost must be exactly what the collapsed problem claimed."""
    cluster = autoshard.load_cluster("a100x8", nodes=mesh[0] if len(mesh) == 2 else 1, mesh=mesh)
    cut_cap, cut = _problem(_llama4_capture("auto"), cluster)
    full_cap, full = _problem(_llama4_capture("full"), cluster)
    assert cut_cap.blocks is not None and cut_cap.blocks.captured_blocks == 2
    assert full_cap.blocks is not None and full_cap.blocks.captured_blocks == 4
    cut_solution = solve(cut.problem)
    assert cut_solution.optimal
    cut_choice = cut_solution.choice[: len(cut.variables)]  # then the fan-out nodes' states
    on_full = evaluate(full.problem, full.full_choice(_map_choice(cut, full, cut_choice)))
    assert on_full == pytest.approx(cut_solution.objective, rel=1e-9)
    if mesh == (8,):
        # on a 1-D mesh the full graph is small enough to solve exactly: per-layer freedom buys nothing here
        full_solution = solve(full.problem, method="exact")
        assert full_solution.optimal
        assert full_solution.objective == pytest.approx(on_full, rel=1e-9)
