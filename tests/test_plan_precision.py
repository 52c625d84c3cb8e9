"""``Plan.precision``: the recipe a plan was priced under is in the record, its JSON and its report.

- an amp plan records ``"amp"`` and its report describes fp32 weights + bf16 autocast copies and foreach AdamW
  (not the bf16 recipe's fp32 master); the file round-trips;
- a plan file written before the field existed loads as ``"bf16"``; an unknown recipe is refused in one line
  naming the field and the recipes priced;
- a pipelined amp plan records it too, and its tied weight's gradient sum (GPT-2's embedding and head,
  between the first and last stage) moves the recipe's fp32 gradient: twice the bytes of the bf16 recipe on a
  bf16 model.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import autoshard
from autoshard import zoo
from autoshard.errors import PlanFileError
from autoshard.plans import Plan, load_plan
from autoshard.report.figures import recipe_note
from autoshard.runtime.verify import cluster_for


class _Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(64, 256), torch.nn.Linear(256, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


@pytest.fixture(scope="module")
def plans() -> dict[str, Plan]:
    model = _Mlp().to(torch.bfloat16)
    x = torch.zeros(32, 64, dtype=torch.bfloat16)
    cluster = cluster_for("a100x8", 8)
    return {p: autoshard.plan(model, cluster, (x,), precision=p) for p in ("bf16", "amp")}


def test_the_plan_and_its_report_say_the_recipe(plans: dict[str, Plan], tmp_path: Path) -> None:
    bf16, amp = plans["bf16"], plans["amp"]
    assert (bf16.precision, amp.precision) == ("bf16", "amp")
    assert amp.memory_per_device > bf16.memory_per_device  # 18 vs 16 bytes per parameter, fp32 activations
    text = " ".join(amp.summary(width=200).split())
    assert (
        "amp: fp32 weights + bf16 autocast copies, fp32 grads, foreach AdamW (fp32 moments) sharded" in text
    )
    assert "fp32 master" not in text
    assert "captured dtypes, Adam (fp32 master + moments) sharded" in " ".join(
        bf16.summary(width=200).split()
    )
    amp.save(tmp_path / "amp.json")
    assert load_plan(tmp_path / "amp.json") == amp


def test_older_files_load_as_bf16_and_unknown_recipes_are_refused(
    plans: dict[str, Plan], tmp_path: Path
) -> None:
    data = plans["bf16"].to_json()
    del data["precision"]  # a file written before Plan.precision
    old = tmp_path / "old.json"
    old.write_text(json.dumps(data))
    assert load_plan(old).precision == "bf16"
    for wrong in ("fp8", 16, None):
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps({**data, "precision": wrong}))
        with pytest.raises(PlanFileError) as e:
            load_plan(bad)
        message = str(e.value)
        assert "\n" not in message and "'precision'" in message and "amp, bf16" in message


def test_a_pipelined_amp_plan_prices_its_tied_gradient_in_fp32() -> None:
    case = zoo.build("gpt2-tiny", batch=4, seq=8)
    model = case.model.to(torch.bfloat16)
    cluster = cluster_for("a100x8", 4, (2, 2))
    found = {
        p: autoshard.plan(model, cluster, case.args, pipeline=2, schedule="gpipe", precision=p)
        for p in ("bf16", "amp")
    }
    per_element = {}
    for p, plan in found.items():
        assert plan.precision == p and plan.pipeline is not None
        (tied,) = [c for c in plan.collectives if c.mesh_axis == 0]  # the pipeline axis: the tied sum only
        placement = plan.param_placements["transformer.wte.weight"]
        shards = 2 if placement[1].startswith("S") else 1
        per_element[p] = tied.nbytes * shards / (512 * 64)
    assert per_element == {"bf16": 2.0, "amp": 4.0}


def test_runners_say_in_one_line_when_they_run_another_recipe(plans: dict[str, Plan]) -> None:
    """``verify --plan`` and ``examples/train.py`` run the model's own dtype without autocast: an amp plan gets
    one line saying so (no silent mismatch); a bf16 plan, whose captured dtypes they keep, none."""
    assert recipe_note(plans["bf16"], "verify", "the model's dtype") == ""
    note = recipe_note(plans["amp"], "verify", "the model's dtype without autocast")
    assert note.endswith("\n") and note.count("\n") == 1
    assert "priced for amp: fp32 weights + bf16 autocast copies" in note and "verify runs" in note
