"""Report lines of the fourth new-user trial, one test each, on hand-written plans: a ZeRO-1 plan's gradient
all-reduces and the note saying they are reduce-scatters and all-gathers; a gradient's all-gather read as a
weight's."""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

from autoshard.report.table import render

sys.path.insert(0, str(Path(__file__).parents[1] / "cli"))  # the hand-written plans of the report tests
import report_cases as cases


def _rows(text: str) -> dict[str, str]:
    """``"bwd all_reduce 0"`` -> the row's "what" (the table's last column)."""
    out = {}
    for line in text.splitlines():
        cells = line.split()
        if cells[:1] in (["fwd"], ["bwd"], ["opt"]) and len(cells) > 7:
            out[" ".join(cells[:3])] = " ".join(cells[8:])  # phase kind axis count bytes unit time unit
    return out


def test_zero1_labels_name_each_collective_and_agree_with_the_optimizer_note() -> None:
    """DP 16 read "bwd all_reduce ... gradient sync" beside "ZeRO-1: its reduce-scatters and all-gathers are the
    gradient syncs"; a gradient's all-gather read "gradient sync" as if weights were gathered."""
    plan = cases.data_parallel_and_fsdp()  # fc.weight (R, S(0)): replicated on axis 0, stored split on axis 1
    w = cases.param_node("fc.weight")
    hop = cases.collective("all_gather", "backward", w, "fc.weight", "fc", axis=1)
    plan = dataclasses.replace(plan, collectives=(*plan.collectives, hop))
    text = render(plan, width=100)
    rows = _rows(text)
    assert rows["bwd all_reduce 0"] == "gradient sync (ZeRO-1 split: see optimizer)"  # replicated on axis 0
    assert rows["bwd reduce_scatter 1"] == "gradient sync"  # stored split on axis 1: FSDP's sync
    assert rows["bwd all_gather 1"] == "gradient sync (gathers gradient shards)"
    assert rows["fwd all_gather 1"] == "weight all-gather (FSDP)"
    wrapped = text[text.index("optimizer: Adam") :]
    note = " ".join(re.sub(r"-\n\s*", "-", wrapped).split())  # lines wrapped at a hyphen joined
    assert note.startswith(
        "optimizer: Adam state sharded over 16 devices (ZeRO-1): 1 gradient all-reduce of replicated weights "
        "(the bwd rows marked ZeRO-1) runs as a reduce-scatter of the gradient, then an all-gather of the "
        "updated weights"
    )
