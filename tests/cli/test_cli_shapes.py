"""``autoshard shapes``: two sequence buckets, one shared parameter layout."""

from __future__ import annotations


def test_shapes_prints_each_bucket_and_the_shared_layout(cli, tmp_path) -> None:
    r = cli(
        "shapes",
        "--profile",
        "a100x8",
        "--model",
        "gpt2-tiny",
        "--mesh",
        "8",
        "--shapes",
        "8x16:0.75,8x64:0.25",
        "--out",
        str(tmp_path / "plan.json"),  # new-user trial: no --out, so a several-shapes plan could not be saved
    )
    assert r.code == 0, r.err
    assert "2 input shapes, one parameter layout" in r.out
    assert "weight 0.75: input_ids (8, 16)" in r.out and "weight 0.25: input_ids (8, 64)" in r.out
    layers = [line for line in r.out.splitlines() if "attn.c_attn.weight:" in line]
    assert layers == [layers[0]] and layers[0].startswith(
        "  transformer.h.0–1.attn.c_attn.weight: "
    )  # grouped
    from autoshard.plans import load_plan

    short, long = (load_plan(tmp_path / f"plan.8x{n}.json") for n in (16, 64))
    assert f"wrote {tmp_path / 'plan.8x64.json'}" in r.out
    assert short.input_shapes["input_ids"][0] == (8, 16) and long.input_shapes["input_ids"][0] == (8, 64)
    assert short.param_placements == long.param_placements  # one layout


def test_shapes_out_is_refused_before_planning(tmp_path) -> None:
    import pytest

    from autoshard.cli.args import CliError
    from autoshard.cli.shapes import shape_paths

    with pytest.raises(CliError, match="repeats a shape"):
        shape_paths(str(tmp_path / "p.json"), [(8, 16, 0.5), (8, 16, 0.5)])
    with pytest.raises(CliError, match="does not exist; create it first"):
        shape_paths(str(tmp_path / "no" / "p.json"), [(8, 16, 1.0)])


def test_collapse_layers_keeps_runs_with_one_value() -> None:
    from autoshard.report.groups import collapse_layers

    values = {"h.0.w": ("R",), "h.1.w": ("R",), "h.2.w": ("S(0)",), "h.3.w": ("R",), "wte.weight": ("R",)}
    assert collapse_layers(values) == [
        ("h.0–1.w", ("R",)),
        ("h.2.w", ("S(0)",)),
        ("h.3.w", ("R",)),
        ("wte.weight", ("R",)),
    ]


def test_shapes_refuses_a_malformed_bucket(cli) -> None:
    r = cli("shapes", "--profile", "a100x8", "--model", "gpt2-tiny", "--shapes", "8by16")
    assert r.code == 2 and "BATCHxSEQ:WEIGHT" in r.err


def test_shapes_weights_every_shape_or_none(cli) -> None:
    """New-user trial: ``8x512:0.7,8x1024`` gave the bare shape weight 1 and summed the steps."""
    from autoshard.cli.shapes import parse_shapes

    assert parse_shapes("8x16,8x64") == [(8, 16, 0.5), (8, 64, 0.5)]  # none: equal weights
    assert parse_shapes("8x16:0.7,8x64:0.3") == [(8, 16, 0.7), (8, 64, 0.3)]
    r = cli("shapes", "--profile", "a100x8", "--model", "gpt2-tiny", "--shapes", "8x512:0.7,8x1024")
    assert r.code == 2 and "Traceback" not in r.err and len(r.err.strip().splitlines()) == 1
    assert "8x1024: no weight where other shapes have one" in r.err
