"""The progress line: drawn on a terminal only, erased when done."""

from __future__ import annotations

import io
import time

from autoshard.report.progress import Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_draws_title_stage_and_seconds_on_a_terminal() -> None:
    stream = Terminal()
    with Progress("building gpt2", stream=stream, interval=0.01) as progress:
        progress.start("planning gpt2")
        progress.stage("capture")
        time.sleep(0.1)
    text = stream.getvalue()
    assert "planning gpt2: capture" in text and " s" in text
    assert text.endswith("\r\033[K")  # the line is erased at the end


def test_progress_is_silent_when_not_a_terminal() -> None:
    stream = io.StringIO()
    with Progress("building gpt2", stream=stream, interval=0.01) as progress:
        progress.stage("capture")
        time.sleep(0.05)
    assert stream.getvalue() == ""
    assert progress.line().startswith("⠋ building gpt2: capture  0.")


def test_search_shows_no_progress_when_stderr_is_captured(cli, mlp_files) -> None:
    r = cli("show", str(mlp_files["plan"]))
    assert r.err == ""
