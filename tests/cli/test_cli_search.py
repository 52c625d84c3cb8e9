"""``autoshard search``: the README command, the report, --json, --out, --dot/--svg, annotations, baseline."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from cli_support import autoshard_command, parse_dot

from autoshard.cli import parse_choice
from autoshard.plans import Plan, load_plan
from autoshard.report.table import Baseline


@pytest.mark.slow
def test_readme_command_plans_gpt2_with_the_data_parallel_baseline() -> None:
    # the README's first command, verbatim, through the installed entry point (~10 s: transformers + GPT-2)
    done = subprocess.run(
        [*autoshard_command(), "search", "--profile", "a100x8.json"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    # the first line is the degrees headline (issue 12), the report proper follows
    assert "\nautoshard plan: GPT2LMHeadModel, training, 8 devices\n" in "\n" + out
    assert "transformer.h.0–11 (×12)" in out  # the 12 layers shown once
    assert "data parallel on axis 0" in out  # REFERENCE: GPT-2 124M on 8 GPUs gets data parallel or ZeRO
    assert "predicted step time, memory" in out and "this plan" in out and "data parallel" in out
    assert all(len(line) <= 100 for line in out.splitlines())
    assert "⠋" not in done.stderr and "Traceback" not in done.stderr  # no spinner when stderr is a pipe


def test_mlp_report_names_megatron_and_fits_100_columns(mlp_files: dict[str, Path]) -> None:
    text = mlp_files["report"].read_text()
    assert all(len(line) <= 100 for line in text.splitlines())
    assert "fc1  MLP column-split on axis 0" in text
    assert "fc2  MLP row-split on axis 0" in text
    assert "Megatron column→row on axis 0: fc1 → fc2" in text
    assert "fwd all_reduce" in text  # the one forward all-reduce of b·s·h (REFERENCE, canonical plan 1)
    for section in ("cluster", "mesh", "strategy by module group", "parameter placements", "collectives"):
        assert section in text


def test_json_output_has_the_plan_fields_and_the_report(mlp_files: dict[str, Path]) -> None:
    data = json.loads(mlp_files["json"].read_text())
    for key in ("param_placements", "nodes", "collectives", "predicted_step_time", "memory_per_device"):
        assert key in data
    assert data["param_placements"]["fc1.weight"] == ["S(0)"]
    assert data["param_placements"]["fc2.weight"] == ["S(1)"]
    names = [p["name"] for p in data["report"]["patterns"]]
    assert "Megatron column→row" in names
    assert data["report"]["baseline"]["step_time"] is None  # batch 1 cannot split over 8 devices
    assert "does not split over 8 devices" in data["report"]["baseline"]["reason"]
    # the text report's first line, from the same function (``show`` prints it too)
    assert (
        data["report"]["headline"] == mlp_files["report"].read_text().splitlines()[0] == "TP 8, 1 microbatch"
    )


def test_saved_plan_loads_back_equal(mlp_files: dict[str, Path]) -> None:
    # the same run wrote --out and printed --json: both describe one plan
    printed = Plan.from_json(json.loads(mlp_files["json"].read_text()))
    assert load_plan(mlp_files["plan"]) == printed


def test_dot_option_writes_parseable_dot(mlp_files: dict[str, Path]) -> None:
    graph = parse_dot(mlp_files["dot"].read_text())
    labels = " ".join(str(n.get("label")) for n in graph.get_nodes())
    assert "fc1" in labels and "S(0)" in labels


def test_data_parallel_baseline_that_does_not_fit(cli) -> None:
    # TP fits 4 GiB; the replicated 8192 x 32768 MLP (16 bytes per parameter with Adam) cannot
    r = cli("search", "--profile", "a100x8", "--model", "mlp", "--batch", "8", "--memory-limit", "4")
    assert r.code == 0, r.err
    assert "data parallel: does not fit: no data-parallel plan fits the memory budget of 4.00 GiB" in r.out
    assert "memory budget 4.0 GiB: this plan uses" in r.out


def test_data_parallel_baseline_beside_the_plan(cli) -> None:
    r = cli("search", "--profile", "a100x8", "--model", "seed")
    assert r.code == 0, r.err
    header = next(line for line in r.out.splitlines() if line.startswith("predicted step time"))
    assert header.split()[-2:] == ["data", "parallel"]
    assert "this plan is" in r.out


def test_user_spec_with_repeated_layers_on_a_2d_mesh(cli, wide_plan: Path) -> None:
    assert load_plan(wide_plan).mesh_shape == (2, 4)
    r = cli("show", str(wide_plan))
    assert r.code == 0, r.err
    assert "mesh      (2, 4): axis0=2 (in node), axis1=4 (in node)" in r.out
    # Gradient sync overlaps the next layer's backward (cost_models.overlap, issue 13): splitting the 2048
    # tokens over axis 0 costs a gradient all-reduce that compute hides, so TP stays on axis 1 only
    # (until issue 13 the solver summed every collective and chose TP over both axes).
    assert "layers.0–5 (×6)  sequence on axes 0, 1, MLP column→row on axis 1" in r.out
    assert "layers.0–5.fc1.weight  (R, S(0))" in r.out
    assert "Megatron column→row on axis 1: layers.0–5.fc1 → layers.0–5.fc2" in r.out
    assert "sequence parallel on axis 1 (Megatron-style" in r.out


def test_annotations_pin_patterns_and_placements(cli) -> None:
    r = cli(
        "search", "--profile", "a100x8", "--model", "mlp", "--no-baseline", "--json",
        "--annotate", "fc1=row", "--annotate", "fc2.weight=S(0)",
    )  # fmt: skip
    assert r.code == 0, r.err
    placements = r.json()["param_placements"]
    assert placements["fc1.weight"] == ["S(1)"] and placements["fc2.weight"] == ["S(0)"]


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("column", "column"),
        ("row@0", "row@0"),
        ("S(0)", ("S(0)",)),
        ("(R,S(1))", ("R", "S(1)")),
        ("(S(0), R)", ("S(0)", "R")),
        ("((2, 1), (1, 4))", ((2, 1), (1, 4))),
    ],
)
def test_annotation_choices_parse_to_what_plan_accepts(text: str, parsed: object) -> None:
    assert parse_choice(text) == parsed


def test_svg_is_rendered_when_graphviz_is_there(cli, tmp_path: Path, monkeypatch) -> None:
    fake = tmp_path / "bin" / "dot"  # a stand-in for graphviz: records its arguments, writes the -o file
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\ncat > /dev/null\necho "$@" > "$(dirname "$0")/args"\necho "<svg/>" > "$3"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    assert shutil.which("dot") == str(fake)
    svg = tmp_path / "plan.svg"
    r = cli("search", "--profile", "a100x8", "--model", "mlp", "--no-baseline", "--svg", str(svg))
    assert r.code == 0, r.err
    assert svg.read_text().strip() == "<svg/>"
    assert (fake.parent / "args").read_text().split() == ["-Tsvg", "-o", str(svg)]


def test_baseline_record_round_trips_through_the_json_report() -> None:
    b = Baseline("data parallel", 1.0, 0.5, 0.5, 2.0, 1.0, 80.0)
    assert Baseline.from_report({"baseline": b.as_dict()}) == b
    assert Baseline.from_report({}) is None
    assert Baseline.from_report({"baseline": "not a record"}) is None
