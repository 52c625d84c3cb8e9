"""``autoshard whatif``: a plan's step time as a sympy expression, and the crossover where another plan
becomes faster -- checked on the seed model (data vs tensor parallel) against a hand computation."""

from __future__ import annotations

import functools
import re

import pytest
from cli_support import run_main

import autoshard
from autoshard import zoo
from autoshard.codegen.parallelize import plan_cluster
from autoshard.whatif import Crossover, crossovers, plan_cost

B0, S0 = 2048, 512
TENSOR_PARALLEL = {"ids": ("R",), "proj": ((1, 1, 1), (8, 1)), "head": ((1, 1, 8), (1, 8))}


@functools.cache
def seed_plans() -> tuple[autoshard.Plan, autoshard.Plan]:
    """The searched plan (data parallel, the known optimum) and Megatron column -> row on 8 x A100."""
    case = zoo.build("seed", batch=B0, seq=S0, device="meta")
    cluster = autoshard.load_cluster("a100x8")
    dp = autoshard.plan(case.model, cluster, case.args, case.kwargs)
    tp = autoshard.plan(case.model, cluster, case.args, case.kwargs, annotations=TENSOR_PARALLEL)
    assert set(dp.param_placements.values()) == {("R",)}
    return dp, tp


def _by_hand(plan: autoshard.Plan) -> tuple[float, float]:
    """(seconds that grow with the batch at B0, seconds that do not), reading the plan's records.

    The seed model's activations are everything downstream of ``ids``: embedding, proj, head, mean and
    their gradients; its parameters and their optimizer steps do not grow with the batch.  A collective's
    time is its latency (its time for one byte) plus a bandwidth part that grows with the tensor it moves.
    """
    activations = {"ids"}
    for node in plan.nodes:
        if set(node.inputs) & activations:
            activations.add(node.name)
    grows = sum(n.compute_seconds for n in plan.nodes if n.name in activations)
    fixed = sum(n.compute_seconds for n in plan.nodes if n.name not in activations)
    fixed -= plan.compute_time + plan.communication_time - plan.predicted_step_time  # hidden by overlap
    cluster = plan_cluster(plan)
    for c in (*plan.collectives, *plan.optimizer_gathers):
        latency = min(c.seconds, cluster.collective_time(c.kind, 1, axis=c.mesh_axis))
        fixed += latency
        if c.tensor in activations:
            grows += c.seconds - latency
        else:
            fixed += c.seconds - latency
    return grows, fixed


@pytest.mark.slow  # plans the seed model twice (~3 s)
def test_seed_data_vs_tensor_parallel_crossover_matches_a_hand_computation() -> None:
    dp, tp = seed_plans()
    (g_dp, f_dp), (g_tp, f_tp) = _by_hand(dp), _by_hand(tp)
    assert g_dp + f_dp == pytest.approx(dp.predicted_step_time, rel=1e-9)
    assert g_tp + f_tp == pytest.approx(tp.predicted_step_time, rel=1e-9)
    # T(B) = grows * B / B0 + fixed for both: equal at B* = B0 (f_tp - f_dp) / (g_dp - g_tp)
    by_hand = B0 * (f_tp - f_dp) / (g_dp - g_tp)
    assert 1 < by_hand < B0, "DP wins at the planned batch; TP must win at some smaller one"
    found = crossovers(plan_cost(dp, "dp"), [plan_cost(tp, "tp")], "batch", 1, 4 * B0)
    assert len(found) == 1
    assert found[0].value == pytest.approx(by_hand, rel=1e-9)
    assert (found[0].below, found[0].above) == ("tp", "dp")


def test_a_crossover_of_a_whole_quantity_names_whole_values() -> None:
    between = Crossover("seq", 280.597, 1.5e-3, "tp", "dp")
    assert (
        str(between)
        == "between seq 280 and 281: tp faster at 280 and below, dp faster at 281 and above (both about 1.5 ms)"
    )
    assert str(Crossover("batch", 18.0000000001, 1e-3, "a", "b")).startswith("batch = 18: a faster below")
    assert str(Crossover("bandwidth", 1.25, 1e-3, "a", "b")).startswith("bandwidth = 1.25: a faster below")


def test_the_expression_reproduces_the_plan_and_scales_as_documented() -> None:
    dp, _ = seed_plans()
    cost = plan_cost(dp, "dp")
    assert cost.at() == pytest.approx(dp.predicted_step_time, rel=1e-9)
    grows, fixed = _by_hand(dp)
    assert cost.at(batch=2 * B0) == pytest.approx(2 * grows + fixed, rel=1e-9)
    # DP's gradient all-reduce is the only communication: twice the bandwidth halves its bandwidth part
    comm = sum(c.seconds for c in dp.collectives)
    assert cost.at(bandwidth=2.0) < cost.at() and cost.at() - cost.at(bandwidth=2.0) < comm / 2 + 1e-15


def test_cli_prints_the_crossover_naming_both_plans(tmp_path) -> None:
    dp, tp = seed_plans()
    dp.save(tmp_path / "dp.json")
    tp.save(tmp_path / "tp.json")
    result = run_main(
        "whatif", str(tmp_path / "dp.json"), "--against", str(tmp_path / "tp.json"),
        "--vary", "batch=1..8192", "--vary", "bandwidth=0.5..2", "--show",
    )  # fmt: skip
    assert result.code == 0, result.err
    # a batch is whole: the crossover is named by the two batches around it, never "batch = 17.5373"
    line = next(x for x in result.out.splitlines() if "tp faster at" in x)
    match = re.fullmatch(
        r"  between batch (\d+) and (\d+): tp faster at \1 and below, dp faster at \2 and above .*", line
    )
    assert match and int(match[1]) + 1 == int(match[2])
    assert "bandwidth in 0.5..2:" in result.out and "= " in result.out
    bad = run_main(
        "whatif", str(tmp_path / "dp.json"), "--against", str(tmp_path / "tp.json"), "--vary", "x=1..2"
    )
    assert bad.code == 2 and "NAME is one of batch, seq, devices, bandwidth" in bad.err


@pytest.mark.slow  # plans the seed model (cached with the test above)
def test_a_plan_faster_throughout_says_by_how_much(tmp_path) -> None:
    dp, tp = seed_plans()
    dp.save(tmp_path / "dp.json")
    tp.save(tmp_path / "tp.json")
    result = run_main(
        "whatif",
        str(tmp_path / "dp.json"),
        "--against",
        str(tmp_path / "tp.json"),
        "--vary",
        "batch=4096..8192",
    )
    assert result.code == 0, result.err
    (line,) = [x for x in result.out.splitlines() if "throughout" in x]
    assert line.startswith("  dp is faster than tp throughout batch 4096..8192, by ")
    a, b = (float(p.rstrip("%")) for p in line.rsplit(" ", 1)[1].split("–"))
    dp_cost, tp_cost = plan_cost(dp, "dp"), plan_cost(tp, "tp")
    ends = sorted(100 * (tp_cost.at(batch=x) / dp_cost.at(batch=x) - 1) for x in (4096, 8192))
    assert (a, b) == pytest.approx(ends, abs=0.051)  # the margin is monotonic in the batch here: its ends
    assert "overtakes" not in result.out


def test_devices_is_refused_for_a_plan_on_several_mesh_axes() -> None:
    import sympy

    from autoshard.whatif import PlanCost, WhatIfError, lead

    ref = {"batch": 8.0, "seq": 16.0, "devices": 8.0, "bandwidth": 1.0}
    cube = PlanCost("cube", sympy.Float(1.0), ref, (2, 2, 2))
    line = PlanCost("line", sympy.Float(2.0), ref, (1, 8))  # one axis of size > 1: devices scales it
    with pytest.raises(WhatIfError, match=r"cannot vary devices for cube: it is planned on the 3-D mesh"):
        crossovers(line, [cube], "devices", 2, 64)
    assert str(lead(cube, PlanCost("other", sympy.Float(1.5), ref, (2, 2, 2)), "batch", 1, 64)) == (
        "cube is faster than other throughout batch 1..64, by 50.0%"
    )
    assert "take the same time" in str(lead(cube, cube, "seq", 1, 64))
    assert crossovers(line, [line], "devices", 2, 64) == []


def test_plans_of_different_models_are_refused(tmp_path) -> None:
    """Comparing two models' plans printed a crossover that says nothing about the plans (new-user trial)."""
    import dataclasses

    dp, _ = seed_plans()
    dp.save(tmp_path / "dp.json")
    case = zoo.build("mlp")
    other = autoshard.plan(case.model, autoshard.load_cluster("a100x8"), case.args)
    other.save(tmp_path / "mlp.json")
    result = run_main(
        "whatif", str(tmp_path / "dp.json"), "--against", str(tmp_path / "mlp.json"), "--vary", "batch=1..64"
    )
    assert result.code == 2 and result.err.count("\n") == 1 and result.out == ""
    assert (
        "dp plans SeedTextModel" in result.err and "but mlp plans MLP, 4 parameters, training" in result.err
    )
    dataclasses.replace(dp, source={"spec": "seed"}).save(tmp_path / "a.json")
    dataclasses.replace(dp, source={"spec": "seed-wide"}).save(tmp_path / "b.json")
    result = run_main(
        "whatif", str(tmp_path / "a.json"), "--against", str(tmp_path / "b.json"), "--vary", "batch=1..64"
    )
    assert result.code == 2 and "(seed)" in result.err and "(seed-wide)" in result.err
    dataclasses.replace(dp, training=False).save(tmp_path / "c.json")
    result = run_main(
        "whatif", str(tmp_path / "dp.json"), "--against", str(tmp_path / "c.json"), "--vary", "batch=1..64"
    )
    assert result.code == 2 and "training but c plans" in result.err and "inference" in result.err
