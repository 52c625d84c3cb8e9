"""Commands a new user ran in the last trial that were refused or misleading, one test each: the cpu profile
prices bf16 models (it had no bf16 peak); a device that truly has none says so in one line."""

from __future__ import annotations

from cli_support import run_main

from cost_models.profile import load_profile


def test_the_cpu_profile_plans_a_bf16_model() -> None:
    assert dict(load_profile("cpu").compute.peak_flops)["bfloat16"] == 450e9  # measured, see cpu.json
    r = run_main("search", "--profile", "cpu", "--model", "mixtral-tiny", "--mesh", "4", "--no-baseline")
    assert r.code == 0, r.err
    assert "MixtralForCausalLM, training, 4 devices" in r.out


def test_a_profile_without_a_bf16_peak_refuses_in_one_line() -> None:
    r = run_main("search", "--profile", "v100x8", "--model", "mixtral-tiny", "--mesh", "8", "--no-baseline")
    assert r.code == 2 and r.out == ""
    assert r.err.count("\n") == 1 and "has no peak for dtype 'bfloat16'" in r.err
    assert "add the peak to the profile" in r.err
