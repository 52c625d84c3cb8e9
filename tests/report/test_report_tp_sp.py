"""What a mesh axis is called when weights and the sequence are both split on it, and a DP axis's share.

The last trial: Llama 3 405B's published layout (PP 16 x TP 8 x CP 16 x DP 8) was headed ``SP 8 (...
model.layers.0-125 MLP column-split on axis 3; ... attention column-split on axis 3)``: on that axis every
matmul uses its weight split (column), the norms and the residual run split by sequence between them, and
attention (by heads, its K/V brought there by all-to-all) outweighs the matmuls, so the sequence family won.
That is Megatron's tensor parallelism with sequence parallelism: ``TP 8 (+SP)``.  ``SP`` stays the name of an
axis that splits the sequence with its weights whole (Ulysses), ``CP`` that of attention split by sequence.
And a DP axis's line left attention's share out: attention split on dim 0 (the batch) read as no split.
Hand-written plans (``tests/cli/report_cases.py``), one per kind.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from autoshard.pipeline.summary import degrees_of, headline
from autoshard.plans import Plan
from autoshard.report.table import render

sys.path.insert(0, str(Path(__file__).parents[1] / "cli"))  # the hand-written plans of the report tests
import report_cases as cases

LINEAR, SDPA, NORM = cases.LINEAR, cases.SDPA, cases.LAYER_NORM


def _body(plan: Plan) -> str:
    return " ".join(render(plan).split())  # the body's lines are wrapped


def _megatron_sp_layer() -> Plan:
    """One layer on 8 devices as Megatron-LM runs it with --sequence-parallel: norms split by sequence, the
    input gathered into the column-split projections, the row-split outputs reduce-scattered back."""
    ops = [
        ("layer_norm", "layers.0.ln1", NORM, "S(1), R, R -> S(1)"),
        ("linear", "layers.0.attn.qkv", LINEAR, "R, S(0) -> S(2)"),
        ("sdpa", "layers.0.attn", SDPA, "S(1), S(1), S(1) -> S(1)"),
        ("linear_1", "layers.0.attn.out", LINEAR, "S(2), S(1) -> P"),
        ("layer_norm_1", "layers.0.ln2", NORM, "S(1), R, R -> S(1)"),
        ("linear_2", "layers.0.mlp.fc1", LINEAR, "R, S(0) -> S(2)"),
        ("linear_3", "layers.0.mlp.fc2", LINEAR, "S(2), S(1) -> P"),
    ]
    params = {
        "layers.0.attn.qkv.weight": ("S(0)",),
        "layers.0.attn.out.weight": ("S(1)",),
        "layers.0.mlp.fc1.weight": ("S(0)",),
        "layers.0.mlp.fc2.weight": ("S(1)",),
    }
    comms = [
        cases.collective(kind, "forward", src, dst, f"layers.0.{where}")
        for kind, src, dst, where in (
            ("all_gather", "layer_norm", "linear", "attn.qkv"),
            ("reduce_scatter", "linear_1", "layer_norm_1", "attn.out"),
            ("all_gather", "layer_norm_1", "linear_2", "mlp.fc1"),
            ("reduce_scatter", "linear_3", "output", "mlp.fc2"),
        )
    ]
    return cases.make_plan((8,), params, ops, comms, layers=4)


def test_megatron_tensor_parallel_with_sequence_parallel_is_tp_plus_sp() -> None:
    plan = _megatron_sp_layer()
    assert headline(plan) == "TP 8 (+SP), 1 microbatch"
    assert (
        "axis 0 (8): TP (+SP): weights used split (100% of the matmul compute, 100% of the weighted), "
        "activations between them "
        "split by sequence (norms)" in _body(plan)
    )
    assert degrees_of(plan) == {"tp": 8}


def test_whatif_holds_a_tp_plus_sp_plan_to_its_sequence_split() -> None:
    """The norms of a TP (+SP) axis split the sequence 8 ways: a what-if below 8 tokens cannot run it (whatif
    held only CP and SP degrees to the sequence; the 405B's axis 3 lost its limit when it became TP)."""
    import sympy

    from autoshard.whatif_limits import plan_limits

    limits = plan_limits(_megatron_sp_layer(), sympy.Integer(0), sympy.Integer(1))
    assert [(lim.rule, lim.need, lim.names) for lim in limits] == [("seq", 8, "TP (+SP)")]
    assert plan_limits(cases.megatron_mlp(), sympy.Integer(0), sympy.Integer(1)) == []


def _405b_axis(attention: float) -> Plan:
    """Axis 3 of the 405B plan in miniature: q, o and the MLP column-split with their inputs gathered, k and
    v computed split by sequence (weights whole) and brought to heads by all-to-all, attention by heads,
    norms by sequence; attention takes ``attention`` seconds against 0.4 s of matmuls (2/3 in the 405B)."""
    col = "R, S(0) -> S(2)"
    ops = [
        ("layer_norm", "layers.0.ln", NORM, "S(1), R, R -> S(1)"),
        ("linear", "layers.0.attn.q", LINEAR, col),
        ("linear_1", "layers.0.attn.k", LINEAR, "S(1), R -> S(1)"),
        ("linear_2", "layers.0.attn.v", LINEAR, "S(1), R -> S(1)"),
        ("transpose", "layers.0.attn", "aten.transpose.int", "S(1) -> S(2)"),
        ("sdpa", "layers.0.attn", SDPA, "S(1), S(1), S(1) -> S(1)"),
        ("linear_3", "layers.0.attn.o", LINEAR, col),
        ("linear_4", "layers.0.mlp.up", LINEAR, col),
        ("linear_5", "layers.0.mlp.down", LINEAR, col),
    ]
    params = {f"layers.0.{m}.weight": ("S(0)",) for m in ("attn.q", "attn.o", "mlp.up", "mlp.down")}
    params |= {"layers.0.attn.k.weight": ("R",), "layers.0.attn.v.weight": ("R",)}
    comms = [
        cases.collective("all_to_all", "forward", "transpose", "sdpa", f"layers.{i}.attn", layer=i)
        for i in range(4)
    ]
    plan = cases.make_plan((8,), params, ops, comms, layers=4)
    seconds = {"linear": 0.05, "linear_1": 0.005, "linear_2": 0.005, "linear_3": 0.05}
    return cases.timed(plan, seconds | {"linear_4": 0.145, "linear_5": 0.145, "sdpa": attention})


def test_an_axis_whose_matmuls_split_weights_is_tp_plus_sp_even_when_attention_outweighs_them() -> None:
    plan = _405b_axis(attention=0.8)  # sequence (attention, k, v): 81% of the weighted compute
    head = headline(plan)
    assert head == "TP 8 (+SP), 1 microbatch", head  # was "SP 8 (layers.0–3 MLP column-split on axis 0; ...)"
    assert (
        "axis 0 (8): TP (+SP): weights used split (98% of the matmul compute, 32% of the weighted), "
        "activations between them "
        "split by sequence (68% of the weighted compute, attention's heads exchanged by all-to-all)"
        in _body(plan)
    )
    assert degrees_of(plan) == {"tp": 8}
    assert headline(_405b_axis(attention=0.1)) == "TP 8 (+SP), 1 microbatch"  # matmuls outweigh: the same


def test_sequence_split_with_weights_whole_stays_sp() -> None:
    plan = cases.ulysses_attention_stack()  # every matmul split by sequence, its weight replicated
    assert headline(plan) == "SP 8, 1 microbatch"
    assert "axis 0 (8): SP: activations split by sequence, attention not by sequence" in _body(plan)


def test_tensor_parallel_without_sequence_split_is_plain_tp() -> None:
    assert headline(cases.megatron_mlp()) == "TP 8, 1 microbatch"


def test_a_ring_axis_is_cp_not_tp_plus_sp() -> None:
    ops = [
        ("linear", "attn.q", LINEAR, "S(1), R -> S(1)"),
        ("sdpa", "attn", SDPA, "S(2), S(2), S(2) -> S(2)"),
    ]
    plan = dataclasses.replace(cases.make_plan((2,), {"attn.q.weight": ("R",)}, ops), context_axis=0)
    assert headline(plan) == "CP 2 (contiguous), 1 microbatch"


def test_a_dp_axis_counts_attention_split_by_batch() -> None:
    """Attention splits dim 0 of its (B, H, S, D) operands on a DP axis: that is the batch, and its share is
    the DP axis's (it read as no split, so the line said 50% here; the 405B's DP axis 34%)."""
    batch = "S(0), R -> S(0)"
    ops = [
        ("linear", "attn.q", LINEAR, batch),
        ("sdpa", "attn", SDPA, "S(0), S(0), S(0) -> S(0)"),
        ("linear_1", "head", LINEAR, "S(0), R -> S(0)"),
    ]
    params = {"attn.q.weight": ("R",), "head.weight": ("R",)}  # the LM head replicated, as in the trial
    plan = cases.timed(cases.make_plan((2,), params, ops), {"linear": 0.25, "sdpa": 0.5, "linear_1": 0.25})
    assert headline(plan) == "DP 2, 1 microbatch"
    assert "axis 0 (2): DP: activations split by batch (100% of the weighted compute)" in _body(plan)


def test_a_planned_llama_with_megatron_pins_and_long_sequences_reads_tp_plus_sp() -> None:
    """llama-tiny at 1 x 2048 tokens on 8 A100s, its projections pinned column/row and CP forbidden: the
    optimum runs the norms split by sequence between the TP matmuls (the same volume as the all-reduces,
    the norms' compute and activations split 8 ways).  The headline said ``TP 8``; the patterns already found
    sequence parallelism on that axis."""
    import autoshard
    from autoshard import zoo
    from autoshard.runtime.verify import cluster_for

    case = zoo.build("llama-tiny", batch=1, seq=2048, device="meta")
    pins = {f"*.{m}": "column" for m in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")}
    pins |= {"*.o_proj": "row", "*.down_proj": "row"}
    cluster = cluster_for("a100x8", 8)
    plan = autoshard.plan(case.model, cluster, case.args, case.kwargs, annotations=pins, forbid=["cp"])
    body = _body(plan)
    assert "sequence parallel on axis 0 (norms and activations split by sequence)" in body
    assert headline(plan) == "TP 8 (+SP), 1 microbatch"
    assert "axis 0 (8): TP (+SP): weights used split" in body and plan.degrees == {"tp": 8}
