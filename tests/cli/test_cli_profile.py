"""``autoshard profile`` on CPU/gloo writes a profile that loads and plans (tiny sizes: a few seconds)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import autoshard
from cost_models import load_profile


@pytest.mark.slow  # forks four gloo ranks
def test_profile_on_cpu_writes_a_profile_that_loads_and_plans(cli, tmp_path: Path) -> None:
    out, raw = tmp_path / "node.json", tmp_path / "raw.json"
    r = cli(
        "profile", "--out", str(out), "--ranks", "4", "--mesh", "2x2", "--gemm-sizes", "32,64",
        "--stream-mib", "1", "--message-sizes", "4096,65536", "--repeats", "2", "--raw", str(raw),
    )  # fmt: skip
    assert r.code == 0, r.err
    profile = load_profile(out)
    assert profile.devices_per_node == 4 and profile.compute.efficiency_max == 1.0
    measured = json.loads(raw.read_text())
    # the collectives really ran on two gloo ranks, every kind at every size
    assert {k: [s for s, _ in v] for k, v in measured["collectives"].items()} == {
        k: [4096, 65536] for k in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
    }
    assert all(t > 0 for v in measured["collectives"].values() for _, t in v)
    assert set(measured["axes"]) == {"axis0 (2 ranks)", "axis1 (2 ranks)"}  # each mesh axis timed too
    assert "axis0 (2 ranks): all_reduce" in r.out
    assert "GFLOP/s (float32, best at n=" in r.out and "no datasheet peak" in r.out
    assert all("autoshard profile" in profile.source_of(p) for p in ("intra_node.bus_bandwidth.all_reduce",))
    cluster = autoshard.load_cluster(str(out))
    plan = autoshard.plan(torch.nn.Linear(8, 8), cluster, (torch.randn(4, 8),))
    assert plan.cluster["profile"] == "node"


def test_gemm_summary_says_the_rate_and_what_it_is_a_fraction_of() -> None:
    """On a CPU against an A100's peak the efficiency is 0.0004: the old line printed 'GEMM efficiency 0.00'."""
    from autoshard.cli.profile import gemm_summary

    gemm = [(256, 2 * 256**3 / 20e9), (512, 2 * 512**3 / 40e9)]  # 20 and 40 GFLOP/s
    alone = gemm_summary(gemm, "float32", 40e9, None)
    assert alone.startswith("GEMM 40.0 GFLOP/s (float32, best at n=512); no datasheet peak")
    against = gemm_summary(gemm, "float32", 19.5e12, "a100x8")
    assert (
        against
        == "GEMM 40.0 GFLOP/s (float32, best at n=512) = 0.00205 of the a100x8 float32 peak, 19.5 TFLOP/s"
    )


def test_profile_refuses_bad_sizes(cli, tmp_path: Path) -> None:
    r = cli("profile", "--out", str(tmp_path / "p.json"), "--gemm-sizes", "64,x")
    assert r.code == 2 and "whole numbers" in r.err
    r = cli("profile", "--out", str(tmp_path / "p.json"), "--ranks", "2", "--mesh", "2x2")
    assert r.code == 2 and "--mesh 2x2 has 4 ranks" in r.err


def test_a_busbw_above_the_memory_copy_rate_is_warned_with_the_sizes_to_raise(tmp_path: Path) -> None:
    """The trial's profile: all_reduce fitted at 124 GB/s over 1-64 KiB messages beside a 12.8 GB/s copy, and
    a 16 MiB copy faster than the cpu datasheet (it stayed in cache); both written without a word."""
    from autoshard.cli.profile import implausible
    from autoshard.profiling import Measurements, profile_document

    m = Measurements("CPU (2 cores)", "float32", 2, gemm=[(256, 1e-3)], launch=5e-6, capacity=2**33)
    m.stream = (2 * 16 * 2**20, 2 * 16 * 2**20 / 20e9)  # 20 GB/s: above the cpu profile's 12.8
    for kind in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
        m.collectives[kind] = [(1024, 50e-6), (65536, 50.5e-6)]  # flat: latency only
    path = tmp_path / "node.json"
    path.write_text(json.dumps(profile_document(m, "node", load_profile("cpu"))))
    lines = implausible(m, load_profile(str(path)), "cpu")
    assert len(lines) == 2
    assert (
        lines[0].startswith("busbw all_reduce ")
        and "above the memory copy rate measured here, 20.0 GB/s" in lines[0]
    )
    assert lines[0].endswith("messages up to 65536 B time latency, not bandwidth; measure larger ones, e.g. "
                             "--message-sizes 1048576,4194304,16777216")  # fmt: skip
    assert lines[1] == (
        "memory copy 20.0 GB/s above the cpu datasheet 12.8 GB/s: a copy of 16 MiB stays in cache; measure a "
        "larger one, e.g. --stream-mib 256"
    )
    m.collectives = {k: [(2**20, 1e-3), (2**24, 16e-3)] for k in m.collectives}  # ~1 GB/s: plausible
    m.stream = (2 * 2**28, 2 * 2**28 / 10e9)
    path.write_text(json.dumps(profile_document(m, "node", load_profile("cpu"))))
    assert implausible(m, load_profile(str(path)), "cpu") == []
