"""``autoshard ops``: every op kind with count, FLOPs share and rule; ops without a rule and their share.

Also the planner's side of the same fact: a plan with replicate-only ops warns once with their FLOPs share,
records it in ``Plan.replicated_ops`` (saved and loaded) and says it in the report beside the baseline.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_support import Result
from ops_models import rolling

import autoshard
from autoshard.capture import capture
from autoshard.plans import load_plan
from autoshard.report.table import Baseline, render
from autoshard.strategies import UnsupportedOpWarning
from autoshard.strategies.coverage import FALLBACK, op_coverage, replicated_shares

SPEC = str(Path(__file__).with_name("ops_models.py")) + ":rolling"


def test_ops_lists_every_op_with_its_share_and_rule(cli: Callable[..., Result]) -> None:
    result = cli("ops", SPEC)
    assert result.code == 0, result.err
    lines = {line.split()[0]: line for line in result.out.splitlines()[2:] if line.startswith("  aten")}
    assert "matmul.linear" in lines["aten.linear.default"]
    assert FALLBACK in lines["aten.roll.default"] and FALLBACK in lines["aten.logcumsumexp.default"]
    assert "2 op kinds have no rule and run replicated" in result.out


def test_ops_json_shares_add_up(cli: Callable[..., Result]) -> None:
    data = cli("ops", SPEC, "--json").json()
    assert sum(op["share"] for op in data["ops"]) == pytest.approx(1.0)
    fallback = [op for op in data["ops"] if op["rule"] == FALLBACK]
    assert {op["op"] for op in fallback} == {"aten.roll.default", "aten.logcumsumexp.default"}
    assert data["replicated_share"] == pytest.approx(sum(op["share"] for op in fallback))
    assert 0 < data["replicated_share"] < 0.05  # elementwise work beside two matmuls


def test_ops_of_a_covered_model(cli: Callable[..., Result]) -> None:
    result = cli("ops", "mlp-deep")
    assert result.code == 0 and "every op has a sharding rule" in result.out


def test_unknown_model_is_a_one_line_error(cli: Callable[..., Result]) -> None:
    result = cli("ops", "no-such-model")
    assert result.code == 2 and result.err.count("\n") == 1


def test_coverage_counts_repeated_blocks_once_per_model_block() -> None:
    from autoshard import zoo

    case = zoo.build("mlp-deep", layers=6)
    rows = {r.op: r for r in op_coverage(capture(case.model, case.args))}
    assert rows["aten.linear.default"].count == 6  # two blocks captured, six in the model


def test_plan_warns_with_the_replicated_share_and_reports_it(tmp_path: Path) -> None:
    model, x = rolling()
    cluster = autoshard.load_cluster("a100x8")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan = autoshard.plan(model, cluster, (x,))
    shares = replicated_shares(capture(model, (x,)))
    assert plan.replicated_ops == pytest.approx(shares)
    summary = [str(w.message) for w in caught if issubclass(w.category, UnsupportedOpWarning)]
    assert any(f"{sum(shares.values()):.1%} of the step's forward FLOPs run replicated" in m for m in summary)
    plan.save(tmp_path / "plan.json")
    assert load_plan(tmp_path / "plan.json").replicated_ops == plan.replicated_ops
    report = render(plan, baseline=Baseline.of(plan))
    assert "run replicated on every device" in report and "data parallel replicates them too" in report
