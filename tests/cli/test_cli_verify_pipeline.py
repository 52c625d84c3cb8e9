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


def test_the_advice_for_a_pipeline_too_large_to_run_here_runs(tmp_path) -> None:
    """It said "plan a small copy with the same --pp and --schedule (e.g. --model llama-tiny --mesh 2x2)", which
    for interleaved_zb failed: llama-tiny's 2 layers cannot make 2 stages x 2 chunks.  The advice is now two
    commands, with --layers deep enough for the plan's chunks, and they run."""
    big = str(tmp_path / "big.json")
    search = ["search", "--profile", "cpu", "--model", "llama-tiny", "--layers", "4", "--nodes", "4",
              "--mesh", "2x8", "--pp", "2", "--schedule", "interleaved_zb", "--no-baseline", "--out", big]  # fmt: skip
    assert _run(search)[0] == 0
    code, out, err = _run(["verify", "--plan", big])
    assert code == 2 and "needs 16 ranks" in err, out + err
    advice = err.split("verify that: ")[1].strip().replace("small.json", str(tmp_path / "small.json"))
    plan_small, verify_small = (cmd.split()[1:] for cmd in advice.split(" && "))
    assert "--schedule interleaved_zb" in advice and "--layers 4" in advice
    assert _run(plan_small)[0] == 0
    code, out, err = _run(verify_small)
    assert code == 0 and "OK" in out.splitlines()[0], out + err
    assert "4 stages, interleaved_zb" in out  # 2 ranks x 2 chunks of the 4 layers
