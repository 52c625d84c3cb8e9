"""Every error the CLI can meet: one line on stderr saying what and how to fix it, exit code 2, no traceback."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from cli_support import WIDE, autoshard_command

from autoshard.cli import main

HERE = Path(__file__).parent
MLP = ("search", "--profile", "a100x8", "--model", "mlp", "--no-baseline")


def assert_one_line_error(result, *fragments: str) -> None:
    assert result.code == 2, (result.out, result.err)
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("autoshard: error: "), result.err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    assert result.out == ""


@pytest.fixture
def broken_profile(tmp_path: Path) -> Path:
    path = tmp_path / "broken.json"
    path.write_text('{"name": "x", ')
    return path


@pytest.mark.parametrize(
    ("argv", "fragments"),
    [
        (("--profile", "nope"), ("hardware profile 'nope'", "bundled profile name (a100x8")),
        (("--profile", "a100x8", "--model", "gpt5"), ("unknown zoo model 'gpt5'", "valid names:", "gpt2")),
        (("--profile", "a100x8", "--mesh", "3x3"), ("mesh (3, 3) has 9 devices", "e.g. (8,)")),
        (("--profile", "a100x8", "--nodes", "2", "--mesh", "4x2"), ("mesh (4, 2) has 8 devices", "(2, 8)")),
        (("--profile", "a100x8", "--model", "missing.py:make"), ("no such file missing.py",)),
        (("--profile", "a100x8", "--model", f"{HERE / 'cli_models.py'}:nothing"), ("defines no function",)),
        (
            ("--profile", "a100x8", "--model", f"{HERE / 'cli_models.py'}:broken"),
            ("this model cannot be built",),
        ),
        (("--profile", "a100x8", "--model", WIDE, "--batch", "4"), ("--batch/--seq apply to zoo models",)),
    ],
)
def test_bad_cluster_or_model(cli, argv: tuple[str, ...], fragments: tuple[str, ...]) -> None:
    assert_one_line_error(cli("search", *argv), *fragments)


def test_broken_profile_json(cli, broken_profile: Path) -> None:
    assert_one_line_error(cli("search", "--profile", str(broken_profile)), "invalid JSON at line 1")


def test_dimension_not_divisible_by_its_axis(cli) -> None:
    # batch 1 of the MLP cannot be split over 8 devices
    r = cli(*MLP, "--annotate", "x=S(0)")
    assert_one_line_error(r, "x cannot be placed S(0)", "(1, 1024, 8192)", "must divide by its axis size")


def test_annotation_that_matches_nothing(cli) -> None:
    assert_one_line_error(cli(*MLP, "--annotate", "fc9=column"), "'fc9'")


def test_infeasible_memory_limit(cli) -> None:
    r = cli(*MLP, "--memory-limit", "0.01")
    assert_one_line_error(r, "no plan fits the memory budget of 10.24 MiB", "raise the memory limit")


def test_output_directory_missing_fails_before_planning(cli, tmp_path: Path) -> None:
    r = cli(*MLP, "--out", str(tmp_path / "no" / "plan.json"))
    assert_one_line_error(r, "does not exist", "create it first")


def test_svg_without_graphviz_fails_before_planning(cli, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr("autoshard.report.dot.shutil.which", lambda name: None)
    r = cli(*MLP, "--svg", str(tmp_path / "plan.svg"))
    assert_one_line_error(r, "graphviz's `dot` is not installed", "--dot plan.dot")


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("{broken", "broken JSON at line 1"),
        ('{"format": "other"}', "not an autoshard plan"),
        ('{"format": "autoshard-plan", "version": 1}', "field 'model': missing"),
    ],
)
def test_unreadable_plan_files(cli, tmp_path: Path, text: str, fragment: str) -> None:
    path = tmp_path / "plan.json"
    path.write_text(text)
    assert_one_line_error(cli("show", str(path)), fragment)
    assert_one_line_error(cli("dot", str(path)), fragment)


def test_missing_plan_file(cli, tmp_path: Path) -> None:
    assert_one_line_error(cli("show", str(tmp_path / "none.json")), "cannot read plan file", "check the path")


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        ((), "the following arguments are required: COMMAND"),
        (("search",), "the following arguments are required: --profile"),
        (("search", "--profile", "a100x8", "--mesh", "2xa"), "write axis sizes like 2x8"),
        (("search", "--profile", "a100x8", "--nodes", "0"), "must be at least 1"),
        (("search", "--profile", "a100x8", "--memory-limit", "-3"), "positive finite number"),
        (("search", "--profile", "a100x8", "--annotate", "fc1"), "write TARGET=CHOICE"),
        (("search", "--profile", "a100x8", "--annotate", "fc1=diagonal"), "neither a pattern"),
        (("search", "--profile", "a100x8", "--annotate", "fc1=((2, 0),)"), "split tuple looks like"),
        (("frobnicate",), "invalid choice: 'frobnicate'"),
        (
            ("search", "--profile", "a100x8", "--max-axes", "9"),
            "'9' is outside 1 to 4 (--mesh auto tries meshes",
        ),
        (("search", "--profile", "a100x8", "--max-axes", "0"), "'0' is outside 1 to 4"),
        (
            ("search", "--profile", "a100x8", "--schedule", "foo"),
            "'foo' is not a schedule; use one of auto, gpipe",
        ),
    ],
)
def test_usage_errors_exit_2(cli, argv: tuple[str, ...], fragment: str) -> None:
    r = cli(*argv)
    assert r.code == 2 and r.err.count("\n") == 1
    assert fragment in r.err and "Traceback" not in r.err


def test_debug_shows_the_traceback_and_keeps_exit_code_2(capsys: pytest.CaptureFixture[str]) -> None:
    # --debug promises the traceback, not another exit code: the same one line ends stderr, exit 2
    for argv in (["search", "--profile", "nope", "--debug"], ["--debug", "search", "--profile", "nope"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("Traceback (most recent call last)") and "ProfileError" in err, err
        assert err.strip().splitlines()[-1].startswith("autoshard: error: hardware profile 'nope'"), err


def test_error_exit_code_through_the_entry_point() -> None:
    done = subprocess.run(
        [*autoshard_command(), "search", "--profile", "nope.json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("autoshard: error: hardware profile")
