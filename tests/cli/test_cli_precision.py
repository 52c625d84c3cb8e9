"""``search --precision amp`` plans the amp recipe (fp32 weights under autocast, foreach AdamW): more memory
per device than the default bf16 recipe for the same model, and an unknown recipe is refused by argparse."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from cli_support import Result

ARGV = ("search", "--profile", "a100x8", "--model", "mlp", "--mesh", "8", "--no-baseline", "--json")


def test_amp_is_a_recipe_the_user_picks(cli: Callable[..., Result]) -> None:
    bf16, amp = cli(*ARGV), cli(*ARGV, "--precision", "amp")
    assert bf16.code == 0 and amp.code == 0, (bf16.err, amp.err)
    memory = [json.loads(r.out)["memory_per_device"] for r in (bf16, amp)]
    assert memory[1] > memory[0]
    assert cli(*ARGV, "--precision", "fp8").code == 2


def test_an_amp_plan_says_its_recipe_in_show_explain_diff_and_whatif(
    cli: Callable[..., Result], tmp_path: Path, mlp_files: dict[str, Path]
) -> None:
    """The file records the recipe (``Plan.precision``); ``show`` says fp32 weights + bf16 autocast copies and
    foreach AdamW, not the bf16 recipe's fp32 master; ``explain`` re-prices under amp (its memory term is the
    amp problem's, above bf16's) and says so; ``diff`` and ``whatif`` name both recipes."""
    amp = tmp_path / "amp.json"
    made = cli("search", "--profile", "a100x8", "--model", "mlp", "--mesh", "8", "--precision", "amp",
               "--no-baseline", "--out", str(amp))  # fmt: skip
    assert made.code == 0, made.err
    bf16 = mlp_files["plan"]
    assert json.loads(amp.read_text())["precision"] == "amp"
    assert json.loads(bf16.read_text())["precision"] == "bf16"
    shown = cli("show", str(amp))
    assert shown.code == 0, shown.err
    assert "amp: fp32 weights + bf16 autocast copies, fp32 grads, foreach AdamW (fp32 moments)" in shown.out
    assert "fp32 master" not in shown.out
    assert "fp32 master" in cli("show", str(bf16)).out
    said = [cli("explain", str(p), "--node", "fc1.weight") for p in (amp, bf16)]
    assert all(r.code == 0 for r in said), [r.err for r in said]
    assert "priced for: amp: fp32 weights" in said[0].out and "priced for: captured dtypes" in said[1].out
    memory = [_explained_memory(r.out) for r in said]
    assert memory[0] > memory[1]  # fp32 weights + casts, fp32 grads vs the captured dtypes
    diffed = cli("diff", str(bf16), str(amp))
    assert diffed.code == 0 and "A is priced for the bf16 recipe, B for amp" in diffed.out
    what = cli("whatif", str(bf16), "--against", str(amp), "--vary", "batch=8..64")
    assert what.code == 0, what.err
    assert f"{bf16.stem}: " in what.out and "(bf16 recipe)" in what.out and "(amp recipe)" in what.out


def _explained_memory(text: str) -> float:
    """The chosen strategy's 'memory per device' of ``explain --node`` in bytes."""
    line = next(x for x in text.splitlines() if x.strip().startswith("memory per device"))
    value, unit = line.split()[3:5]
    return float(value) * {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}[unit]
