"""``autoshard shapes``: two sequence buckets, one shared parameter layout."""

from __future__ import annotations


def test_shapes_prints_each_bucket_and_the_shared_layout(cli) -> None:
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
    )
    assert r.code == 0, r.err
    assert "2 input shapes, one parameter layout" in r.out
    assert "weight 0.75: input_ids (8, 16)" in r.out and "weight 0.25: input_ids (8, 64)" in r.out
    assert "transformer.h.0.attn.c_attn.weight:" in r.out


def test_shapes_refuses_a_malformed_bucket(cli) -> None:
    r = cli("shapes", "--profile", "a100x8", "--model", "gpt2-tiny", "--shapes", "8by16")
    assert r.code == 2 and "BATCHxSEQ:WEIGHT" in r.err
