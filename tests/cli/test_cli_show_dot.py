"""``autoshard show`` and ``autoshard dot`` on saved plans."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from cli_support import parse_dot

from autoshard.plans import load_plan


def test_show_prints_the_report_of_a_saved_plan(cli, mlp_files: dict[str, Path]) -> None:
    r = cli("show", str(mlp_files["plan"]))
    assert r.code == 0, r.err
    assert all(len(line) <= 100 for line in r.out.splitlines())
    assert "Megatron column→row on axis 0: fc1 → fc2" in r.out
    search = mlp_files["report"].read_text()
    section = search[search.index("strategy by module group") : search.index("collectives of one step")]
    assert section in r.out  # the same report as search printed
    assert "data parallel" not in r.out  # --out files carry no baseline


def test_show_of_json_output_includes_the_baseline(cli, mlp_files: dict[str, Path]) -> None:
    r = cli("show", str(mlp_files["json"]))
    assert r.code == 0, r.err
    assert "data parallel: not possible: a batch of 1 does not split over 8 devices" in r.out


def test_plan_summary_is_the_report(mlp_files: dict[str, Path]) -> None:
    text = load_plan(mlp_files["plan"]).summary()
    assert "Megatron column→row" in text and all(len(line) <= 100 for line in text.splitlines())
    assert all(len(line) <= 72 for line in load_plan(mlp_files["plan"]).summary(width=72).splitlines())


def test_dot_to_stdout_parses(cli, mlp_files: dict[str, Path]) -> None:
    r = cli("dot", str(mlp_files["plan"]))
    assert r.code == 0, r.err
    graph = parse_dot(r.out)
    labels = {n.get_name(): str(n.get("label")) for n in graph.get_nodes()}
    assert any("linear: R, S(0), S(0) -> S(2)" in label for label in labels.values())  # fc1, S/R/P notation
    assert any("fc2.weight" in label and "S(1)" in label for label in labels.values())
    collective = [e for e in graph.get_edges() if "all_reduce" in str(e.get("label"))]
    assert any("fwd all_reduce axis 0: 32.0 MiB" in str(e.get("label")) for e in collective)


def test_dot_of_a_layer_stack_collapses_layers(cli, wide_plan: Path) -> None:
    r = cli("dot", str(wide_plan))
    graph = parse_dot(r.out)
    clusters = {str(s.get("label")).strip('"'): s for s in graph.get_subgraphs()}
    assert set(clusters) == {"layers.0–5 (×6)", "legend"}
    inside = {str(n.get("label")).split("\\n")[0].strip('"') for n in clusters["layers.0–5 (×6)"].get_nodes()}
    assert {"fc1", "act", "fc2", "fc1.weight", "fc2.weight"} <= inside  # one box per layer position
    # the edge into the next layer's fc1 carries the sequence-parallel all-gather, paid by 5 of 6 layers
    # (on axis 1 only since issue 13's overlap model: test_user_spec_with_repeated_layers_on_a_2d_mesh)
    labels = [str(e.get("label")) for e in graph.get_edges()]
    assert any("fwd all_gather axis 1: 32.0 MiB" in label and "×5" in label for label in labels)


def test_dot_ops_level_has_one_box_per_operator(cli, mlp_files: dict[str, Path]) -> None:
    r = cli("dot", str(mlp_files["plan"]), "--ops")
    graph = parse_dot(r.out)
    boxes = [n for n in graph.get_nodes() if n.get("shape") == "box"]
    assert len(boxes) == 3  # linear, gelu, linear_1


def test_dot_to_file(cli, mlp_files: dict[str, Path], tmp_path: Path) -> None:
    target = tmp_path / "mlp.dot"
    r = cli("dot", str(mlp_files["plan"]), "-o", str(target))
    assert r.code == 0 and r.out.strip() == f"wrote {target}"
    parse_dot(target.read_text())


def test_dot_rendered_formats_need_graphviz(
    cli, mlp_files: dict[str, Path], tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setattr("autoshard.report.dot.shutil.which", lambda name: None)
    r = cli("dot", str(mlp_files["plan"]), "-o", str(tmp_path / "mlp.png"))
    assert r.code == 2 and "graphviz's `dot` is not installed" in r.err and "mlp.dot" in r.err


def test_dot_reports_a_graphviz_failure(cli, mlp_files: dict[str, Path], tmp_path: Path, monkeypatch) -> None:
    fake = tmp_path / "dot"
    fake.write_text("#!/bin/sh\necho 'Error: syntax error in line 1' >&2\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    r = cli("dot", str(mlp_files["plan"]), "-o", str(tmp_path / "mlp.svg"))
    assert r.code == 2 and "graphviz failed to render" in r.err and "syntax error" in r.err


def test_dot_refuses_an_unknown_suffix(cli, mlp_files: dict[str, Path], tmp_path: Path) -> None:
    """`-o plan.xyz` wrote DOT text under a name that promised something else (new-user trial)."""
    r = cli("dot", str(mlp_files["plan"]), "-o", str(tmp_path / "plan.xyz"))
    assert r.code == 2 and "unknown format .xyz" in r.err and ".svg" in r.err
    assert not (tmp_path / "plan.xyz").exists()
