"""The fidelity benchmark's planned runs: Megatron's published configuration pinned in autoshard.plan."""

from __future__ import annotations

import pytest

from benchmarks.fidelity_memory import TITAN_MEMORY
from benchmarks.fidelity_memory import _pins as memory_pins
from benchmarks.fidelity_planned import MEGATRON_PINS, _pins, planned_case
from benchmarks.fidelity_runs import RUNS

pytest.importorskip("transformers")


def test_pins_fix_megatrons_chunks_and_tensor_parallelism() -> None:
    for run in (r for r in RUNS if r.source.startswith("Korthikanti")):
        pins = _pins(run)
        cuts = sorted(int(k.split(".")[1]) for k, v in pins.items() if v == "stage")
        chunks = run.pp * run.virtual_stages
        assert len(cuts) == (chunks - 1 if run.pp > 1 else 0)
        if cuts:  # equal chunks of layers / (p v) layers, as Megatron splits them
            assert cuts == list(
                range(run.model.layers // chunks, run.model.layers, run.model.layers // chunks)
            )
        assert MEGATRON_PINS.items() <= pins.items()
    fsdp, two_d = memory_pins(TITAN_MEMORY[0]), memory_pins(TITAN_MEMORY[-1])
    assert fsdp == {"input_ids": "S(0)", "*.weight": ("S(0)",)}
    assert two_d["*.o_proj"] == "row" and two_d["*.down_proj.weight"] == "(S(0), S(1))"


def test_korthikanti_22b_through_the_planner_is_within_10_percent() -> None:
    """Issue 13's acceptance for the 22B full-recompute run, priced by autoshard.plan itself."""
    run = next(r for r in RUNS if r.key == "22B full")
    got = planned_case(run.key)
    assert got["recompute"] == "full" and got["headline"].startswith("TP 8")
    assert abs(got["step_s"] / run.step_seconds - 1) <= 0.10
