"""``examples/train.py run`` refuses what it cannot do as asked, in one line and exit code 2, before any process
group: a plan for another number of ranks than torchrun started (was a MeshError traceback from every rank),
and ``--zero 3`` with a TP x DP plan, which stores no weight split and gathered (was accepted silently: it ran
ZeRO-2).  Checked in-process with torchrun's environment variables; the plans are made by ``train.py plan``.
Started with python, ``run`` checks before starting any rank; under plain torchrun the line is torch's root cause."""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

TRAIN = Path(__file__).resolve().parents[2] / "examples" / "train.py"


@functools.cache
def _train() -> ModuleType:
    spec = importlib.util.spec_from_file_location("example_train", TRAIN)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def plans(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("train")
    train, model = _train(), str(root / "ckpt")
    train.main(["init", "--model", model, "--preset", "llama-tiny"])
    out = {}
    for layout, nproc, mesh in (("tp-dp", "4", "2x2"), ("fsdp", "2", "")):
        out[layout] = root / f"{layout}.json"
        argv = ["plan", "--model", model, "--nproc", nproc, "--layout", layout, "--out", str(out[layout])]
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            train.main([*argv, *(["--mesh", mesh] if mesh else [])])
        out[f"{layout}.txt"] = root / f"{layout}.txt"
        out[f"{layout}.txt"].write_text(printed.getvalue())
    return out


def test_plan_prints_no_python_advice(plans) -> None:
    """``train.py plan`` read "pass summary(baseline=...)", an argument of a Python call, in a command's output."""
    text = " ".join(plans["fsdp.txt"].read_text().split())
    assert "summary(" not in text and text.endswith(f"saved {plans['fsdp']}")
    assert "data parallel" in text and "(compare plans: `autoshard diff A.json B.json`)" in text


def test_a_plan_of_another_model_never_suggests_dropping_model(plans, monkeypatch, capsys) -> None:
    """``run`` needs --model (the weights directory): the refusal said "or drop --model to use the plan's own
    model", which argparse then refused."""
    import dataclasses

    from autoshard.plan_model import PlanModelError
    from autoshard.plans import load_plan

    other = plans["fsdp"].parent / "other.json"  # beside the checkpoint _check passes as --model
    plan = load_plan(plans["fsdp"])
    dataclasses.replace(plan, model="GPT2LMHeadModel", source={"spec": "gpt2"}).save(other)
    with pytest.raises(PlanModelError) as refused:  # main() prints it in one line, exit code 2
        _check(other, 1, 2, 0, monkeypatch, capsys)
    err = str(refused.value)
    assert "was made for gpt2 (GPT2LMHeadModel" in err
    assert "drop --model" not in err and err.endswith("or pass the --model the plan was made from")


def _check(plan: Path, zero: int, world: int, rank: int, monkeypatch, capsys) -> tuple[int | None, str]:
    monkeypatch.setenv("WORLD_SIZE", str(world))
    monkeypatch.setenv("RANK", str(rank))
    try:
        _train().check_run(argparse.Namespace(plan=str(plan), zero=zero, model=str(plan.parent / "ckpt")))
    except SystemExit as e:
        return int(e.code or 0), capsys.readouterr().err
    return None, capsys.readouterr().err


def test_wrong_world_size_is_one_line_on_rank_0(plans, monkeypatch, capsys) -> None:
    code, err = _check(plans["tp-dp"], 1, 2, 0, monkeypatch, capsys)
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert "needs 4 ranks (mesh 2x2), torchrun started 2: use --nproc_per_node 4" in err
    assert _check(plans["tp-dp"], 1, 2, 1, monkeypatch, capsys) == (2, "")  # the other ranks stay quiet


def test_nproc_under_torchrun_must_agree_with_it(plans, monkeypatch, capsys) -> None:
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(SystemExit) as stop:
        model = str(plans["tp-dp"].parent / "ckpt")
        _train().check_run(argparse.Namespace(plan=str(plans["tp-dp"]), zero=1, nproc=2, model=model))
    err = capsys.readouterr().err
    assert (
        stop.value.code == 2 and "--nproc 2 under torchrun, which started 4 ranks: leave --nproc out" in err
    )


def test_zero_3_needs_a_plan_that_gathers_weights(plans, monkeypatch, capsys) -> None:
    code, err = _check(plans["tp-dp"], 3, 4, 0, monkeypatch, capsys)
    assert code == 2 and err.count("\n") == 1 and "--zero 3 frees weights gathered before use (FSDP)" in err
    assert "use --zero 1 or 2" in err and "--layout fsdp" in err
    assert _check(plans["tp-dp"], 2, 4, 0, monkeypatch, capsys) == (None, "")
    assert _check(plans["fsdp"], 3, 2, 0, monkeypatch, capsys) == (None, "")


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["run", "--plan", "{broken}"], "broken JSON at line 1"),
        (
            ["run", "--plan", "{tp-dp}", "--resume", "{root}/nodcp"],
            "not a checkpoint written by `train.py run --save`",
        ),
        (["plan", "--nproc", "3", "--mesh", "2x2"], "mesh (2, 2) has 4 devices"),
        (["reference", "--model", "{root}/nockpt"], "no config.json there"),
        # usage errors: one line (argparse printed its usage block, 3-5 lines, before)
        (
            ["run", "--plan", "{tp-dp}", "--zero", "5"],
            "train.py run: error: argument --zero: invalid choice: 5",
        ),
        (["run", "--plan", "{tp-dp}", "--nproc", "two"], "argument --nproc: 'two' is not a whole number"),
        (["plan", "--nproc", "4", "--mesh", "2xa"], "argument --mesh: mesh '2xa': write axis sizes like 2x8"),
        (["plan", "--nproc", "0"], "argument --nproc: '0' must be at least 1; see `train.py plan --help`"),
        (["plan", "--nproc", "2", "--memory-limit", "-1"], "--memory-limit: '-1' must be a positive finite"),
        (["plan", "--nproc", "2", "--layout", "megatron"], "--layout: invalid choice: 'megatron'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(plans, tmp_path, monkeypatch, capsys, argv, expected) -> None:
    """A broken plan file, a missing checkpoint, a mesh that is not the world and a model directory that does not
    exist (it was taken for a Hub id and fetched over the network) each end in one line, never a traceback."""
    monkeypatch.setenv("RANK", "0")
    (tmp_path / "broken.json").write_text("{broken")
    names = {"broken": str(tmp_path / "broken.json"), "tp-dp": str(plans["tp-dp"]), "root": str(tmp_path)}
    model = ["--model", str(plans["tp-dp"].parent / "ckpt")] if "--model" not in argv else []
    with pytest.raises(SystemExit) as stop:
        _train().main([a.format(**names) for a in argv] + model)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err and expected in err


def test_a_plan_for_another_model_is_refused(plans, tmp_path, monkeypatch, capsys) -> None:
    """A plan of the 2-layer checkpoint given a 3-layer one ran silently (the repeated layers share decisions):
    refused in one line with the command that plans it, before any rank starts."""
    monkeypatch.setenv("RANK", "0")
    config = json.loads((plans["fsdp"].parent / "ckpt" / "config.json").read_text())
    (tmp_path / "deeper").mkdir()
    (tmp_path / "deeper" / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 3}))
    with pytest.raises(SystemExit) as stop:
        _train().main(["run", "--plan", str(plans["fsdp"]), "--model", str(tmp_path / "deeper")])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert f"plan {plans['fsdp']} was made for a LlamaForCausalLM (" in err
    assert "has 9 parameters the plan lacks (model.layers.2." in err
    assert f"re-plan with `train.py plan --model {tmp_path / 'deeper'} --nproc 2 --out PLAN.json`" in err


def _subprocess(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    (cwd / "tmp").mkdir()
    env = {**os.environ, "PYTHONPATH": str(TRAIN.parents[1]), "OMP_NUM_THREADS": "1"}
    env["TMPDIR"] = str(cwd / "tmp")
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=240)


def test_run_refuses_a_plan_for_another_world_before_any_rank_starts(plans, tmp_path) -> None:
    """``python train.py run --nproc 4`` with a 2-rank plan: one line, exit 2, and no rank ever started (torch's
    launcher would have made its own rendezvous directory under TMPDIR)."""
    argv = [sys.executable, str(TRAIN), "run", "--nproc", "4", "--plan", str(plans["fsdp"]), "--model"]
    done = _subprocess([*argv, str(plans["fsdp"].parent / "ckpt")], tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert not list((tmp_path / "tmp").glob("torchelastic_*"))
    assert done.stderr.endswith("needs 2 ranks (mesh 2), --nproc asks for 4: use --nproc 2, or re-plan with "
                                "`train.py plan --nproc 4`\n") and done.stderr.count("\n") == 1  # fmt: skip


@pytest.mark.slow
def test_plain_torchrun_shows_our_line_in_its_failure_table(plans, tmp_path) -> None:
    """Under plain torchrun (2 gloo ranks) torch's own traceback and failure table follow any failed worker (a
    worker cannot prevent that, ``autoshard.runtime.local_job``); our line comes before torch's table, and the
    table names it as a worker's failure with exit code 2.  Which worker torch calls the root cause, and whether
    its "Sending process ... closing signal" log line comes first, is a race: the agent stops the other rank
    (exit -15) when the first exits, and timestamps failures to the second (seen under load 8-10)."""
    model = str(plans["tp-dp"].parent / "ckpt")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    done = _subprocess(
        [*torchrun, str(TRAIN), "run", "--plan", str(plans["tp-dp"]), "--model", model], tmp_path
    )
    line = f"train.py run: error: the plan {plans['tp-dp']} needs 4 ranks (mesh 2x2), torchrun started 2"
    assert done.returncode == 1 and line in done.stderr
    before, table = done.stderr.split("Root Cause (first observed failure):", 1)
    assert line in before.split("Traceback (most recent call last)", 1)[0]
    failures = (before.split("Failures:", 1)[-1] + table).split("[")[1:]  # one record per failed worker
    assert any("exitcode  : 2" in rec and f"traceback : {line}" in rec for rec in failures)
    assert list((tmp_path / "tmp").glob("torchelastic_*"))  # what the test above sees absent: ranks started
