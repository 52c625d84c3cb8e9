"""Run one benchmark case in a fresh Python process, so that its peak RSS and import costs are its own.

:func:`run_isolated` starts ``python -m benchmarks.isolate <module>:<function> <json kwargs>``; the child calls
the function, adds its peak RSS (``resource.getrusage(RUSAGE_SELF).ru_maxrss``) and prints the result as one
JSON line after a marker.  The parent adds the process's wall time and returns the dict; a case that fails
or times out comes back as ``{"error": "..."}`` with the tail of its stderr rather than stopping the suite.

Example::

    r = run_isolated("benchmarks.scaling:plan_case", {"model": "gpt2", "mesh": [8], "batch": 8, "seq": 1024})
    r["total_s"], r["peak_rss_gib"]
"""

from __future__ import annotations

import importlib
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["REPO", "run_isolated"]

REPO = Path(__file__).resolve().parent.parent
_MARKER = "AUTOSHARD-BENCHMARK-RESULT "


def run_isolated(target: str, kwargs: dict[str, Any], *, timeout: float = 600.0) -> dict[str, Any]:
    """``module:function(**kwargs)`` in a fresh interpreter; its result plus ``peak_rss_gib`` and ``process_s``."""
    cmd = [sys.executable, "-m", "benchmarks.isolate", target, json.dumps(kwargs)]
    start = time.perf_counter()
    try:
        out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s", "process_s": time.perf_counter() - start}
    wall = time.perf_counter() - start
    lines = [line for line in out.stdout.splitlines() if line.startswith(_MARKER)]
    if out.returncode != 0 or not lines:
        tail = (out.stderr or out.stdout).strip().splitlines()[-6:]
        return {"error": " | ".join(tail) or f"exit code {out.returncode}", "process_s": wall}
    result: dict[str, Any] = json.loads(lines[-1][len(_MARKER) :])
    result["process_s"] = wall
    return result


def _main(argv: list[str]) -> None:
    target, raw = argv
    module_name, _, func_name = target.partition(":")
    func = getattr(importlib.import_module(module_name), func_name)
    result = dict(func(**json.loads(raw)))
    result["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30
    print(_MARKER + json.dumps(result), flush=True)


if __name__ == "__main__":
    _main(sys.argv[1:])
