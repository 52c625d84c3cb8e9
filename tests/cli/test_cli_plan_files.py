"""Tampered, binary and truncated plan files: ``show``, ``dot`` and ``verify --plan`` each exit 2 with one
line naming the file and the field (autoshard/plan_check.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


def _edit(data: dict[str, Any], change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    data = json.loads(json.dumps(data))
    change(data)
    return data


def _mesh_3x5(d: dict[str, Any]) -> None:
    d["mesh_shape"], d["cluster"]["devices"] = [3, 5], 16


def _mesh_zero(d: dict[str, Any]) -> None:
    d["mesh_shape"] = [0]


# id: (change, words the one line must contain)
TAMPERED: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "mesh-3x5-on-16": (_mesh_3x5, "field 'mesh_shape': mesh [3, 5] has 15 devices, the cluster 16"),
    "mesh-zero": (_mesh_zero, "field 'mesh_shape'"),
    "param-S7": (
        lambda d: d["param_placements"].update({"fc1.weight": ["S(7)"]}),
        "param_placements['fc1.weight']",
    ),
    "input-S7": (
        lambda d: d["input_placements"].update({"x": ["S(7)"]}),
        "S(7) on an input of shape [1, 1024, 8192]",
    ),
    "bad-syntax": (
        lambda d: d["param_placements"].update({"fc2.bias": ["Shard(0)"]}),
        "cannot parse placement",
    ),
    "tuple-length": (
        lambda d: d["param_placements"].update({"fc2.bias": ["R", "R"]}),
        "field \"param_placements['fc2.bias']\": 2 placements ['R', 'R'] for a 1-axis mesh",
    ),
    "label-arity": (lambda d: d["nodes"][0].update({"strategy": "-> (R, R)"}), "field 'nodes[0].strategy'"),
    "input-shape-negative": (
        lambda d: d["input_shapes"].update({"x": [[-1, 1024], "float32"]}),
        "input_shapes['x']",
    ),
    "input-shape-indivisible": (
        lambda d: (
            d["input_placements"].update({"x": ["S(0)"]}),
            d["input_shapes"].update({"x": [[3, 8], "float32"]}),
        ),
        "dim 0 of [3, 8] does not split 8 ways",
    ),
    "unknown-field": (lambda d: d.update({"surprise": 1}), "field 'surprise': unknown field"),
    "unknown-node-field": (
        lambda d: d["nodes"][1].update({"extra": 1}),
        "field 'nodes[1].extra': unknown field",
    ),
    "missing-field": (lambda d: d.pop("nodes"), "field 'nodes': missing"),
    "degree": (lambda d: d.update({"degrees": {"tp": 3}}), "field \"degrees['tp']\""),
    "unknown-degree": (lambda d: d.update({"degrees": {"zz": 2}}), "unknown kind"),
    "microbatches": (lambda d: d.update({"microbatches": 0}), "field 'microbatches'"),
    "version": (lambda d: d.update({"version": 7}), "plan version 7 is not supported"),
}


@pytest.fixture(scope="module")
def good(mlp_files: dict[str, Path]) -> dict[str, Any]:
    return json.loads(mlp_files["plan"].read_text())


def _one_line_error(result: Any, *words: str) -> None:
    assert result.code == 2, (result.out, result.err)
    assert result.out == ""
    assert result.err.count("\n") == 1 and result.err.startswith("autoshard: error: "), result.err
    for w in words:
        assert w in result.err, result.err


@pytest.mark.parametrize("case", sorted(TAMPERED))
def test_tampered_plan_is_refused_in_one_line(cli, tmp_path: Path, good: dict[str, Any], case: str) -> None:
    change, words = TAMPERED[case]
    path = tmp_path / f"{case}.json"
    path.write_text(json.dumps(_edit(good, change)))
    _one_line_error(cli("show", str(path)), str(path), words)
    _one_line_error(cli("dot", str(path)), words)


def test_the_untampered_plan_loads(cli, mlp_files: dict[str, Path]) -> None:
    assert cli("show", str(mlp_files["plan"])).code == 0


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "a binary file"),
        ('{"format": "autoshard-plan", "model": "caf\xe9"}'.encode("latin-1"), "not UTF-8 text (byte 0xe9"),
        (b"", "the file is empty"),
        (b'{"format": "autoshard-plan", "version": 1, "nodes": [', "truncated?"),
    ],
    ids=["binary", "latin-1", "empty", "truncated"],
)
def test_unreadable_plan_files(cli, tmp_path: Path, content: bytes, words: str) -> None:
    path = tmp_path / "plan.json"
    path.write_bytes(content)
    for command in (("show",), ("dot",), ("verify", "--plan")):
        _one_line_error(cli(*command, str(path)), words)


def test_verify_refuses_a_tampered_plan(cli, tmp_path: Path, good: dict[str, Any]) -> None:
    path = tmp_path / "tampered.json"
    path.write_text(json.dumps(_edit(good, _mesh_3x5)))
    _one_line_error(cli("verify", "--plan", str(path)), "mesh [3, 5]")


def test_a_plan_file_never_runs_the_model_file_it_names(cli, tmp_path: Path, good: dict[str, Any]) -> None:
    evil = tmp_path / "evil.py"
    marker = tmp_path / "ran"
    evil.write_text(f"open({str(marker)!r}, 'w').close()\ndef make():\n    raise SystemExit\n")
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(_edit(good, lambda d: d.update({"source": {"spec": f"{evil}:make"}}))))
    _one_line_error(cli("verify", "--plan", str(path)), "never runs code", f"--model {evil}:make")
    assert not marker.exists()
