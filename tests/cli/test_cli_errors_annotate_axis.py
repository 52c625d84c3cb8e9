"""A pin on a mesh axis the mesh does not have is one line and exit 2, not a traceback."""

from __future__ import annotations

import subprocess
import sys


def test_pin_on_a_missing_axis_is_one_line() -> None:
    cmd = [
        sys.executable,
        "-m",
        "autoshard.cli",
        "search",
        "--profile",
        "a100x8",
        "--model",
        "mlp",
        "--mesh",
        "8",
    ]
    done = subprocess.run([*cmd, "--annotate", "fc1=column@3"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "axis '3'" in done.stderr and "use column (or column@0)" in done.stderr
