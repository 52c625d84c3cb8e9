"""``autoshard search --pp/--microbatches/--schedule``: a pipelined report, and bad values as one line."""

from __future__ import annotations

import contextlib
import io
import json
import re

import pytest

from autoshard.cli import main

BASE = ("search", "--profile", "a100x8", "--nodes", "2", "--model", "llama-tiny", "--no-baseline")


def _run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def test_search_with_stages_prints_the_headline_first(tmp_path) -> None:
    path = tmp_path / "plan.json"
    code, out, _ = _run(*BASE, "--batch", "8", "--pp", "2", "--microbatches", "4", "--out", str(path))
    assert code == 0
    assert out.splitlines()[0].startswith("PP 2 (") and "4 microbatches" in out.splitlines()[0]
    data = json.loads(path.read_text())
    assert data["microbatches"] == 4 and data["degrees"]["pp"] == 2
    assert len(data["pipeline"]["stages"]) >= 2


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        # the outermost axis (2 nodes) is the limit, not the 16 devices that 4 and 8 divide (new-user trial)
        (("--mesh", "2x8", "--pp", "3"), ["--pp 3:", "outermost mesh axis, of size 2", "use one of [1, 2]"]),
        (("--pp", "4"), ["--pp 4:", "more stages than", "2 repeated layers"]),
        (("--microbatches", "3"), ["--microbatches 3 does not divide the global batch"]),
        (("--pp", "2", "--schedule", "zigzag"), ["'zigzag' is not a schedule", "gpipe, 1f1b"]),
        (("--annotate", "model.layers.1.mlp=stage", "--pp", "2"), ["cut inside a layer"]),
        # 2 layers cannot make 2 stages x 2 chunks: it read "no schedule and cut fits the memory" (new-user trial)
        (
            ("--pp", "2", "--batch", "8", "--schedule", "zb_v"),
            ["zb_v cannot run 2 stages x 2 chunks on 2 layers"],
        ),
        (("--pp", "2", "--batch", "8", "--schedule", "interleaved_1f1b"), ["at least 4", "gpipe or 1f1b"]),
    ],
)
def test_bad_pipeline_values_exit_2_with_one_line(extra, words) -> None:
    code, out, err = _run(*BASE, *extra)
    assert code == 2 and not out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err
    assert not re.search(r"\b(pipeline|microbatches|schedule)=", lines[0])  # CLI flags, not Python names
    for word in words:
        assert word in lines[0]


def test_stages_without_microbatches_default_to_two_per_stage() -> None:
    """``--pp 2`` alone used to run 1 microbatch (a 50% bubble); now 4 (2 per stage), said in the notes."""
    code, out, err = _run(*BASE, "--batch", "8", "--pp", "2")
    assert code == 0, err
    assert out.splitlines()[0].startswith("PP 2 (") and ", 4 microbatches of " in out.splitlines()[0]
    assert "note: microbatches: 4 by default (at least 2 per stage, dividing the batch of 8)" in out


def test_default_microbatches_rule() -> None:
    from autoshard.pipeline.options import check_request, default_microbatches

    assert [default_microbatches(p, 16) for p in (1, 2, 3, 4, 8, 16)] == [1, 4, 8, 8, 16, 16]
    assert default_microbatches(4, 6) == 6  # no divisor of 6 reaches 8: one sample a microbatch
    request = check_request(2, None, "auto", batch=16, layers=4, devices=8, nodes=2)
    assert request.by_default and request.counts(2, 16) == 4
    assert check_request(2, 2, "auto", batch=16, layers=4, devices=8, nodes=2).counts(2, 16) == 2
