"""The public planning API: plan files, annotations, propagation, memory budgets, errors."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import autoshard
from autoshard import zoo
from autoshard.capture import capture


class Tower(nn.Module):
    """Distinct (not ModuleList) wide layers, so propagation has to carry the pattern layer by layer."""

    def __init__(self, depth: int = 4, hidden: int = 4096) -> None:
        super().__init__()
        self.fcs = nn.Sequential(*[nn.Linear(hidden, hidden, bias=False) for _ in range(depth)])
        self.acts = nn.ModuleList(nn.GELU() for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for fc, act in zip(self.fcs, self.acts, strict=True):
            x = act(fc(x))
        return x


@pytest.fixture(scope="module")
def cluster() -> autoshard.Cluster:
    return autoshard.load_cluster("a100x8")


@pytest.fixture(scope="module")
def gpt2(cluster: autoshard.Cluster):  # type: ignore[no-untyped-def]
    """gpt2-tiny, its capture and its default plan on ``cluster``, made once (a plan is frozen)."""
    case = zoo.build("gpt2-tiny")
    captured = capture(case.model, case.args, case.kwargs)
    return case, captured, autoshard.plan(case.model, cluster, case.args, case.kwargs, captured=captured)


@pytest.fixture(scope="module")
def tower():
    with torch.device("meta"):
        return Tower(), torch.randn(32, 4096)


def test_plan_round_trips_through_json(tmp_path, gpt2) -> None:
    plan = gpt2[2]
    path = tmp_path / "plan.json"
    plan.save(path)
    assert autoshard.load_plan(path) == plan
    data = json.loads(path.read_text())
    assert data["format"] == "autoshard-plan" and data["version"] == 1
    # a REPL echoes load_plan(...): one line, not every node and collective (README snippet; new-user trial)
    text = repr(autoshard.load_plan(path))
    assert "\n" not in text and len(text) < 200, text
    assert text.startswith(f"<Plan {plan.model} on {plan.mesh_shape}: ") and ".summary()" in text


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("{", "broken JSON at line 1"),
        ("[]", "expected a JSON object"),
        ('{"format": "other"}', "not an autoshard plan"),
        ('{"format": "autoshard-plan", "version": 99}', "version 99 is not supported"),
        ('{"format": "autoshard-plan", "version": 1}', "field 'model': missing"),
    ],
)
def test_bad_plan_files_say_what_is_wrong(tmp_path, text: str, match: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(autoshard.PlanFileError, match=match):
        autoshard.load_plan(path)
    with pytest.raises(autoshard.PlanFileError, match="cannot read plan file"):
        autoshard.load_plan(tmp_path / "missing.json")


@pytest.mark.parametrize(
    ("field", "value"),
    [("predicted_step_time", "abc"), ("predicted_step_time", -1.0), ("memory_per_device", None)],
)
def test_a_plan_figure_that_is_no_number_is_named(tmp_path, gpt2, field: str, value: object) -> None:
    """A step time or memory that is not a number >= 0 is refused under its own name (the trial saw 'abc' blamed
    on solver.step_optimal, and a negative step shown as a plan)."""
    data = gpt2[2].to_json()
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({**data, field: value}))
    with pytest.raises(autoshard.PlanFileError, match=f"field '{field}': {value!r} is not a number"):
        autoshard.load_plan(path)


def test_summary_fits_100_columns_and_names_the_cluster(cluster, tower) -> None:
    plan = autoshard.plan(*tower[:1], cluster, tower[1:])
    text = plan.summary()
    assert all(len(line) <= 100 for line in text.splitlines())
    assert "predicted step time" in text and "8 devices" in text


class Block(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(hidden, 4 * hidden, bias=False)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(4 * hidden, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(self.act(self.fc1(x)))


class Stack(nn.Module):
    def __init__(self, depth: int = 6, hidden: int = 2048) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Block(hidden) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def test_propagation_from_one_megatron_layer_reproduces_megatron(cluster) -> None:
    """Pin column -> row on layer 0 only; BFS propagation alone (no search) must give every layer the same."""
    with torch.device("meta"):
        model, x = Stack(), torch.randn(16, 2048)
    pins = {"x": ("R",), "layers.0.fc1": "column", "layers.0.fc2": "row"}
    plan = autoshard.plan(model, cluster, (x,), annotations=pins, search="propagate")
    assert plan.solver.method == "propagate" and not plan.solver.optimal
    for i in range(6):
        assert plan.param_placements[f"layers.{i}.fc1.weight"] == ("S(0)",)
        assert plan.param_placements[f"layers.{i}.fc2.weight"] == ("S(1)",)
    assert sum(1 for c in plan.collectives if c.phase == "forward" and c.kind == "all_reduce") == 6
    exact = autoshard.plan(model, cluster, (x,), annotations=pins)
    assert exact.predicted_step_time <= plan.predicted_step_time * (1 + 1e-9)


def test_search_from_one_megatron_layer_reproduces_megatron_on_distinct_layers(cluster, tower) -> None:
    """Layers that are not one repeated block share no decision: the exact search carries the pattern.

    (Greedy BFS alone does not here: after a row-split layer a reduce-scatter into a hidden-split input
    looks cheaper one step ahead than the all-reduce Megatron pays, though it costs more over two layers.)
    """
    model, x = tower
    pins = {"x": ("R",), "fcs.0": "column", "fcs.1": "row"}
    exact = autoshard.plan(model, cluster, (x,), annotations=pins)
    expected = {f"fcs.{i}.weight": (("S(0)",) if i % 2 == 0 else ("S(1)",)) for i in range(4)}
    assert exact.param_placements == expected
    greedy = autoshard.plan(model, cluster, (x,), annotations=pins, search="propagate")
    assert exact.predicted_step_time < greedy.predicted_step_time


def test_annotation_errors_name_the_target_and_a_fix(cluster, tower) -> None:
    model, x = tower
    with pytest.raises(autoshard.AnnotationError, match=r"'fcs\.9' matches no .*did you mean"):
        autoshard.plan(model, cluster, (x,), annotations={"fcs.9": "column"})
    with pytest.raises(autoshard.AnnotationError, match="cannot read"):
        autoshard.plan(model, cluster, (x,), annotations={"fcs.0.weight": "sideways"})
    with pytest.raises(autoshard.AnnotationError, match="one placement per axis"):
        autoshard.plan(model, cluster, (x,), annotations={"fcs.0.weight": ("S(0)", "R")})


def test_strategy_tuple_annotation_pins_the_op(tower) -> None:
    model, x = tower
    cluster = autoshard.load_cluster("a100x8", mesh=(8,))
    # MindSpore MatMul tuple on aten.linear: input (32, 4096) whole, weight [out, in] split 8 ways over out
    plan = autoshard.plan(model, cluster, (x,), annotations={"fcs.0": ((1, 1), (8, 1))})
    assert plan.param_placements["fcs.0.weight"] == ("S(0)",)


def test_memory_budget_is_respected_or_reported(cluster, gpt2) -> None:
    case, captured, free = gpt2
    # The budget covers everything the plan holds: what the strategies hold, the runtime reserve, gathered
    # weights and the largest temporary (problem/extras.py; itemised in memory_breakdown).
    reserve = free.memory_breakdown["runtime reserve"]
    searched = free.memory_per_device - reserve
    limit = reserve + 0.6 * searched
    tight = autoshard.plan(case.model, cluster, case.args, case.kwargs, memory_limit=limit, captured=captured)
    assert tight.memory_per_device <= limit
    assert tight.predicted_step_time >= free.predicted_step_time * (1 - 1e-9)
    with pytest.raises(autoshard.InfeasibleError, match="memory"):
        autoshard.plan(case.model, cluster, case.args, case.kwargs, memory_limit=1024, captured=captured)


def test_inference_plans_have_no_backward(cluster) -> None:
    case = zoo.build("llama-tiny")
    plan = autoshard.plan(case.model, cluster, case.args, case.kwargs, training=False)
    assert not plan.training
    assert all(c.phase == "forward" for c in plan.collectives)
