"""A one-line progress display for long phases, on stderr and only when stderr is a terminal.

The line shows a spinner, the phase title, the current stage (when the pipeline reports stages through the
``progress`` callback of :func:`autoshard.plan`) and the seconds spent::

    ⠹ planning llama3-8b: capture  3.2 s

Redirected or piped output never sees it, so logs and ``--json`` stay clean.  A daemon thread redraws the
line ten times a second; leaving the context erases it.

Example::

    with Progress("building gpt2") as progress:
        progress.start("planning gpt2")
        progress.stage("capture")
"""

from __future__ import annotations

import sys
import threading
import time
from types import TracebackType
from typing import TextIO

__all__ = ["Progress"]

_FRAMES = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"


class Progress:
    """Context manager drawing ``title: stage  seconds`` on ``stream`` while active (TTY only)."""

    def __init__(self, title: str, stream: TextIO | None = None, interval: float = 0.1) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = bool(getattr(self.stream, "isatty", lambda: False)())
        self.interval = interval
        self._title = title
        self._stage = ""
        self._since = time.perf_counter()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self, title: str) -> None:
        """Begin a new phase: new title, clock reset, no stage."""
        with self._lock:
            self._title, self._stage, self._since = title, "", time.perf_counter()

    def stage(self, name: str) -> None:
        """Name the stage the phase is in (the pipeline's ``progress`` callback)."""
        with self._lock:
            self._stage = name

    def line(self, frame: int = 0) -> str:
        with self._lock:
            stage = f": {self._stage}" if self._stage else ""
            elapsed = time.perf_counter() - self._since
            return f"{_FRAMES[frame % len(_FRAMES)]} {self._title}{stage}  {elapsed:.1f} s"

    def __enter__(self) -> Progress:
        if self.enabled:
            self._thread = threading.Thread(target=self._run, name="autoshard-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._draw("")

    def _run(self) -> None:
        frame = 0
        while not self._stop.wait(self.interval):
            self._draw(self.line(frame))
            frame += 1

    def _draw(self, text: str) -> None:
        self.stream.write("\r\033[K" + text)  # carriage return, erase to the end of the line
        self.stream.flush()
