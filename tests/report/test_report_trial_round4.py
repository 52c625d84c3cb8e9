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


def test_notes_that_concern_no_context_parallelism_are_left_out_and_solver_notes_reworded() -> None:
    """A plan with no context-parallel axis printed the layout search and "(over 256 states); each is priced
    once per consumer (an upper bound)"."""
    from autoshard.report.notes import user_notes

    fanout = (
        "7 ops' outputs (in model.norm and 6 more): their consumers can combine too many layouts to price one "
        "redistribution per layout (over 256 states); each is priced once per consumer (an upper bound)"
    )
    notes = (
        "explicit attention masks proven causal (context parallelism runs them per chunk)",
        "context-parallel layout searched: contiguous 5.879 s; zigzag on axis 1 5.882 s (ring on axis 1)",
        fanout,
        "captured 2 of 32 blocks of model.layers",
    )
    plan = dataclasses.replace(cases.megatron_mlp(), notes=notes)
    assert plan.context_axis is None and not plan.ring_transfers
    assert "layout searched" not in render(plan) and "256 states" not in render(plan)
    shown = user_notes(plan)
    assert shown == [
        "step time may be overstated a little: 7 ops' outputs (in model.norm and 6 more) are read in more "
        "layouts than the solver prices together, so each reader's move is counted as if none were shared",
        "captured 2 of 32 blocks of model.layers",
    ]
    context = dataclasses.replace(plan, context_axis=0)
    assert [n for n in user_notes(context) if "context" in n] == list(notes[:2])


def test_small_lines_of_the_trial() -> None:
    """``memory_limit=0.001`` refused as "the memory budget of 0 B"; ``--profile``'s help omitted h100_measured."""
    from autoshard.cli.args import profile_help
    from autoshard.search.problem import format_bytes
    from hardware_profiles import bundled_profiles

    assert format_bytes(0.001) == "0.001 B" and format_bytes(0) == "0 B" and format_bytes(512) == "512 B"
    assert "h100_measured" in bundled_profiles()
    assert all(name in profile_help() for name in bundled_profiles())
