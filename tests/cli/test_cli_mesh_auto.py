"""``--mesh auto`` (the default): the report names the chosen mesh and the runners-up."""

from __future__ import annotations


def test_mesh_auto_reports_the_best_mesh_and_the_runners_up(cli) -> None:
    r = cli(
        "search", "--profile", "a100x8", "--model", "mlp", "--batch", "16", "--seq", "4096", "--nodes", "2",
        "--max-axes", "2", "--no-baseline",
    )  # fmt: skip
    assert r.code == 0, r.err
    # the 16-wide mesh is planned, or pruned by a bound above the 2x8 plan (autoshard/meshbound.py)
    assert "mesh search: 2 meshes tried" in r.out and "; best 2x8:" in r.out
    assert "runner-up 16:" in r.out
