"""Error and warning text as a new user reads it: each warning once, no "matches no a module", a table total
wrapped rather than cut mid-parenthesis, and advice that leaves out what the user already did."""

from __future__ import annotations

from cli_support import HERE

MLP8 = ("search", "--profile", "a100x8", "--model", "mlp", "--mesh", "8", "--no-baseline")


def test_each_warning_once_across_mesh_candidates_and_the_baseline(cli, recwarn) -> None:
    """Three mesh candidates and the baseline each planned the same capture: each warning printed 2-4 times
    (under pytest the warnings are recorded, not printed: the same path, one call of showwarning each)."""
    r = cli("search", "--profile", "a100x8", "--model", f"{HERE / 'cli_models.py'}:unruled")
    assert r.code == 0, r.err
    texts = [str(w.message) for w in recwarn]
    assert len(texts) == len(set(texts)) >= 2 and all("linalg_qr" in t for t in texts), texts


def test_no_match_reads_as_english(cli) -> None:
    for choice, what in (("column", "module with parameters"), ("S(0)", "parameter, buffer or input")):
        r = cli(*MLP8, "--annotate", f"fcx={choice}")
        assert r.code == 2 and f"'fcx' matches no {what}; did you mean" in r.err, r.err
        assert "no a " not in r.err
    r = cli(*MLP8, "--annotate", "fc1=ring")  # ring is a choice the command line accepts (README)
    assert r.code == 2 and r.err.count("\n") == 1, r.err
    assert "pins a module that runs scaled_dot_product_attention, and this model runs none" in r.err
    assert (
        "did you mean fc1" not in r.err and "column, row, vocab or replicate" in r.err
    )  # the kinds that fit


def test_ring_on_a_module_without_attention_says_where_attention_runs(cli) -> None:
    """A new-user trial read "did you mean fc1, fc2?" for ``fc1=ring``: the target was right, the kind wrong."""
    r = cli("search", "--profile", "a100x8", "--model", "gpt2-tiny", "--mesh", "8", "--no-baseline",
            "--annotate", "transformer.h.0.mlp=ring")  # fmt: skip
    assert r.code == 2 and r.err.count("\n") == 1, r.err
    assert (
        "transformer.h.0.mlp matches none: attention runs in transformer.h.0.attn, transformer.h.1.attn"
        in r.err
    )
    assert "(*.attn=ring pins them all); other choices are column, row" in r.err and "ring on an" not in r.err
    r = cli(*MLP8, "--annotate", "fc1.weight=column")  # a name of another kind: its choices, not itself
    assert r.code == 2 and "fc1.weight is no module with parameters; the choices are column" in r.err, r.err
    assert "placements like '(R, S(0))' on a parameter" in r.err and "did you mean" not in r.err


def test_budget_advice_leaves_out_what_was_done(cli) -> None:
    r = cli(*MLP8, "--memory-limit", "0.01")
    assert r.code == 2 and r.err.count("\n") == 1, r.err
    what, fix = r.err.split(" Fix: ")
    # the MLP has no repeated block to recompute: neither said as tried nor advised (new-user trial)
    assert "recomput" not in what and "recompute" not in fix
    assert "allow fsdp" not in fix and "raise the memory limit" in fix
    r = cli(*MLP8, "--memory-limit", "0.01", "--forbid", "fsdp")
    assert (
        "; fsdp forbidden (left: dp, tp, sp, cp, ep, pp); pipeline stages tried: --pp 2 or more: " in r.err
        and "allow fsdp" in r.err.split(" Fix: ")[1]
    )


def test_collective_total_is_wrapped_not_cut(mlp_files) -> None:
    report = mlp_files["report"].read_text()
    total = report[report.index("  total: ") :].split("\n\n")[0]
    assert "…" not in total and total.count("(") == total.count(")")


def test_a_first_clause_cut_inside_parentheses_is_closed() -> None:
    """The baseline line of a memory refusal was cut at the '; ' inside its parenthesis: '(10.47 GiB over'."""
    from autoshard.cli.args import first_clause

    error = ValueError(
        "every plan needs at least 50.47 GiB (10.47 GiB over; the largest temporary 1 GiB); try X"
    )
    assert first_clause(error) == "every plan needs at least 50.47 GiB (10.47 GiB over)"
    assert first_clause(ValueError("plain; how to fix")) == "plain"
