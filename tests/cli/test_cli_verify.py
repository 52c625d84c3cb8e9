"""``autoshard verify``: wired to ``autoshard.runtime.verify.run_verify`` when the build has it."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace
from typing import Any

import pytest

from autoshard.cli import VERIFY_MODULE
from autoshard.plans import load_plan


def test_verify_runs_a_tiny_model_on_two_processes(cli) -> None:
    pytest.importorskip(VERIFY_MODULE)
    r = cli("verify", "--model", "mlp-deep", "--nproc", "2", "--annotate", "x=S(0)")
    assert r.code == 0, r.err
    assert r.out.startswith("verify mlp-deep on mesh (2,)") and "OK" in r.out


def test_verify_of_a_replicated_plan_is_not_ok(cli, tmp_path) -> None:
    """A replicated plan, planned with every kind of parallelism forbidden (it was the small model's optimum
    until ZeRO-1's gathers were priced: replication now pays them, and splitting wins)."""
    pytest.importorskip(VERIFY_MODULE)
    import autoshard
    from autoshard import zoo
    from autoshard.runtime.verify import cluster_for

    case = zoo.build("mlp-deep")
    kinds = ("dp", "fsdp", "tp", "sp", "cp", "ep")
    plan = autoshard.plan(case.model, cluster_for("cpu", 2), case.args, case.kwargs, forbid=kinds)
    assert not plan.collectives
    plan.save(tmp_path / "plan.json")
    r = cli("verify", "--plan", str(tmp_path / "plan.json"), "--model", "mlp-deep")
    assert r.code == 1
    assert "NOTHING DISTRIBUTED CHECKED" in r.out.splitlines()[0] and "--allow-replicated" in r.out
    r = cli("verify", "--plan", str(tmp_path / "plan.json"), "--model", "mlp-deep", "--allow-replicated")
    assert r.code == 0 and " OK " in r.out.splitlines()[0]


def test_verify_passes_every_option_and_exits_1_on_a_difference(cli, monkeypatch, mlp_files) -> None:
    module = pytest.importorskip(VERIFY_MODULE)
    calls: list[tuple[Any, ...]] = []

    def fake(spec: str, nproc: int, mesh: Any, profile: str, **kwargs: Any) -> SimpleNamespace:
        calls.append((spec, nproc, mesh, profile, kwargs))
        return SimpleNamespace(ok=False)

    monkeypatch.setattr(module, "run_verify", fake)
    r = cli(
        "verify", "--model", "llama-tiny", "--nproc", "4", "--mesh", "2x2", "--profile", "a100x8",
        "--annotate", "fc1=column", "--float64",
    )  # fmt: skip
    assert r.code == 1
    assert calls == [("llama-tiny", 4, (2, 2), "a100x8", {"annotations": {"fc1": "column"}, "float64": True})]
    calls.clear()
    assert cli("verify", "--plan", str(mlp_files["plan"]), "--allow-replicated").code == 1
    plan = load_plan(mlp_files["plan"])  # read once by the CLI (its model checked), handed on as a Plan
    assert calls == [
        (
            None,
            None,
            None,
            "cpu",
            {"annotations": None, "float64": False, "plan": plan, "allow_replicated": True},
        )
    ]
    calls.clear()  # another draw of inputs and output gradients (a seed that flips a route, say)
    assert cli("verify", "--plan", str(mlp_files["plan"]), "--seed", "3").code == 1
    assert calls[0][4] == {"annotations": None, "float64": False, "seed": 3, "plan": plan}


def test_verify_missing_from_the_build(cli, monkeypatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == VERIFY_MODULE else real(name, *a)
    )
    r = cli("verify", "--model", "mlp-deep", "--nproc", "2")
    assert r.code == 2
    assert r.err.strip() == (
        f"autoshard: error: verify is not available in this build ({VERIFY_MODULE} is missing); "
        "plan with `autoshard search`"
    )


def test_verify_usage_errors(cli) -> None:
    assert cli("verify", "--model", "mlp-deep", "--nproc", "x").code == 2
    assert cli("verify", "--model", "mlp-deep", "--nproc", "0").code == 2


def test_verify_needs_a_plan_or_a_model_and_plan_fixes_the_mesh(cli) -> None:
    pytest.importorskip(VERIFY_MODULE)
    r = cli("verify")
    assert r.code == 2 and r.err.count("\n") == 1 and "--plan PLAN.json" in r.err
    r = cli("verify", "--plan", "p.json", "--nproc", "4")
    assert r.code == 2 and r.err.count("\n") == 1 and "the plan fixes them" in r.err


def test_verify_model_plans_at_real_size_then_maps(cli, tmp_path) -> None:
    """--model without --plan: the plan the model gets on the cluster it is meant for (the 8192-wide MLP on a
    2 x 4 node), mapped onto the scaled-down copy on 2 x 2 -- not the small model's own (replicated) optimum."""
    pytest.importorskip(VERIFY_MODULE)
    r = cli("verify", "--model", "mlp", "--profile", "a100x8", "--nodes", "1", "--mesh", "2x4")
    assert r.code == 0, r.out + r.err
    lines = r.out.splitlines()
    assert lines[0].startswith("verify mlp on mesh (2, 2)") and " OK " in lines[0]
    assert lines[1].startswith(
        "checks the plan for mlp on mesh (2, 4), mapped onto a scaled-down copy on mesh (2, 2)"
    )
    assert "8 of 8 graph-node decisions carried over" in lines[1]
    # a split plan: forward collectives ran, the same as the plan lists (which ones is the ranking's choice;
    # since the sync-exposure bound it is TP x SP with reduce-scatters and all-gathers, not Megatron's all-reduce)
    ran = next(line for line in lines if line.startswith("collectives per step: "))
    emitted, planned = ran.removeprefix("collectives per step: ").removesuffix(")").split(" (plan: ")
    assert "forward " in emitted and emitted == planned and "fc1 linear:" in r.out
    # the same plan saved by search and verified with --plan gives the same collectives
    path = tmp_path / "mlp.json"
    assert cli("search", "--profile", "a100x8", "--model", "mlp", "--mesh", "2x4", "--no-baseline",
               "--out", str(path)).code == 0  # fmt: skip
    again = cli("verify", "--plan", str(path))
    assert again.code == 0, again.out + again.err

    def collectives(text: str) -> str:
        return next(line for line in text.splitlines() if line.startswith("collectives per step"))

    assert collectives(again.out) == collectives(r.out)
