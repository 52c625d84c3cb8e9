"""Helpers shared by the CLI tests: run ``main`` in-process, find the entry point, parse DOT."""

from __future__ import annotations

import contextlib
import io
import json
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pydot

from autoshard.cli import main

HERE = Path(__file__).parent
WIDE = f"{HERE / 'cli_models.py'}:wide_stack"
"""A user-spec model: six 8192-wide residual MLP blocks on the meta device (plans in about a second)."""


@dataclass(frozen=True)
class Result:
    """Exit code and captured output of one ``main`` call."""

    code: int
    out: str
    err: str

    def json(self) -> dict[str, Any]:
        data = json.loads(self.out)
        assert isinstance(data, dict)
        return data


def run_main(*argv: str) -> Result:
    """``main(argv)`` with stdout and stderr captured (usable from session fixtures, unlike capsys)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return Result(code, out.getvalue(), err.getvalue())


def autoshard_command() -> list[str]:
    """The installed console script, or the same entry point through this interpreter."""
    script = Path(sys.executable).parent / "autoshard"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from autoshard.cli import main; sys.exit(main())"]


def parse_dot(text: str) -> pydot.Dot:
    """Parse DOT text with pydot (its parser's deprecation warnings silenced); exactly one graph."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        graphs = pydot.graph_from_dot_data(text)
    assert graphs is not None and len(graphs) == 1
    return graphs[0]
