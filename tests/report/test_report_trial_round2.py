"""Report and CLI lines of the second new-user trial, one test each: a collective row of the model's
return value read "output of" with nothing after it."""

from __future__ import annotations

import sys
from pathlib import Path

from autoshard.report.table import render

sys.path.insert(0, str(Path(__file__).parents[1] / "cli"))  # the hand-written plans of the report tests
import report_cases as cases


def test_a_collective_on_the_model_output_is_named() -> None:
    """``train.py plan ... --layout fsdp`` listed "fwd all_reduce 0 1 4 B 501.5 us output of": the loss,
    summed over the batch axis at the root module, whose path is empty."""
    ops = [("linear", "fc", cases.LINEAR, "S(0), R -> S(0)")]
    comms = [cases.collective("all_reduce", "forward", "linear", "output", "", nbytes=4)]
    report = render(cases.make_plan((8,), {"fc.weight": ("R",)}, ops, comms, inputs={"x": ("S(0)",)}))
    row = next(line for line in report.splitlines() if "all_reduce" in line and "4 B" in line)
    assert row.rstrip().endswith("the model's output (its return value)")
