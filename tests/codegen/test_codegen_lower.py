"""The graph rewrite, checked without processes: the emitted code names every collective the plan lists, sizes
are local, repeated-layer decisions map onto a full capture, and a model that is not the planned one is refused."""

from __future__ import annotations

import functools
import re
from collections import Counter

import pytest
import torch

import autoshard
from autoshard import zoo
from autoshard.capture import Captured, capture
from autoshard.codegen import PlanMismatchError, assign_strategies, lower_graph, plan_cluster
from autoshard.codegen.collectives import parse_steps
from autoshard.local_mesh import coords
from autoshard.plans import Plan
from autoshard.runtime.verify import cluster_for
from autoshard.zoo import MLP

MEGATRON_MLP = {"x": ("R",), "fc1": ((1, 1), (2, 1)), "fc2": ((1, 2), (1, 2))}
COLUMN, ROW = ((1, 1, 1), (2, 1)), ((1, 1, 2), (1, 2))
MEGATRON_LLAMA = {
    **{f"*.{m}": COLUMN for m in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")},
    **{f"*.{m}": ROW for m in ("o_proj", "down_proj")},
}
_CALL = re.compile(r"redistribute\(\w+, \w+, '([^']*)', '([^']*)'\)")


def code_counts(code: str) -> Counter[str]:
    """``"phase kind"`` -> how many collectives of that kind the generated code runs per step."""
    counts: Counter[str] = Counter()
    for fwd, bwd in _CALL.findall(code):
        for phase, text in (("forward", fwd), ("backward", bwd)):
            counts.update(f"{phase} {s.kind}" for s in parse_steps(text) if s.is_collective)
    return counts


def plan_counts(plan: Plan) -> Counter[str]:
    return Counter(f"{c.phase} {c.kind}" for c in plan.collectives)


def _code(cap: Captured, plan: Plan, coord: tuple[int, ...]) -> str:
    lowered = lower_graph(cap, assign_strategies(cap, plan), plan_cluster(plan), coord)
    return lowered.graph.python_code("self").src


@functools.cache
def _mlp() -> tuple[torch.nn.Module, torch.Tensor, Captured]:
    torch.manual_seed(0)
    model, x = MLP(8, 16).double(), torch.randn(4, 8, dtype=torch.float64)
    return model, x, capture(model, (x,), blocks="full")


@functools.cache
def _llama(layers: int) -> tuple[zoo.ModelCase, Captured]:
    case = zoo.build("llama-tiny", layers=layers)
    return case, capture(case.model, case.args, case.kwargs, blocks="full")


@functools.cache
def _megatron_mlp() -> Plan:
    model, x, _ = _mlp()
    return autoshard.plan(model, cluster_for("cpu", 2), (x,), annotations=MEGATRON_MLP)


@functools.cache
def _megatron_llama(layers: int) -> Plan:
    """llama-tiny's Megatron plan on 2 CPU ranks, made once per layer count for the tests that lower it."""
    case, _ = _llama(layers)
    return autoshard.plan(case.model, cluster_for("cpu", 2), case.args, annotations=MEGATRON_LLAMA)


def test_megatron_mlp_code_shows_f_and_g_and_ties_the_dropped_bias() -> None:
    cap = _mlp()[2]
    plan = _megatron_mlp()
    first, second = _code(cap, plan, (0,)), _code(cap, plan, (1,))
    # g: the row-parallel output is all-reduced forward; the replicated bias's gradient all-reduced backward
    assert plan_counts(plan) == Counter({"forward all_reduce": 1, "backward all_reduce": 1})
    assert code_counts(first) == code_counts(second) == plan_counts(plan)
    # only the first device adds fc2's bias; the others tie it to the output so its backward still runs
    assert "join_unused" in second and "join_unused" not in first


def test_sizes_and_weights_are_local() -> None:
    cap = _llama(2)[1]
    plan = _megatron_llama(2)
    lowered = lower_graph(cap, assign_strategies(cap, plan), plan_cluster(plan), (1,))
    code = lowered.graph.python_code("self").src
    # q: (batch 2, seq 16, 4 heads, 16) split over heads; k/v (GQA): 2 kv heads split, expanded to 2 each
    assert "view.default(linear, [2, 16, 2, 16])" in code and "[2, 16, 4, 16]" not in code
    assert "[2, 1, 2, 16, 16]" in code and "[2, 2, 2, 16, 16]" not in code
    local = {a.fqn: a.spec.local_shape(a.global_shape, (2,)) for a in lowered.attrs}
    assert local["model.layers.0.self_attn.q_proj.weight"] == (32, 64)
    assert local["model.layers.1.mlp.down_proj.weight"] == (64, 64)
    assert local["model.norm.weight"] == (64,)
    assert code_counts(code) == plan_counts(plan)


def test_cut_plan_maps_onto_every_layer() -> None:
    """Planned on 2 of 3 layers (one decision per layer position), lowered on all 3."""
    cap = _llama(3)[1]
    plan = _megatron_llama(3)
    assert any(n.key.startswith("block:") for n in plan.nodes)
    code = _code(cap, plan, (0,))
    assert code_counts(code) == plan_counts(plan)
    counts = plan_counts(plan)  # the 2 Partial sums of each of 3 layers reduced once, all-reduced or (since
    # ZeRO-1's gathers are priced, with the residual stream kept Partial) reduce-scattered sequence-parallel
    assert counts["forward all_reduce"] + counts["forward reduce_scatter"] >= 6


def test_every_rank_runs_the_same_collectives_in_the_same_order() -> None:
    case, cap = _llama(2)
    fsdp = {"*_proj": ((2, 1, 1), (1, 1)), "*_proj.weight": ("S(0)", "S(0)")}
    plan = autoshard.plan(case.model, cluster_for("cpu", 4, (2, 2)), case.args, annotations=fsdp)
    sequences = {tuple(_CALL.findall(_code(cap, plan, c))) for c in coords((2, 2))}
    assert len(sequences) == 1
    (sequence,) = sequences
    assert any("reduce_scatter" in bwd for _, bwd in sequence)  # FSDP: weights' gradients reduce-scattered


def test_a_model_that_is_not_the_planned_one_is_refused() -> None:
    x = _mlp()[1]
    plan = _megatron_mlp()
    odd = MLP(8, 15).double()  # 15 hidden features cannot be split over 2 devices
    with pytest.raises(PlanMismatchError, match="not a strategy of this node"):
        assign_strategies(capture(odd, (x,), blocks="full"), plan)
    _, cap = _llama(2)
    with pytest.raises(PlanMismatchError, match=r"nodes outside repeated layers|runs aten"):
        assign_strategies(cap, plan)


def test_parallelize_without_a_process_group_says_how_to_start_one() -> None:
    model, x, _ = _mlp()
    plan = _megatron_mlp()
    with pytest.raises(autoshard.MeshError, match="init_process_group"):
        autoshard.parallelize(model, plan, (x,))


def test_every_device_in_the_graph_is_the_ranks() -> None:
    """A capture on the CPU lowered for another device keeps no CPU device: not in ``arange(device=...)`` and not
    in HF's rotary ``aten.to.device(x, cpu)`` (positional; emitted on a GPU it was a cross-device matmul)."""
    cap = _llama(2)[1]
    captured = [
        a
        for n in cap.graph_module.graph.nodes
        for a in (*n.args, *n.kwargs.values())
        if isinstance(a, torch.device)
    ]
    assert torch.device("cpu") in captured  # the capture does pin the CPU, positionally too
    plan = _megatron_llama(2)
    lowered = lower_graph(
        cap, assign_strategies(cap, plan), plan_cluster(plan), (0,), device=torch.device("meta")
    )
    devices = {
        a for n in lowered.graph.nodes for a in (*n.args, *n.kwargs.values()) if isinstance(a, torch.device)
    }
    assert devices == {torch.device("meta")}
