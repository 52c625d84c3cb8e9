"""A layout pin names what the weight is on every mesh axis that splits it (autoshard/annotations.py):
``column`` is never split on the input dim anywhere, ``row`` never on the output dim, ``replicate`` never at
all.  New-user trial: ``fc1=column`` on a 2 x 2 x 2 mesh left fc1.weight ``(S(0), S(1), S(0))``, row-split
on axis 1 (the pin bound the last axis only)."""

from __future__ import annotations

import functools

import pytest

import autoshard
from autoshard import zoo
from autoshard.capture import capture
from autoshard.report.labels import parse_label

MESH = (2, 2, 2)


@functools.cache
def _mlp():
    case = zoo.build("mlp")
    return case, capture(case.model, case.args, dict(case.kwargs), blocks="auto")


def _plan(annotations) -> autoshard.Plan:
    case, captured = _mlp()
    cluster = autoshard.load_cluster("a100x8", mesh=MESH)
    return autoshard.plan(
        case.model, cluster, case.args, case.kwargs, captured=captured, annotations=annotations
    )


def _used(plan: autoshard.Plan, module: str) -> tuple[str, ...]:
    """How the module's linear uses its weight, one placement per axis (the label's weight operand)."""
    node = next(n for n in plan.nodes if n.module == module and "linear" in n.target)
    weight = parse_label(node.strategy).input(1)
    assert weight is not None
    return tuple(weight)


@pytest.mark.parametrize(
    ("pins", "never"),
    [
        ({"fc1": "column"}, {"fc1": "S(1)"}),  # the trial's case: was (S(0), S(1), S(0))
        ({"fc1": "column@0", "fc2": "row"}, {"fc1": "S(1)", "fc2": "S(0)"}),
        ({"fc2": "row@1"}, {"fc2": "S(0)"}),
    ],
)
def test_a_pattern_holds_on_every_axis(pins, never) -> None:
    plan = _plan(pins)
    for module, other in never.items():
        stored, used = plan.param_placements[f"{module}.weight"], _used(plan, module)
        assert other not in stored and other not in used, (module, stored, used)
        name, _, axis = pins[module].partition("@")
        want = "S(0)" if name == "column" else "S(1)"
        tp_axis = int(axis) if axis else len(MESH) - 1
        assert stored[tp_axis] == used[tp_axis] == want  # the named axis is split as pinned
        assert set(stored) <= {want, "R"} and set(used) <= {want, "R"}


def test_replicate_is_replicated_on_every_axis() -> None:
    plan = _plan({"fc1": "replicate", "fc2": "replicate"})
    for module in ("fc1", "fc2"):
        assert set(plan.param_placements[f"{module}.weight"]) == {"R"}
        assert set(_used(plan, module)) == {"R"}


def test_a_placement_pin_decides_the_storage_beside_a_layout_pin() -> None:
    """torchtitan's 2-D layout: ``row`` use with FSDP storage on dim 0 of the other axis (the fidelity memory
    runs pin exactly this); the use still holds the pattern on every axis."""
    case, captured = _mlp()
    cluster = autoshard.load_cluster("a100x8", mesh=(2, 4))
    plan = autoshard.plan(
        case.model, cluster, case.args, case.kwargs, captured=captured,
        annotations={"fc2": "row", "fc2.weight": "(S(0), S(1))"},
    )  # fmt: skip
    assert tuple(plan.param_placements["fc2.weight"]) == ("S(0)", "S(1)")
    used = _used(plan, "fc2")
    assert used[1] == "S(1)" and "S(0)" not in used
