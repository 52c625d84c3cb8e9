"""Plan.grad_buckets: the buckets the step prices (problem/ready.py ``priced_buckets``, SyncStream's rule over the
backward units), saved and loaded with the plan, and checked on load (plan_check.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import autoshard
from autoshard.errors import PlanFileError
from cost_models.overlap import DDP_BUCKET_BYTES


class ThreeLinears(nn.Module):
    """Backward runs fc3, fc2, fc1: fc3's small gradient waits in the open bucket, fc2's fills it past
    25 MiB (issued), fc1's is a bucket by itself -- units, not parameters, close buckets."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(2048, 4096)  # 32 MiB of fp32 weight gradient
        self.fc2 = nn.Linear(4096, 2048)  # 32 MiB
        self.fc3 = nn.Linear(2048, 256, bias=False)  # 2 MiB

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(self.fc2(torch.relu(self.fc1(x))))


@pytest.fixture(scope="module")
def dp_plan() -> autoshard.Plan:
    with torch.device("meta"):
        model, x = ThreeLinears(), torch.randn(8192, 2048)
    return autoshard.plan(model, autoshard.load_cluster("a100x8", mesh=(8,)), (x,), allow=("dp",))


def test_the_plan_records_the_priced_buckets_in_issue_order(dp_plan: autoshard.Plan) -> None:
    buckets = dp_plan.grad_buckets
    assert [b.params for b in buckets] == [
        ("fc3.weight", "fc2.bias", "fc2.weight"),  # ready at fc3's and fc2's units: 34 MiB, issued
        ("fc1.bias", "fc1.weight"),  # ready as backward ends: the priced last bucket
    ]
    assert [b.index for b in buckets] == [0, 1] and {b.bucket_bytes for b in buckets} == {DDP_BUCKET_BYTES}
    assert all(b.kind == "all_reduce" and b.mesh_axis == 0 for b in buckets)
    fc2 = next(n for n in dp_plan.nodes if n.module == "fc2" and n.target.endswith("linear.default"))
    assert buckets[0].unit == fc2.name  # issued after fc2's backward, its last unit
    syncs = {c.node: c.nbytes for c in dp_plan.collectives if c.phase == "backward"}
    for b in buckets:  # the priced bytes of its members' reductions (fp32 gradients)
        assert b.nbytes == sum(syncs[p] for p in b.params)
    assert buckets[1].nbytes == (2048 * 4096 + 4096) * 4
    assert dp_plan.grad_sync is not None and set(dp_plan.grad_sync.last) == set(buckets[-1].params)
    assert "in 2 buckets, " in " ".join(dp_plan.summary().split())  # the report's grad-sync line counts them


def _file(plan: autoshard.Plan, tmp_path: Path, edit: Callable[[dict[str, Any]], Any] | None = None) -> Path:
    data = plan.to_json()
    if edit is not None:
        edit(data)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    return path


def test_buckets_round_trip_and_an_older_file_loads_without_them(
    dp_plan: autoshard.Plan, tmp_path: Path
) -> None:
    assert autoshard.load_plan(_file(dp_plan, tmp_path)) == dp_plan
    older = autoshard.load_plan(_file(dp_plan, tmp_path, lambda d: d.pop("grad_buckets")))
    assert older.grad_buckets == ()  # the runtime then says it uses its own order (runtime/overlap.py)


def _set(i: int, key: str, value: object) -> Callable[[dict[str, Any]], None]:
    def edit(data: dict[str, Any]) -> None:
        data["grad_buckets"][i][key] = value

    return edit


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (_set(0, "params", ["fc9.weight"]), "'fc9.weight' is not a parameter of the plan"),
        (_set(1, "params", ["fc2.weight"]), "'fc2.weight' is in two all_reduce buckets on axis 0"),
        (_set(1, "index", 0), None),  # two records of one stream bucket: allowed
        (_set(0, "index", 2), "is not in issue order"),
        (_set(0, "mesh_axis", 1), "is not an axis of more than one device"),
        (_set(0, "kind", "broadcast"), "must be one of all_reduce"),
        (_set(0, "color", "red"), "unknown field"),
        (lambda d: d.update(pipeline={"stages": [], "schedule": "gpipe"}), "syncs once per step"),
    ],
)
def test_plan_check_refuses_broken_buckets(
    dp_plan: autoshard.Plan, tmp_path: Path, edit: Callable[[dict[str, Any]], None], says: str | None
) -> None:
    path = _file(dp_plan, tmp_path, edit)
    if says is None:
        autoshard.load_plan(path)
        return
    with pytest.raises(PlanFileError, match="grad_buckets") as e:
        autoshard.load_plan(path)
    assert says in str(e.value) and "\n" not in str(e.value)
