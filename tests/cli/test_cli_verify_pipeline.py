"""``autoshard verify --plan`` of a pipelined plan runs it as deployed: stages, microbatches and schedule
through torch.distributed.pipelining on 4 gloo ranks, loss and gradients against one device, the
collectives each stage logged equal to its share of the plan (per microbatch; a gradient sync once), the p2p sends
between stages counted (it used to run every layer as one stage on the whole batch and warn)."""

from __future__ import annotations

import contextlib
import io

import pytest

from autoshard.cli import main

pytestmark = pytest.mark.slow


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def test_verify_runs_a_pipelined_plan_as_deployed(tmp_path) -> None:
    path = str(tmp_path / "pp.json")
    search = ["search", "--profile", "cpu", "--model", "llama-tiny", "--batch", "8", "--mesh", "2x2", "--pp", "2",
              "--annotate", "*.q_proj=column", "--no-baseline", "--out", path]  # fmt: skip
    assert _run(search)[0] == 0
    code, out, err = _run(["verify", "--plan", path])
    assert code == 0, out + err
    assert (
        "OK" in out.splitlines()[0] and "pipelined plan as deployed: 2 stages, gpipe, 4 microbatches" in out
    )
    line = next(x for x in out.splitlines() if x.startswith("collectives per step"))
    ran = "backward all_reduce x8, forward all_gather x8, p2p send x16"
    assert f"{ran} (plan: {ran})" in line
    # every parameter of both stages compared (the printed ones are the largest differences only)
    assert "not exercised" not in out and "21 gradients compared" in out.splitlines()[0]
    assert "stage 1 model.layers.*.self_attn.q_proj aten.linear.default" in out  # the stages' split decisions
