"""``verify --plan``: the plan you deploy, mapped onto a scaled-down copy of its model on a shrunk mesh, and
the rule that a check in which nothing distributed ran is never reported OK."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from context_cases import count_hops

import autoshard
from autoshard import zoo
from autoshard.cli import main
from autoshard.plans import Plan
from autoshard.runtime.mapping import _ring_note, map_plan, shrink_mesh
from autoshard.runtime.scaled import build_scaled
from autoshard.runtime.verify import cluster_for, run_verify


@pytest.fixture(scope="module")
def llama70b_plan() -> Plan:
    """LLaMA-3-70B planned at real size on 128 nodes x 8 A100s (meta device, ~4 s)."""
    case = zoo.build("llama3-70b")
    cluster = autoshard.load_cluster("a100x8", nodes=128, mesh=(128, 8))
    plan = autoshard.plan(case.model, cluster, case.args, case.kwargs)
    return dataclasses.replace(plan, source={"spec": "llama3-70b"})


def test_shrink_mesh_keeps_axes_at_most_two_wide_and_a_ring_four() -> None:
    assert shrink_mesh((128, 8)) == (2, 2)
    assert shrink_mesh((1, 16, 2)) == (1, 2, 2)
    assert shrink_mesh((4,), ring_axis=0) == (4,)
    assert shrink_mesh((128, 16), ring_axis=1) == (2, 4)
    assert shrink_mesh((2, 2), ring_axis=0) == (2, 2)
    assert shrink_mesh((3,), ring_axis=0) == (2,)  # the scaled copies' dims divide by powers of 2
    assert shrink_mesh((8, 16, 8), ring_axis=1) == (2, 2, 2)  # 16 ranks with a ring of 4: over the 8 allowed
    ring = SimpleNamespace(context_axis=1, mesh_shape=(8, 16, 8))
    assert _ring_note(ring, (2, 2, 2)).endswith("so the hop order of a longer ring is not checked")  # type: ignore[arg-type]
    assert _ring_note(ring, (2, 4, 2)) == "; the ring on axis 1 runs 4 ranks of the plan's 16"  # type: ignore[arg-type]


@pytest.mark.slow  # a plan, two captures and 4 forked ranks: 16 s wall at load 4 (2 cores)
def test_a_four_way_ring_plan_verifies_on_four_ranks(tmp_path: Path, monkeypatch, capsys) -> None:
    """``verify --plan`` of a plan whose ring spans 4 ranks runs a ring of 4 (it ran one of 2, where a rank's
    previous and next are the same rank), and every rank sends the hops the mapped plan lists."""
    case = zoo.build("llama-tiny", batch=1, seq=32)
    pins = {"model.layers.*.self_attn": "ring", "input_ids": ("S(1)",)}
    plan = autoshard.plan(case.model, cluster_for("cpu", 4), case.args, annotations=pins, cp_layout="zigzag")
    assert (plan.mesh_shape, plan.context_axis, plan.degrees) == ((4,), 0, {"cp": 4})
    path = tmp_path / "ring.json"
    dataclasses.replace(plan, source={"spec": "llama-tiny"}).save(path)
    hops = count_hops(tmp_path, monkeypatch)
    assert main(["verify", "--plan", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("verify llama-tiny on mesh (4,) (float32): OK"), lines[0]
    assert "mapped onto a scaled-down copy on mesh (4,);" in lines[1]
    assert lines[1].endswith("; the ring on axis 0 runs 4 ranks"), lines[1]
    # 4 ranks x 2 layers x (3 hops forward + 4 backward); verify compared each rank's with the mapped plan's
    assert hops.read_text().count("hop") == 4 * 2 * 7
    assert any(line.startswith("ring K/V hops per device and step: ") for line in lines)


@pytest.mark.slow
def test_llama70b_plan_maps_every_decision_but_casts(llama70b_plan: Plan) -> None:
    case = build_scaled("llama3-70b")
    mapped = map_plan(llama70b_plan, case.model, case.args, case.kwargs, cluster_for("a100x8", 4, (2, 2)))
    # the 16-bit original has casts a float32 copy lacks; everything else is carried over
    assert all("aten.to." in u or "contiguous" in u for u in mapped.unmapped), mapped.unmapped
    assert mapped.mapped >= len(llama70b_plan.nodes) - len(mapped.unmapped)
    by_label = {n.strategy for n in mapped.plan.nodes}
    for decision in llama70b_plan.nodes:
        if decision.target == "aten.linear.default":
            assert decision.strategy in by_label  # every linear runs exactly as planned at real size
    assert any("q_proj linear" in e for e in mapped.exercised)


@pytest.mark.slow
def test_verify_plan_llama70b_passes_with_collectives(llama70b_plan: Plan, tmp_path, capsys) -> None:
    """The acceptance: ``autoshard verify --plan`` on the saved 128 x 8 plan."""
    path = tmp_path / "llama70b.json"
    llama70b_plan.save(path)
    code = main(["verify", "--plan", str(path)])
    out = capsys.readouterr().out
    assert code == 0, out
    lines = out.splitlines()
    # the context-parallel ring axis keeps 4 ranks (runtime/mapping.shrink_mesh), the other axis 2
    assert lines[0].startswith("verify llama3-70b on mesh (4, 2) (float32): OK"), lines[0]
    assert "mapped onto a scaled-down copy on mesh (4, 2)" in lines[1]
    counts = next(line for line in lines if line.startswith("collectives per step: "))
    assert "forward " in counts and "backward all_reduce" in counts
    emitted, planned = counts.removeprefix("collectives per step: ").split(" (plan: ")
    assert emitted == planned.rstrip(")")  # every collective the mapped plan prices ran
    listed = lines[lines.index(next(x for x in lines if x.startswith("strategies exercised"))) + 1 :]
    assert any("self_attn.q_proj linear: " in x for x in listed) and any(
        "lm_head linear: " in x for x in listed
    )


@pytest.mark.slow
def test_verify_plan_reports_a_broken_collective(llama70b_plan: Plan) -> None:
    report = run_verify(None, plan=llama70b_plan, fault="all_reduce")
    assert not report.ok
    assert report.verdict == "MISMATCH"
    assert report.emitted == report.planned  # the collectives ran (and were logged): their values are wrong
    assert any(not d.ok for d in (*report.outputs, *report.grads))


def test_llama_tiny_never_ok_with_zero_collectives() -> None:
    report = run_verify("llama-tiny", 4)
    if sum(report.emitted.values()) == 0:
        assert not report.ok and report.verdict == "NOTHING DISTRIBUTED CHECKED"
        assert "checks nothing distributed" in str(report)
        allowed = dataclasses.replace(report, allow_replicated=True)  # what --allow-replicated sets
        assert allowed.ok and allowed.verdict == "OK"
    else:
        assert report.ok


def test_plan_without_source_asks_for_the_model(llama70b_plan: Plan) -> None:
    with pytest.raises(autoshard.AutoshardError, match="--model SPEC"):
        run_verify(None, plan=dataclasses.replace(llama70b_plan, source={}))


def test_megatron_pairs_follow_the_data(llama70b_plan: Plan) -> None:
    """A pair names a row linear that reads the column linears' output: the row side is always o_proj or
    down_proj (never v_proj, which reads no column linear's output, whatever its own split)."""
    from autoshard.report.groups import PlanView
    from autoshard.report.patterns import recognise

    found = recognise(PlanView.of(llama70b_plan))
    megatron = [p for p in found if p.name == "Megatron column→row"]
    assert megatron, [p.name for p in found]
    text = " ".join(megatron[0].where)
    assert "self_attn.q_proj" in text and "→ model.layers.0–79.self_attn.o_proj" in text
    targets = re.findall(r"→ (\S+)", text)
    assert targets and all(t.endswith(("o_proj", "down_proj")) for t in targets), text


@pytest.mark.slow
def test_verify_plan_mixtral_maps_the_grouped_experts() -> None:
    """Mixtral 8x7B on 2 x 8: the scaled copy stays in bfloat16 so its experts are the same aten._grouped_mm
    the plan decided (float32 would export an opaque fallback op instead)."""
    case = zoo.build("mixtral-8x7b", layers=2, seq=256)  # the 8x7B architecture; depth and length cost time
    cluster = autoshard.load_cluster("a100x8", nodes=2, mesh=(2, 8))
    plan = autoshard.plan(case.model, cluster, case.args, case.kwargs)
    report = run_verify(None, plan=dataclasses.replace(plan, source={"spec": "mixtral-8x7b"}))
    assert report.ok, str(report)
    assert report.dtype == "bfloat16" and sum(report.emitted.values()) > 0
    assert not any("grouped_mm" in u for u in report.unmapped), report.unmapped
    assert any("experts" in e for e in report.exercised)


def test_plan_for_another_model_is_refused(llama70b_plan: Plan, tmp_path, capsys) -> None:
    """A plan run against a model it was not made for is one line and exit 2, never a vacuous OK."""
    path = tmp_path / "llama.json"
    llama70b_plan.save(path)
    assert main(["verify", "--plan", str(path), "--model", "gpt2-tiny"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "made for llama3-70b (LlamaForCausalLM" in err[0] and "not gpt2-tiny;" in err[0]


def test_float64_mixtral_is_refused_in_one_line() -> None:
    """Mixtral's experts are aten._grouped_mm, which has no float64 kernel: --float64 is refused before any
    forward runs, naming the op and what to run instead (never a traceback from inside the experts)."""
    import torch

    from autoshard.errors import AutoshardError

    with pytest.raises(AutoshardError, match=r"_grouped_mm.*without --float64") as err:
        build_scaled("mixtral-tiny", dtype=torch.float64)
    assert "\n" not in str(err.value)


def test_float64_small_mixtral_is_refused_by_the_cli(capsys) -> None:
    """The same refusal on the small-model path (``--model`` without a plan): exit 2, one line."""
    assert main(["verify", "--model", "mixtral-tiny", "--float64", "--nproc", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "_grouped_mm" in err[0], err
