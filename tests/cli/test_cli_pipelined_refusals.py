"""``whatif`` and ``explain`` on a pipelined plan (new-user trial): ``whatif`` ended in a traceback
("'int' object has no attribute 'subs'": the microbatch limit of a plan with no batch split was a plain
int) and ``explain`` blamed the model ("the model or its inputs differ") for an unmodified zoo plan.
``whatif --vary`` refuses in one true line (exit 2; ``--set`` re-prices it: test_cli_pipelined_whatif_explain),
``explain`` explains the stage problem; the microbatch limit itself is an expression and is described."""

from __future__ import annotations

from pathlib import Path

import sympy
from cli_support import run_main

from autoshard.plans import load_plan
from autoshard.whatif_limits import describe, plan_limits


def test_whatif_of_a_pipelined_plan_refuses_in_one_line(pipelined_plans: tuple[Path, Path]) -> None:
    pp, flat = pipelined_plans
    for first, other in ((flat, pp), (pp, pp)):
        done = run_main("whatif", str(first), "--against", str(other), "--vary", "batch=1..64")
        assert done.code == 2 and "Traceback" not in done.err
        assert "pipelined" in done.err and "whatif cannot vary a pipelined step" in done.err
        assert len(done.err.strip().splitlines()) == 1


def test_microbatch_limit_without_a_batch_split_is_described(pipelined_plans: tuple[Path, Path]) -> None:
    plan = load_plan(pipelined_plans[0])
    assert plan.pipeline is not None and plan.microbatches > 1 and plan.degrees.get("dp", 1) == 1
    limits = plan_limits(plan, sympy.Integer(0), sympy.Integer(1))
    point = {"batch": 1.0, "seq": 16.0, "devices": 8.0, "bandwidth": 1.0}
    assert describe(limits, point) == f"batch 1 < microbatches {plan.microbatches}"
    assert describe(limits, {**point, "batch": float(plan.microbatches)}) is None


def test_explain_of_a_pipelined_plan_explains_its_stage_problem(pipelined_plans: tuple[Path, Path]) -> None:
    pp, flat = pipelined_plans
    done = run_main("explain", str(pp), "--node", "model.layers.0")
    assert done.code == 0 and "pipelined: PP 2" in done.out and "differ" not in done.err
    assert (
        run_main("explain", str(flat), "--node", "model.layers.0").code == 0
    )  # the same model, not pipelined
