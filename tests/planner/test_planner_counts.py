"""``microbatches="auto"`` without stages (:mod:`autoshard.planner_counts`): every count that divides the batch
is priced or pruned by a proven bound, and the plan is no slower than any count pinned (new-user trial: auto
priced 1 and 64 microbatches and returned 5.854 s, while a pinned 4 planned at 4.513 s)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import pytest
import torch
from torch import nn

import autoshard
from autoshard.errors import InfeasibleError
from autoshard.planner_counts import COUNTS_NOTE, plan_counts
from autoshard.report.proof import proof_line
from autoshard.search import BoundExceeded


@dataclass(frozen=True)
class _Priced:  # the fields plan_counts reads of a Plan
    predicted_step_time: float
    microbatches: int
    notes: tuple[str, ...] = ()


def _plan_at(steps: dict[int, float], floors: dict[int, float], calls: list[tuple[int, float]]):
    def plan_at(count: int | None, ceiling: float) -> _Priced:
        m = count or 1
        calls.append((m, ceiling))
        if floors.get(m, 0.0) >= ceiling:
            raise BoundExceeded(floors[m], ceiling)
        if m not in steps:
            raise InfeasibleError(f"no plan fits with {m} microbatches; more devices")
        return _Priced(steps[m], m)

    return plan_at


def test_every_divisor_priced_or_pruned_and_the_fastest_kept() -> None:
    calls: list[tuple[int, float]] = []
    steps, floors = {2: 3.0, 4: 2.0, 8: 2.0}, {8: 1.5, 16: 2.5}
    kept = plan_counts(_plan_at(steps, floors, calls), 16)  # type: ignore[arg-type]
    assert [m for m, _ in calls] == [1, 2, 4, 8, 16]
    assert [c for _, c in calls][1:] == [float("inf"), 3.0, 2.0, 2.0]  # the best so far is each ceiling
    assert kept.microbatches == 4  # the tie at 8 keeps fewer microbatches
    (note,) = kept.notes
    assert note.startswith(COUNTS_NOTE) and "1: refused (no plan fits with 1 microbatches)" in note
    assert "16: at least 2.5 s (a proven lower bound), not solved" in note and note.endswith("kept 4")


def test_every_count_pruned_or_refused_is_bound_exceeded_else_the_refusal() -> None:
    with pytest.raises(BoundExceeded) as err:
        plan_counts(_plan_at({}, {2: 7.0, 4: 6.0}, []), 4, ceiling=5.0)  # type: ignore[arg-type]
    assert err.value.bound == 6.0 and err.value.ceiling == 5.0
    with pytest.raises(InfeasibleError, match="with 1 microbatches"):
        plan_counts(_plan_at({}, {}, []), 2)  # type: ignore[arg-type]


class _Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(256, 4096), nn.Linear(4096, 256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


@functools.cache
def _planned(microbatches: int | str | None, limit: float | None = None) -> autoshard.Plan:
    with torch.device("meta"):
        model, x = _Mlp(), torch.randn(4096, 256)
    cluster = autoshard.load_cluster("a100x8", mesh=(8,))
    return autoshard.plan(model, cluster, (x,), microbatches=microbatches, memory_limit=limit)


def test_auto_is_no_slower_than_any_pinned_count() -> None:
    """A budget between the memory of one microbatch's fastest plan and two's: one microbatch fits only a
    slower plan (0.674 ms against 2's 0.603 ms), and auto used to price only 1 and 4096 (one sample each)."""
    one, two = _planned(None), _planned(2)
    assert two.memory_per_device < one.memory_per_device
    limit = (one.memory_per_device + two.memory_per_device) / 2
    pinned = [_planned(m, limit) for m in (2, 4, 8, 4096)]
    auto = _planned("auto", limit)
    assert auto.predicted_step_time <= min(p.predicted_step_time for p in pinned)
    assert auto.microbatches == 2 and auto.memory_per_device <= limit
    note = next(n for n in auto.notes if n.startswith(COUNTS_NOTE))
    assert f"1: {auto.predicted_step_time:.4g} s" not in note and "4096: at least" in note
    assert proof_line(auto).endswith(
        "every other microbatch count planned or proven no faster (see the note)"
    )


def test_a_fixed_count_is_claimed_only_among_plans_with_it() -> None:
    line = proof_line(_planned(None))
    assert line.endswith("among plans of 1 microbatch per step (--microbatches auto, microbatches='auto' in "
                         "Python, searches the counts)")  # fmt: skip
