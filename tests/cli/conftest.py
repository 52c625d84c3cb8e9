"""Fixtures of the CLI tests: ``main`` run in-process, and plans saved once per session.

Planning here uses only models that plan in about a second on the meta device or the CPU (``mlp``,
``mlp-deep``, ``seed``, the user-spec models of ``cli_models.py``): a subprocess pays ~2 s of
``import torch`` (and ~5 s more for transformers), so only two tests start one.  The one larger pair:
LLaMA-tiny pipelined and flat (``pipelined_plans``), made once for the two files that read it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from cli_support import WIDE, Result, run_main


@pytest.fixture
def cli() -> Callable[..., Result]:
    return run_main


@pytest.fixture(scope="session")
def mlp_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The Megatron MLP on one a100x8 node (a 1-D mesh of 8, not --mesh auto), planned once: the ``--out``
    file (``plan``), the ``--json`` output (``json``), the ``--dot`` file (``dot``) and the text report
    (``report``)."""
    root = tmp_path_factory.mktemp("mlp")
    files = {"plan": root / "plan.json", "json": root / "stdout.json", "dot": root / "plan.dot"}
    result = run_main(
        "search", "--profile", "a100x8", "--model", "mlp", "--mesh", "8", "--out", str(files["plan"]),
        "--dot", str(files["dot"]), "--json",
    )  # fmt: skip
    assert result.code == 0, result.err
    files["json"].write_text(result.out)
    report = run_main("search", "--profile", "a100x8", "--model", "mlp", "--mesh", "8", "--no-baseline")
    assert report.code == 0, report.err
    files["report"] = root / "report.txt"
    files["report"].write_text(report.out)
    return files


@pytest.fixture(scope="session")
def wide_plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Six wide residual MLP blocks (a user-spec file) on a 2 x 4 mesh, saved with --out: repeated layers,
    a 2-D mesh, Megatron column→row with sequence parallelism between the blocks."""
    path = tmp_path_factory.mktemp("wide") / "wide.json"
    result = run_main(
        "search", "--profile", "a100x8", "--model", WIDE, "--mesh", "2x4", "--no-baseline", "--out", str(path)
    )
    assert result.code == 0, result.err
    return path


@pytest.fixture(scope="session")
def pipelined_plans(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """LLaMA-tiny on 2 nodes of the cpu profile (a fixed 2 x 4 mesh), saved with --out pipelined (--pp 2) and
    flat: one pair for the pipelined whatif/explain tests (an --out file holds no baseline: --no-baseline)."""
    root = tmp_path_factory.mktemp("pp")
    pp, flat = root / "pp.json", root / "flat.json"
    common = ("--profile", "cpu", "--nodes", "2", "--mesh", "2x4", "--model", "llama-tiny", "--no-baseline")
    for path, extra in ((pp, ("--pp", "2")), (flat, ())):
        done = run_main("search", *common, *extra, "--out", str(path))
        assert done.code == 0, done.err
    return pp, flat
