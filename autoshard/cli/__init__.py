"""The ``autoshard`` command: a thin shell over the Python API and :mod:`autoshard.report`.

    autoshard search --profile a100x8.json [--model gpt2] [--nodes 2 --mesh 2x8] [--batch 8] [--seq 1024]
                     [--annotate fc1=column ...] [--allow dp | --forbid tp ...] [--memory-limit 40]
                     [--out plan.json] [--dot plan.dot] [--svg plan.svg] [--json] [--no-baseline]
    autoshard show plan.json
    autoshard dot plan.json [-o plan.svg] [--ops]
    autoshard verify --plan plan.json | --model SPEC --nproc 4 [--mesh 2x2] [--profile cpu]
    autoshard explain plan.json [--node fc1]
    autoshard diff a.json b.json
    autoshard shapes --profile a100x8 --model gpt2 --mesh 4x2 --shapes 8x512:0.7,8x1024:0.3
    autoshard profile --out node.json [--ranks 4] [--base a100x8]
    autoshard whatif plan.json --against other.json [...] --vary batch=1..1024 [--vary seq=...] [--show]
    autoshard ops MODEL [--json]

``search`` plans the model, then plans it again as pure data parallel (every parameter replicated, the batch
split over all devices) and prints both side by side.  Errors print one line on stderr and exit with code 2
(usage errors too); ``--debug`` prints the traceback above that line and keeps the exit code.  When the
reader of standard output leaves early (``autoshard show plan.json | head``), the rest of the output is
dropped silently and the command exits with its own code (0 for a report), the same for every subcommand.
A progress line runs on stderr while planning, only when stderr is a terminal.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import traceback
import warnings
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, TextIO

from autoshard.cli import diff, dot, explain, ops, profile, search, shapes, show, verify, whatif
from autoshard.cli.args import CliError, OneLineParser, flag_words, one_line, parse_choice
from autoshard.cli.verify import VERIFY_MODULE
from autoshard.errors import AutoshardError

__all__ = ["COMMANDS", "VERIFY_MODULE", "CliError", "main", "parse_choice"]

# One module per subcommand, each with ``HELP``, ``add_arguments(parser)`` and ``run(args) -> exit code``.
# A new subcommand is a new module and one entry here.
COMMANDS: dict[str, ModuleType] = {
    "search": search,
    "show": show,
    "dot": dot,
    "verify": verify,
    "explain": explain,
    "diff": diff,
    "shapes": shapes,
    "profile": profile,
    "whatif": whatif,
    "ops": ops,
}


def _warning(message: Warning | str, category: type[Warning], *_: Any, **__: Any) -> str:
    return f"autoshard: warning: {one_line(Exception(message))}\n"  # no file and line of autoshard's own code


def _once(show: Callable[..., None]) -> Callable[..., None]:
    """Each distinct warning once per command: every mesh candidate and the baseline plan the same capture,
    and torch's own ``catch_warnings`` blocks reset the ``"once"`` filter's memory."""
    seen: set[tuple[type[Warning], str]] = set()

    def show_once(message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any) -> None:
        key = (category, str(message))
        if key not in seen:
            seen.add(key)
            show(message, category, *args, **kwargs)

    return show_once


class _ReaderMayLeave(io.TextIOBase):
    """Standard output that a reader may close early (``autoshard show plan.json | head -1``).

    Once the pipe is closed, the rest of the output is dropped and the command runs to its end, so it exits
    with its own code: 0 for a report (the reader chose to stop reading, as ``git log | head`` does), 1 when
    verify found a difference.  Nothing is printed about it: there is no error to report.
    """

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.reader_left = False

    def write(self, text: str) -> int:
        if not self.reader_left:
            try:
                self._stream.write(text)
            except BrokenPipeError:
                self._left()
        return len(text)

    def flush(self) -> None:
        if not self.reader_left:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._left()

    def isatty(self) -> bool:
        return self._stream.isatty()

    def _left(self) -> None:
        self.reader_left = True
        # what stays buffered in the real stdout would fail again when Python flushes it at exit
        with contextlib.suppress(OSError, ValueError, AttributeError, io.UnsupportedOperation):
            os.dup2(os.open(os.devnull, os.O_WRONLY), self._stream.fileno())


def _parser() -> argparse.ArgumentParser:
    common = OneLineParser(add_help=False)
    common.add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS,
        help="print an error's traceback too (the exit code stays 2)",
    )
    parser = OneLineParser(
        prog="autoshard", description="Auto-parallel planner for PyTorch models.", parents=[common]
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module in COMMANDS.items():
        module.add_arguments(sub.add_parser(name, parents=[common], help=module.HELP))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (0 ok, 1 verify found a difference, 2 error, 130 interrupted)."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:  # argparse: --help (0) or a usage error (2), message already printed
        return int(e.code) if isinstance(e.code, int) else 2
    debug = getattr(args, "debug", False)
    out = _ReaderMayLeave(sys.stdout)
    formatwarning = warnings.formatwarning  # catch_warnings restores showwarning and the filters, not this
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(out):
            if not debug:
                warnings.formatwarning = _warning
            warnings.showwarning = _once(warnings.showwarning)
            code = int(COMMANDS[args.command].run(args))
            out.flush()
            return code
    except BrokenPipeError:  # another pipe than stdout (stdout's is handled by _ReaderMayLeave)
        print("autoshard: error: a pipe closed while the command ran", file=sys.stderr)
        return 2
    except AutoshardError as e:
        if debug:  # the traceback, then the same line and exit code as without --debug
            traceback.print_exception(e, file=sys.stderr)
        print(f"autoshard: error: {flag_words(one_line(e))}", file=sys.stderr)  # flags, not Python names
        return 2
    except KeyboardInterrupt:
        print("autoshard: interrupted", file=sys.stderr)
        return 130
    finally:
        warnings.formatwarning = formatwarning  # a caller's (or a test's) warnings keep their own form
