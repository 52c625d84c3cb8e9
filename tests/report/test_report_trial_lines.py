"""Report lines of the last new-user trial, one test each: the data-parallel comparison said "no plan fits"
under a plan that fits; the proof said "not proven across policies" above notes bounding every other
recomputation policy above the plan's step; "assumes:" never named the batch x sequence it priced."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import autoshard
from autoshard import zoo
from autoshard.cli.args import first_clause
from autoshard.errors import InfeasibleError
from autoshard.plans import Plan
from autoshard.report.proof import proof_line
from autoshard.report.table import Baseline, render


@pytest.fixture(scope="module")
def gpt2_plan() -> Plan:
    case = zoo.build("gpt2-tiny", batch=4, seq=32)
    return autoshard.plan(case.model, autoshard.load_cluster("a100x8"), case.args)


def test_a_data_parallel_baseline_that_does_not_fit_is_named_data_parallel(gpt2_plan: Plan) -> None:
    case = zoo.build("gpt2-tiny", batch=4, seq=32)
    replicated = {name: ("R",) for name, _ in case.model.named_parameters()}
    with pytest.raises(InfeasibleError) as e:  # the solver's own refusal, as `search` gets it
        autoshard.plan(
            case.model,
            autoshard.load_cluster("a100x8"),
            case.args,
            annotations=replicated,
            memory_limit=2**20,
        )
    assert "no plan fits" in str(e.value)
    baseline = Baseline.impossible(f"does not fit: {first_clause(e.value)}")
    report = " ".join(render(gpt2_plan, baseline=baseline).split())
    assert "data parallel: does not fit: no data-parallel plan fits the memory budget" in report
    assert "no plan fits" not in report and "every plan" not in report


def _ranked(plan: Plan, scope: str, bound: float, notes: tuple[str, ...]) -> Plan:
    """``plan`` as the ranking leaves it: its step reaches ``bound`` inside ``scope``."""
    solver = dataclasses.replace(
        plan.solver,
        step_bound=bound,
        step_optimal=False,
        chosen="solver optimum",
        ranked=("a", "b"),
        bound_scope=scope,
    )
    return dataclasses.replace(plan, solver=solver, predicted_step_time=bound, notes=(*plan.notes, *notes))


def test_a_plan_with_every_other_policy_bounded_above_its_step_is_proven(gpt2_plan: Plan) -> None:
    bounded = (
        "not solved, bounded: selective recomputation: at least 1.2 s per step; "
        "full recomputation: at least 1.497 s per step"
    )
    line = proof_line(_ranked(gpt2_plan, "plans without recomputation", 1.157, (bounded,)))
    assert line.startswith(
        "optimal across recomputation policies by the reported (critical-path) step: bound"
    )
    assert "selective recomputation at least 1.200 s, full recomputation at least 1.497 s" in line
    assert "not proven" not in line
    only_full = "not solved, bounded: full recomputation: at least 1.497 s per step"  # selective was solved
    line = proof_line(_ranked(gpt2_plan, "plans without recomputation", 1.157, (only_full,)))
    assert "not proven across policies;" in line  # then the microbatch count it holds for
    below = bounded.replace("1.2 s", "1.1 s")  # a bound under the plan's step proves nothing
    assert "not proven across policies;" in proof_line(
        _ranked(gpt2_plan, "plans without recomputation", 1.157, (below,))
    )


def test_assumes_names_the_batch_and_sequence_priced(gpt2_plan: Plan) -> None:
    report = " ".join(render(gpt2_plan).split())
    assert "batch 4 × seq 32, 1 micro-batch" in report
    mlp = autoshard.plan(torch.nn.Linear(16, 16), autoshard.load_cluster("a100x8"), (torch.randn(8, 16),))
    assert "(fp32 master + moments) sharded, batch 8, 1 micro-batch" in " ".join(render(mlp).split())
