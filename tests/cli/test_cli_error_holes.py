"""The error holes a new user fell into: each ends in one line on stderr and exit code 2, never a
traceback, a usage block or torch's own log."""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from cli_support import HERE, autoshard_command

from autoshard.cli import main

BAD = """
import torch
from torch import nn


def wrong_shape():
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)), torch.randn(4, 9)


class Complex(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        y = torch.view_as_complex(torch.roll(self.fc(x), 1, 0).reshape(4, 4, 2))
        return torch.view_as_real(y * y).sum()


def complex_model():
    return Complex(), torch.randn(4, 8)
"""


@pytest.fixture(scope="module")
def bad_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("bad") / "bad_models.py"
    path.write_text(BAD)
    return path


def _one_line(result, *words: str) -> None:
    assert result.code == 2, (result.out, result.err)
    assert result.err.count("\n") == 1, result.err
    assert "Traceback" not in result.err and "usage:" not in result.err
    for w in words:
        assert w in result.err, result.err


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (("search", "--profile"), "argument --profile: expected one argument; see `autoshard search --help`"),
        (("search", "--profile", "a100x8", "--mesh", "8x"), "mesh '8x'"),
        (("search", "--profile", "a100x8", "--nodes", "zero"), "'zero' is not a whole number"),
        (("frobnicate",), "invalid choice"),
        (
            ("search", "--profile", "a100x8", "--memory-limit", "500"),
            "more than the 79.151 GiB of one a100x8 device",
        ),
        (("search", "--profile", "a100x8", "--memory-limit", "1e-9"), "below 1 MiB"),
        (
            ("search", "--profile", "a100x8", "--model", "gpt2-tiny", "--seq", "128"),
            "beyond the 64 positions",
        ),
    ],
    ids=["missing-value", "mesh-8x", "nodes-word", "command", "memory-huge", "memory-tiny", "seq-positions"],
)
def test_argument_errors_are_one_line(cli, argv: tuple[str, ...], words: str) -> None:
    _one_line(cli(*argv), words)


def test_wrong_input_shape_is_one_line_without_torch_log(capfd, bad_models: Path) -> None:
    code = main(["search", "--profile", "a100x8", "--model", f"{bad_models}:wrong_shape"])
    out, err = capfd.readouterr()
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "fake_tensor" not in err and "Traceback" not in err, err
    assert "shapes do not fit the model" in err and ".item()" not in err


def test_complex_tensors_are_planned_and_warnings_name_the_op_not_our_files(capfd, bad_models: Path) -> None:
    with warnings.catch_warnings():  # undo pytest's recording: print warnings as the command line does
        warnings.simplefilter("always")
        warnings.showwarning = _print_warning
        code = main(
            ["search", "--profile", "a100x8", "--model", f"{bad_models}:complex_model", "--no-baseline"]
        )
    _, err = capfd.readouterr()
    assert code == 0, err
    assert "profile" not in err
    lines = [line for line in err.splitlines() if "warning" in line]
    per_node = [w for w in lines if "graph node" in w]  # complex views have rules; roll has none
    assert per_node and all(
        w.startswith("autoshard: warning: no sharding rule for aten.roll") for w in per_node
    )
    assert all("the model's own forward" in w and ".py" not in w for w in per_node)
    assert any("of the step's forward FLOPs run replicated" in w for w in lines)  # the planner's summary
    assert not any("view_as" in w for w in lines)


def _print_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """What Python does with a warning outside pytest: write ``formatwarning``'s text to stderr."""
    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


class _ClosedPipe(io.StringIO):
    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


@pytest.mark.parametrize("command", ["show", "explain", "dot"])
def test_a_closed_pipe_is_a_clean_exit(mlp_files: dict[str, Path], command: str) -> None:
    """``autoshard show plan.json | head``: the reader left; no error, exit 0, for every subcommand."""
    err = io.StringIO()
    with contextlib.redirect_stdout(_ClosedPipe()), contextlib.redirect_stderr(err):
        code = main([command, str(mlp_files["plan"])])
    assert (code, err.getvalue()) == (0, "")


def test_a_closed_pipe_keeps_the_commands_own_exit_code(mlp_files: dict[str, Path], monkeypatch) -> None:
    """A command that found something wrong (verify: 1) still says so when nobody reads its report."""
    from autoshard.cli import COMMANDS

    def mismatch(args) -> int:  # what verify does on a MISMATCH: print the report, return 1
        print("verify mlp on mesh (8,): MISMATCH\n" * 1000)
        return 1

    monkeypatch.setattr(COMMANDS["show"], "run", mismatch)
    err = io.StringIO()
    with contextlib.redirect_stdout(_ClosedPipe()), contextlib.redirect_stderr(err):
        code = main(["show", str(mlp_files["plan"])])
    assert (code, err.getvalue()) == (1, "")


def test_a_real_closed_pipe_exits_0_silently(mlp_files: dict[str, Path]) -> None:
    """The console script with its stdout pipe closed before it writes (``| head`` that already left)."""
    proc = subprocess.Popen(
        [*autoshard_command(), "show", str(mlp_files["plan"])],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    proc.stdout.close()  # the reader leaves before the first line
    _, err = proc.communicate(timeout=120)
    assert (proc.returncode, err) == (0, "")


def _footer(report: str) -> str:
    footer = report[report.index("\nsolver ") + 1 :]
    return " ".join(footer.split("\nnote:")[0].split())


def test_timing_line_says_what_the_rest_was(mlp_files: dict[str, Path]) -> None:
    footer = _footer(mlp_files["report"].read_text())
    assert re.search(
        r"planned in [\d.]+ s: model [\d.]+ [mu]?s, plan on 8 [\d.]+ [mu]?s \(capture [\d.]+ [mu]?s, strategies",
        footer,
    ), footer
    assert "solve " in footer and "report " in footer and "building the model" not in footer


def test_timing_line_splits_every_mesh_candidate_and_the_baseline(cli) -> None:
    """Was: "other 10.375 s: building the model and planning the baseline" with mesh search inside it."""
    r = cli("search", "--profile", "a100x8", "--model", "mlp")
    assert r.code == 0, r.err
    footer = _footer(r.out)
    timing = footer.split("; ", 1)[1].split(": ", 1)[1]  # after "planned in 3.2 s: "
    phases = [p.rsplit(" ", 2) for p in re.sub(r" \([^)]*\)", "", timing).split(", ")]
    names = [name for name, _, _ in phases]
    assert names[:2] == ["model", "capture"] and names[-1] in ("report", "other"), footer
    assert {"mesh 8", "mesh 4x2", "mesh 2x2x2", "data-parallel baseline", "report"} <= set(names), footer
    for mesh in ("8", "4x2", "2x2x2"):  # planned (its stages) or bounded before planning (said so)
        # a stage under 0.5 ms is not listed (report/timing.py): mesh 8's strategies now take ~0.5 ms
        planned = rf"mesh {mesh} [\d.]+ [mu]?s \((strategies [\d.]+ [mu]?s, )?solve"
        assert re.search(planned, footer) or re.search(
            rf"mesh {mesh} [\d.]+ [mu]?s \(bounded, pruned", footer
        ), footer
    assert re.search(r"\(strategies [\d.]+ [mu]?s, solve", footer), footer  # the winner was planned
    total = float(re.search(r"planned in ([\d.]+) s", footer).group(1))
    scale = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
    listed = sum(float(v) * scale[unit] for name, v, unit in phases)
    assert listed == pytest.approx(total, abs=0.06)  # the phases add up to the wall time (rounded to 0.1 s)


def test_readme_says_svg_needs_graphviz() -> None:
    readme = (HERE.parent.parent / "README.md").read_text()
    assert "need graphviz's `dot` program" in readme
