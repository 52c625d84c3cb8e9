"""``autoshard explain`` and ``autoshard diff`` on two plans of one model (the Megatron MLP: free, and with
fc1 pinned row-parallel)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def pinned_plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from cli_support import run_main

    path = tmp_path_factory.mktemp("pinned") / "row.json"
    r = run_main("search", "--profile", "a100x8", "--model", "mlp", "--mesh", "8", "--annotate", "fc1=row",
                 "--no-baseline", "--out", str(path))  # fmt: skip
    assert r.code == 0, r.err
    return path


def test_diff_puts_what_differs_first(cli, mlp_files: dict[str, Path], pinned_plan: Path) -> None:
    r = cli("diff", str(mlp_files["plan"]), str(pinned_plan))
    assert r.code == 0, r.err
    lines = r.out.splitlines()
    assert lines[2] == "figures that differ"
    assert lines[4].split()[:2] == ["step", "time"] and "+" in lines[4]
    # the pinned plan is the fastest by the step among several candidates (planner_candidates.py): how many
    # placements differ follows from which one wins (3 of 4 since the restricted candidates), fc1.weight's always
    assert re.search(r"parameter placements: [1-4] differ, [0-3] the same", r.out)
    assert any(line.split()[:4] == ["fc1.weight", "S(0)", "->", "S(1)"] for line in lines)
    assert "fc1 linear" in r.out and "=>" in r.out
    assert lines[-1].startswith("the same in both: ") and "devices" in lines[-1]
    assert r.out.index("figures that differ") < r.out.index("the same in both")


def test_diff_of_a_plan_with_itself(cli, mlp_files: dict[str, Path]) -> None:
    r = cli("diff", str(mlp_files["plan"]), str(mlp_files["plan"]))
    assert r.code == 0 and "figures: all the same" in r.out
    assert "parameter placements: 0 differ" in r.out and "graph-node strategies: 0 differ" in r.out


def test_explain_a_node_against_its_runner_up(cli, mlp_files: dict[str, Path]) -> None:
    r = cli("explain", str(mlp_files["plan"]), "--node", "fc1")
    assert r.code == 0, r.err
    block = r.out[r.out.index("graph node linear (aten.linear.default) in fc1") :]
    assert "chosen R, S(0), S(0) -> S(2)" in block and "runner-up " in block
    total = next(line for line in block.splitlines() if line.strip().startswith("total")).split()
    assert total[-2].startswith("+")  # the runner-up costs more: "total 13.22 ms 15.49 ms +2.26 ms"
    assert "why: the runner-up costs" in block


def test_explain_lists_the_costliest_graph_nodes(cli, mlp_files: dict[str, Path], pinned_plan: Path) -> None:
    r = cli("explain", str(mlp_files["plan"]))
    assert r.code == 0, r.err
    assert r.out.splitlines()[0].startswith("graph node") and "fc2" in r.out and "vs " in r.out
    pinned = cli("explain", str(pinned_plan), "--node", "fc1.weight")
    assert pinned.code == 0 and "chosen -> S(1)" in pinned.out


def test_explain_errors_are_one_line(cli, tmp_path: Path, mlp_files: dict[str, Path]) -> None:
    r = cli("explain", str(mlp_files["plan"]), "--node", "nothing_like_it")
    assert r.code == 2 and r.err.count("\n") == 1 and "--node nothing_like_it" in r.err
    data = json.loads(mlp_files["plan"].read_text())
    data["source"] = {}
    path = tmp_path / "nosource.json"
    path.write_text(json.dumps(data))
    r = cli("explain", str(path))
    assert r.code == 2 and r.err.count("\n") == 1 and "--model SPEC" in r.err
    assert cli("explain", str(path), "--model", "mlp").code == 0


def test_diff_normalises_placements_across_mesh_ranks() -> None:
    """``R`` on a 1-D mesh and ``(R, R, R)`` on a 3-D one are the same placement; a real split still differs."""
    import report_cases as cases

    from autoshard.report.diff import render

    op = [("linear", "fc", cases.LINEAR, "R, R -> R")]
    flat = cases.make_plan((8,), {"fc.weight": ("R",), "fc.bias": ("R",)}, op)
    op3 = [("linear", "fc", cases.LINEAR, "(R, R, R), (R, R, R) -> (R, R, R)")]
    cube = cases.make_plan((2, 2, 2), {"fc.weight": ("R", "R", "R"), "fc.bias": ("R", "S(0)", "R")}, op3)
    text = render(flat, cube)
    assert "parameter placements: 1 differ, 1 the same" in text
    assert "graph-node strategies: 1 differ" in text  # the bias's placeholder; the op and input x agree
    assert "=>  -> (R, S(0), R)" in text
    assert any(line.split() == ["fc.bias", "R", "->", "(R,", "S(0),", "R)"] for line in text.splitlines())


@pytest.mark.slow  # plans and rebuilds LLaMA-tiny (~10 s)
def test_explain_a_plan_with_fan_out_nodes(cli, tmp_path: Path) -> None:
    """Shared redistributions (fan-out nodes, past the variables in the problem) made explain fail with an
    IndexError on every LLaMA plan; each alternative is now priced with the fan-out states it needs."""
    path = tmp_path / "llama.json"
    r = cli("search", "--profile", "a100x8", "--model", "llama-tiny", "--mesh", "2x4", "--no-baseline",
            "--out", str(path))  # fmt: skip
    assert r.code == 0, r.err
    from autoshard.plans import load_plan
    from autoshard.report.explain import explain, rebuild

    plan = load_plan(path)
    built = rebuild(plan)
    assert built.fanouts, "the case needs fan-out nodes"
    found = explain(plan, built)
    assert found and all(e.runner_up is None or e.chosen.total <= e.runner_up.total + 1e-12 for e in found)
    shown = cli("explain", str(path))
    assert shown.code == 0 and "runner-up" in shown.out, shown.err


def test_explain_offers_no_runner_up_the_plan_forbade(cli, tmp_path: Path) -> None:
    """README's ``--allow tp`` plan: the batch split ``S(0), R, R -> S(0)`` (dp) is no runner-up; the forbidden
    strategies are counted under the plan's own words."""
    path = tmp_path / "tp.json"
    made = cli("search", "--profile", "a100x8", "--model", "mlp", "--batch", "64", "--mesh", "8",
               "--allow", "tp", "--no-baseline", "--out", str(path))  # fmt: skip
    assert made.code == 0, made.err
    r = cli("explain", str(path), "--node", "fc1")
    assert r.code == 0, r.err
    block = r.out[r.out.index("graph node linear (aten.linear.default) in fc1") :].split("\n\n")[0]
    assert "S(0), R, R -> S(0)" not in r.out
    assert "5 strategies (4 ruled out by the plan's allow tp); chosen R, S(0), S(0) -> S(2)" in block
    assert "no other strategy the plan allows fits this node" in block


def test_diff_names_each_setting_that_differs_before_the_table() -> None:
    """A new user compared a batch-64 A100 plan with a batch-8 H100 one and read "0.04x" with no word of why."""
    import dataclasses

    import report_cases as cases

    from autoshard.report.diff import render

    a = cases.megatron_mlp()
    a = dataclasses.replace(a, input_shapes={"x": ((64, 16), "float32")}, memory_limit=a.device_memory)
    assert "note:" not in render(a, a)
    b = dataclasses.replace(
        a,
        input_shapes={"x": ((8, 16), "float32")},
        cluster={**a.cluster, "profile": "h100x8"},
        precision="fp32",
        memory_limit=2**30,
    )
    lines = render(a, b).splitlines()
    notes = [line for line in lines if line.startswith("  note:")]
    assert lines[2 : 2 + len(notes)] == notes and len(notes) == 4  # one line each, before the table
    assert "inputs differ (A x (64, 16); B x (8, 16))" in notes[0]
    assert "hardware differs (A 1 x a100x8; B 1 x h100x8)" in notes[1]
    assert "recipe" in notes[2] and "memory budgets differ (A 80.0 GiB; B 1.0 GiB per device)" in notes[3]
