"""Start a script on N local ranks through torch's own launcher, and end a failed job in one line.

``torchrun`` ends every job whose worker exits non-zero by raising ``ChildFailedError`` out of its entry point
(``torch.distributed.launcher.api.launch_agent``; ``@record`` only copies the worker's error file into the
failure table it prints), so a Python traceback and that table follow even a worker's own one-line exit 2,
and torchrun exits 1.  No worker can change that: the launcher has to.  :func:`run_local` runs the launch
``torchrun --standalone --nproc_per_node N`` runs (torch's argument parser, rendezvous and elastic agent) and
turns a failure into one line and an exit code:

- a worker that ended through :func:`fail` wrote its message to torch's per-worker error file
  (``TORCHELASTIC_ERROR_FILE``) and exited 2: the first such message, exit 2;
- any other failure: ``rank R (pid P) exited with code C: Type: message`` when the worker ran under
  :func:`worker` (or torch's ``@record``; its traceback is above), else ``... (its output is above)``, and
  that code (128 + the signal for a rank killed by one); the launcher interrupted (Ctrl-C, SIGTERM): one
  line, 128 + the signal.

Under plain ``torchrun`` (several nodes), :func:`fail` prints its line on rank 0 and torchrun's failure table
shows it as the root cause, below torch's own traceback.

Example (``examples/train.py run``)::

    if "LOCAL_RANK" not in os.environ:          # the launcher: check the input once, then start the ranks
        check(args)                             # -> fail("...") before any worker starts
        sys.exit(run_local(4, [__file__, *sys.argv[1:]]))

    if __name__ == "__main__":
        worker(main)                            # a rank's exception: named in the launcher's one line
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NoReturn

__all__ = ["LAUNCHED", "fail", "run_local", "worker"]

ONE_LINE = "autoshard_one_line"
"""Marks an error record written by :func:`fail`: its message is the whole story, no traceback behind it."""

LAUNCHED = "AUTOSHARD_LOCAL_JOB"
"""Set in the workers :func:`run_local` starts: the launcher prints a failed worker's line, the worker does not."""


def fail(message: str) -> NoReturn:
    """End this process with exit code 2 after reporting ``message`` (one line) once for the whole job.

    The message goes to torch's error file for this worker when a torch launcher set one, so the launcher can
    name the cause.  It is printed on stderr here only when no :func:`run_local` launcher will print it, and
    then by rank 0 alone (every rank usually meets the same bad input)."""
    _record(message, {"py_callstack": message, ONE_LINE: True})  # our line in place of a traceback
    if LAUNCHED not in os.environ and os.environ.get("RANK", "0") == "0":
        print(message, file=sys.stderr, flush=True)
    _leave_group()
    raise SystemExit(2)


def worker(main: Callable[[], None]) -> None:
    """Run a worker's entry point; an exception it raises is recorded in torch's per-worker error file, then
    raised on (its traceback printed), so that :func:`run_local` ends the job naming it in one line.

    torch's own ``@record`` does the same for ``Exception`` only, and torch.distributed.checkpoint's
    ``CheckpointException`` (a failed save or load) is a ``BaseException``: a rank dying of it was named by
    its exit code alone."""
    warnings.formatwarning = functools.partial(_rank_warning, warnings.formatwarning)
    try:
        main()
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as e:
        _record(f"{type(e).__name__}: {e}", {"py_callstack": traceback.format_exc()})
        raise


def _rank_warning(
    plain: Callable[..., str], message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any
) -> str:
    """autoshard's own warnings as one line naming the rank (a plan mismatch the runtime says once), not the
    file, line and source of the code that raised it; anything else as ``plain`` (Python's) formats it."""
    if not category.__module__.startswith("autoshard."):
        return plain(message, category, *args, **kwargs)
    text = " ".join(str(message).split())
    return f"autoshard: warning (rank {os.environ.get('RANK', '0')}): {category.__name__}: {text}\n"


def _record(message: str, info: dict[str, Any]) -> None:
    """Write ``message`` as torch's ``@record`` would, when a torch launcher set this worker's error file."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE", "")
    if path:
        info = {**info, "timestamp": str(int(time.time()))}
        with open(path, "w") as file:
            json.dump({"message": {"message": message, "extraInfo": info}}, file)


def _leave_group() -> None:
    """Destroy this rank's process group before it exits: left to interpreter shutdown, gloo's threads can be torn
    down while joinable (``terminate called without an active exception``, SIGABRT: exit -6 instead of 2; seen in
    CI when the other rank closed its group first)."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        try:
            dist.destroy_process_group()
        except RuntimeError as e:  # the exit code still says what happened; the line says why cleanup failed
            print(f"autoshard: note: process group not destroyed cleanly: {e}", file=sys.stderr, flush=True)


def run_local(nproc: int, argv: Sequence[str]) -> int:
    """Run ``python argv...`` on ``nproc`` local ranks as ``torchrun --standalone`` would; the exit code."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args
    from torch.distributed.run import run as torchrun

    # "--": the script's own options are never read as torchrun's (argparse would take --nproc for a prefix)
    args = parse_args(["--standalone", f"--nproc_per_node={nproc}", "--", *argv])
    os.environ[LAUNCHED] = "1"  # inherited by the workers
    try:
        with _agent_quiet():
            torchrun(args)
    except ChildFailedError as e:
        said = [f for f in e.failures.values() if f.exitcode == 2 and _one_line(f.error_file_data)]
        if said:  # a rank ended through fail(); its peers may have been stopped by torch first
            first = min(said, key=lambda f: f.timestamp)
            print(_one_line(first.error_file_data), file=sys.stderr, flush=True)
            return 2
        rank, failure = e.get_first_failure()
        message: Any = failure.message
        code = failure.exitcode if failure.exitcode > 0 else 128 - failure.exitcode
        text = message.get("message", "") if isinstance(message, dict) else ""  # torch's @record format
        cause = f": {_condensed(text)} (its traceback is above)" if text else " (its output is above)"
        print(f"rank {rank} (pid {failure.pid}) exited with code {failure.exitcode}{cause}", file=sys.stderr)
        return code
    except SignalException as e:  # Ctrl-C or a kill: the agent has stopped the ranks
        print(f"interrupted ({e.sigval.name}): the ranks were stopped", file=sys.stderr)
        return 128 + int(e.sigval)
    finally:
        os.environ.pop(LAUNCHED, None)
    return 0


def _condensed(text: str) -> str:
    """A recorded exception in one line: ``Type: message``, and where the message holds tracebacks of its
    own (torch.distributed.checkpoint's ``CheckpointException`` carries each rank's), their last line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return f"{lines[0]} ... {lines[-1]}" if len(lines) > 1 else text.strip()


def _one_line(error_file_data: dict[str, Any]) -> str:
    """The line :func:`fail` recorded in a worker's error file ("" for any other record)."""
    message = error_file_data.get("message")
    if isinstance(message, dict) and message.get("extraInfo", {}).get(ONE_LINE):
        return str(message.get("message", ""))
    return ""


@contextlib.contextmanager
def _agent_quiet() -> Iterator[None]:
    """Hide the elastic agent's own log lines (ranks it stops, the failure it saw): the caller reports the failure
    in one line.  torch sets each of its loggers' level itself, so each is raised, and restored after."""
    agent = ("torch.distributed.elastic", "torch.distributed.launcher", "torch.distributed.run")
    loggers = [logging.getLogger(n) for n in list(logging.Logger.manager.loggerDict) if n.startswith(agent)]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)
