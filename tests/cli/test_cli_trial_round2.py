"""Commands of the second new-user trial whose output misled, one test each: a pipeline degree refused with
only half of its limits named."""

from __future__ import annotations

from cli_support import run_main


def test_a_pipeline_degree_refusal_names_both_limits() -> None:
    """llama-tiny on 8 devices with ``--pp 3`` offered [1, 2] as if only they divided 8: 4 and 8 do too, the
    model's 2 layers rule them out."""
    r = run_main("search", "--profile", "a100x8", "--model", "llama-tiny", "--mesh", "8", "--pp", "3")
    assert r.code == 2 and r.err.count("\n") == 1
    assert "use one of [1, 2] (a degree must divide 8 and be at most the model's 2 repeated layers)" in r.err
