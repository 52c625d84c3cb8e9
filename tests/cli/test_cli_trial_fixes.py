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


PIPELINE_ONLY = (
    "--profile",
    "a100x8",
    "--model",
    "llama-tiny",
    "--batch",
    "16",
    "--seq",
    "256",
    "--mesh",
    "8",
)


def test_a_budget_refusal_names_the_stage_count_that_fits() -> None:
    """Only pp left, 993 MiB: no plan without stages fits (1014 MiB), 2 stages do (969 MiB): the fix says so.
    (968.8 MiB until a stage counted its largest temporary and recompute working set.)"""
    r = run_main("search", *PIPELINE_ONLY, "--allow", "pp", "--no-baseline", "--memory-limit", "0.97")
    assert r.code == 2 and r.err.count("\n") == 1, r.err
    assert "(left: pp)" in r.err
    assert "Fix: --pp 2 (a plan with 2 pipeline stages fits: 969.0 MiB per device" in r.err
    near = run_main("search", *PIPELINE_ONLY, "--allow", "pp", "--no-baseline", "--memory-limit", "0.95")
    assert "Fix: --pp 2 (a plan with 2 pipeline stages fits: 969.0 MiB per device" in near.err  # was refused
    ok = run_main(
        "search", *PIPELINE_ONLY, "--allow", "pp", "--no-baseline", "--memory-limit", "0.97", "--pp", "2"
    )
    assert ok.code == 0 and "memory per device              969.0 MiB" in ok.out


def test_a_budget_refusal_says_why_no_stage_count_fits() -> None:
    """At 0.95 GiB this read "--pp 2 needs at least 976.58 MiB" (the stage surrogate's figure) though a 2-stage
    plan of 969.0 MiB fits it (pipeline/refit.py); 968.06 MiB is the floor every 2-stage plan needs (the
    stage holding the head, with a layer's recompute working set: 961.35 MiB before the stage counted it)."""
    r = run_main("search", *PIPELINE_ONLY, "--allow", "pp", "--no-baseline", "--memory-limit", "0.9")
    assert r.code == 2 and r.err.count("\n") == 1, r.err
    tried = "pipeline stages tried: --pp 2 needs at least 968.06 MiB, --pp 4 or more: more stages than the"
    assert f"{tried} model's 2 repeated layers: no degree fits" in r.err
    assert "no degree fits. Fix: more devices" in r.err and "--pp 2 (" not in r.err
