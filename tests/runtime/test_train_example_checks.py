"""``examples/train.py run`` refuses what it cannot do as asked, in one line and exit code 2, before any process
group: a plan for another number of ranks than torchrun started (was a MeshError traceback from every rank),
and ``--zero 3`` with a TP x DP plan, which stores no weight split and gathered (was accepted silently: it ran
ZeRO-2).  Checked in-process with torchrun's environment variables; the plans are made by ``train.py plan``."""

from __future__ import annotations

import argparse
import functools
import importlib.util
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
        train.main([*argv, *(["--mesh", mesh] if mesh else [])])
    return out


def _check(plan: Path, zero: int, world: int, rank: int, monkeypatch, capsys) -> tuple[int | None, str]:
    monkeypatch.setenv("WORLD_SIZE", str(world))
    monkeypatch.setenv("RANK", str(rank))
    try:
        _train().check_run(argparse.Namespace(plan=str(plan), zero=zero))
    except SystemExit as e:
        return int(e.code or 0), capsys.readouterr().err
    return None, capsys.readouterr().err


def test_wrong_world_size_is_one_line_on_rank_0(plans, monkeypatch, capsys) -> None:
    code, err = _check(plans["tp-dp"], 1, 2, 0, monkeypatch, capsys)
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert "needs 4 ranks (mesh 2x2), torchrun started 2: use --nproc_per_node 4" in err
    assert _check(plans["tp-dp"], 1, 2, 1, monkeypatch, capsys) == (2, "")  # the other ranks stay quiet


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
