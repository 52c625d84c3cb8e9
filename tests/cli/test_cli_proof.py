"""The report, ``show``, ``explain`` and the plan JSON state the same optimality claim (report/proof.py)."""

from __future__ import annotations

import json
from pathlib import Path


def _claim(text: str) -> str:
    """The report's ``proven:`` paragraph as one line (the report wraps it, also after a hyphen: "lower-" /
    "bound" joins back without a space)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("proven: "))
    claim = lines[start]
    for line in lines[start + 1 :]:
        if not line.startswith("  "):
            break
        claim += ("" if claim.endswith("-") and line.strip()[:1].isalpha() else " ") + line.strip()
    return claim


def test_report_show_explain_and_json_agree_on_what_was_proven(cli, mlp_files: dict[str, Path]) -> None:
    report = _claim(mlp_files["report"].read_text())
    shown = cli("show", str(mlp_files["plan"]))
    explained = cli("explain", str(mlp_files["plan"]))
    assert shown.code == 0 and explained.code == 0, shown.err + explained.err
    assert _claim(shown.out) == report
    assert explained.out.splitlines()[-1] == report
    solver = json.loads(mlp_files["plan"].read_text())["solver"]
    assert solver["step_optimal"] == report.startswith("proven: optimal by the reported (critical-path) step")
    assert solver["ranked"] and solver["chosen"]
