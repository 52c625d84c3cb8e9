"""Commands of the second new-user trial whose output misled, one test each: a pipeline degree refused with
only half of its limits named; a stage table whose headers ran together; ``ops`` counting causal attention
as the full square."""

from __future__ import annotations

from cli_support import run_main

from autoshard import zoo
from autoshard.capture import capture
from autoshard.strategies.coverage import op_coverage
from cost_models.compute import causal_share


def test_a_pipeline_degree_refusal_names_both_limits() -> None:
    """llama-tiny on 8 devices with ``--pp 3`` offered [1, 2] as if only they divided 8: 4 and 8 do too, the
    model's 2 layers rule them out."""
    r = run_main("search", "--profile", "a100x8", "--model", "llama-tiny", "--mesh", "8", "--pp", "3")
    assert r.code == 2 and r.err.count("\n") == 1
    assert "use one of [1, 2] (a degree must divide 8 and be at most the model's 2 repeated layers)" in r.err


def test_whatif_stage_table_values_start_under_their_headers(tmp_path) -> None:
    """``whatif --set`` on a pipelined plan: "stage ranks" ran together and the rows read as misaligned."""
    plan = str(tmp_path / "pp.json")
    args = ("--profile", "cpu", "--model", "llama-tiny", "--mesh", "4", "--pp", "2", "--no-baseline")
    assert run_main("search", *args, "--out", plan).code == 0
    r = run_main("whatif", plan, "--set", "memory=40")
    assert r.code == 0, r.err
    lines = r.out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.lstrip().startswith("stage "))
    header, row = lines[head], lines[head + 1]
    assert "stage  ranks  layers  time/microbatch" in header
    for word, value in (("ranks", "0..1"), ("layers", "0")):
        at = header.index(word)
        assert row[at : at + len(value)] == value and row[at - 2 : at] == "  "


def test_ops_counts_attention_over_a_proven_causal_mask_as_the_planner_prices_it() -> None:
    """``autoshard ops llama3-8b`` showed SDPA at 12.51% of the FLOPs, the full square, while the planner
    prices the causal triangle: the table now counts the triangle and says so."""
    case = zoo.build("llama-tiny", batch=2, seq=32)
    captured = capture(case.model, case.args)
    sdpa = "aten.scaled_dot_product_attention.default"
    square = next(r.flops for r in op_coverage(captured) if r.op == sdpa)
    triangle = next(r.flops for r in op_coverage(captured, causal=True) if r.op == sdpa)
    assert triangle == round(square * causal_share(32, 32))  # (S + 1) / 2S of the square
    r = run_main("ops", "llama-tiny", "--seq", "32", "--batch", "2")
    assert r.code == 0, r.err
    assert "attention: explicit masks proven causal count the causal triangle, not the full square" in r.out
    data = run_main("ops", "llama-tiny", "--seq", "32", "--batch", "2", "--json").json()
    assert data["causal_masks_counted_as_triangle"] is True
    assert next(op["flops"] for op in data["ops"] if op["op"] == sdpa) == triangle
