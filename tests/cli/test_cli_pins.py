"""``search --annotate fc1=column --annotate fc2=row`` and ``--forbid``: Megatron computation where data
parallel would win, with the price of the pins in the report."""

from __future__ import annotations

from cli_support import HERE

SMALL = f"{HERE / 'cli_models.py'}:small_mlp"


def test_column_row_on_a_small_mlp_reports_one_all_reduce_and_the_price(cli) -> None:
    r = cli(
        "search", "--profile", "a100x8", "--model", SMALL, "--annotate", "fc1=column", "--annotate", "fc2=row",
        "--price-pins", "meshes", "--no-baseline",
    )  # fmt: skip
    assert r.code == 0, r.err
    rows = [line.split() for line in r.out.splitlines() if line.lstrip().startswith(("fwd ", "bwd "))]
    assert [row[:2] for row in rows if row[0] == "fwd"] == [["fwd", "all_reduce"]]
    assert not any(row[1] == "all_gather" for row in rows)
    # no extra cost: Megatron's pins are the free search's own plan, proven by its step
    # (tests/planner/test_planner_pins.py)
    # priced against every mesh searched unpinned (--price-pins meshes), the best of which is this one's
    out = " ".join(r.out.split())
    assert "price of your annotations:" in out
    assert "unpinned optimum on mesh 8, the best of the 3 meshes" in out
    assert "(no extra cost)" in out


def test_forbid_and_allow_kinds(cli) -> None:
    r = cli("search", "--profile", "a100x8", "--model", "mlp", "--forbid", "tp", "--no-baseline")
    assert r.code == 0, r.err
    # the price names what was pinned: no annotation was given (new-user trial: "price of your annotations")
    assert "price of forbidding tp: " in r.out and "annotations" not in r.out
    r = cli("search", "--profile", "a100x8", "--model", "mlp", "--forbid", "zero", "--no-baseline")
    assert r.code == 2 and r.err.count("\n") == 1 and "unknown parallelism kind 'zero'" in r.err
    r = cli("search", "--profile", "a100x8", "--model", "mlp", "--allow", "dp", "--pp", "2")  # pp not allowed
    assert r.code == 2 and r.err.count("\n") == 1 and "pp is forbidden (allow/forbid)" in r.err, r.err


def test_allow_tp_splits_no_activation_by_batch(cli) -> None:
    """``--allow tp`` (dp and fsdp forbidden) on GPT-2: was "DP 8", the batch split after the embedding."""
    r = cli(
        "search", "--profile", "a100x8", "--model", "gpt2", "--mesh", "8", "--allow", "tp", "--no-baseline"
    )
    assert r.code == 0, r.err
    assert r.out.splitlines()[0].startswith("TP 8")
    assert "batch on axis" not in r.out and "FSDP" not in r.out and "data parallel on axis" not in r.out


def test_one_target_pinned_two_ways_is_refused(cli) -> None:
    """``--annotate fc1=column --annotate fc1=replicate`` kept the last pin silently."""
    base = ("search", "--profile", "a100x8", "--model", "mlp", "--mesh", "8", "--no-baseline")
    r = cli(*base, "--annotate", "fc1=column", "--annotate", "fc1=replicate")
    assert r.code == 2 and r.err.count("\n") == 1 and "Traceback" not in r.err
    assert "--annotate fc1=column and --annotate fc1=replicate pin fc1 two ways" in r.err
    r = cli(*base, "--annotate", "fc1=row", "--annotate", "fc1.weight=R")
    assert r.code == 2 and r.err.count("\n") == 1
    assert "'fc1.weight' = ('R',) conflicts with annotation 'fc1' = 'row'" in r.err
    r = cli(*base, "--annotate", "fc1=column", "--forbid", "tp")
    assert r.code == 2 and "annotation 'fc1' = 'column' contradicts forbidding tp" in r.err
    assert cli(*base, "--annotate", "fc1=column", "--annotate", "fc1=column").code == 0  # the same pin twice
