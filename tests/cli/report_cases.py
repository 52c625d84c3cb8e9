"""Hand-written plans for the report tests: each shows one canonical pattern (REFERENCE.md) and nothing else.

A plan is built from a few rows: parameters ``{fqn: placement}``, ops ``(name, module, target, label)`` in
program order, and collectives.  Nodes of a repeated-layer stack are named after layer 0 and carry
``count`` = the number of layers, exactly as :func:`autoshard.plan` records them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from autoshard.plans import Collective, NodePlan, Plan, SolverReport

LINEAR = "aten.linear.default"
GELU = "aten.gelu.default"
SDPA = "aten.scaled_dot_product_attention.default"
EMBEDDING = "aten.embedding.default"
LAYER_NORM = "aten.layer_norm.default"
GROUPED_MM = "aten._grouped_mm.default"

Op = tuple[str, str, str, str]  # name, module, target, strategy label


def param_node(fqn: str) -> str:
    return "p_" + fqn.replace(".", "_")


def make_plan(
    mesh: tuple[int, ...],
    params: Mapping[str, tuple[str, ...]],
    ops: Sequence[Op],
    collectives: Sequence[Collective] = (),
    *,
    layers: int = 1,
    prefix: str = "layers",
    inputs: dict[str, tuple[str, ...]] | None = None,
) -> Plan:
    """A plan with the given rows; ops and parameters under ``{prefix}.0`` belong to a ``layers``-deep stack."""
    nodes: list[NodePlan] = []
    outside = block = 0

    def key(module: str) -> tuple[str, int]:
        nonlocal outside, block
        if layers > 1 and module.startswith(f"{prefix}.0"):
            block += 1
            return f"block:{block - 1}", layers
        outside += 1
        return f"outside:{outside - 1}", 1

    for fqn, spec in params.items():
        k, count = key(fqn)
        nodes.append(NodePlan(param_node(fqn), k, "placeholder", fqn, "-> " + _spec(spec), count, 1e-6, 1e6))
    for name, spec in (inputs or {"x": ("R",) * len(mesh)}).items():
        nodes.append(
            NodePlan(name, f"outside:{outside}", "placeholder", "", "-> " + _spec(spec), 1, 0.0, 0.0)
        )
        outside += 1
    for name, module, target, label in ops:
        k, count = key(module)
        nodes.append(NodePlan(name, k, target, module, label, count, 1e-3 * count, 1e6))
    comm = sum(c.seconds for c in collectives)
    return Plan(
        model="Handmade",
        cluster={
            "profile": "a100x8",
            "nodes": 1,
            "mesh_shape": list(mesh),
            "description": "1 x a100x8\nmesh",
        },
        mesh_shape=mesh,
        training=True,
        param_placements=_expand(params, layers, prefix),
        input_placements=inputs or {"x": ("R",) * len(mesh)},
        output_placements=(("R",) * len(mesh),),
        nodes=tuple(nodes),
        collectives=tuple(collectives),
        predicted_step_time=0.01 + comm,
        compute_time=0.01,
        communication_time=comm,
        memory_per_device=2**30,
        device_memory=80 * 2**30,
        solver=SolverReport("exact", 0.01, 0.01, 0.0, True, 0.001),
    )


def timed(plan: Plan, seconds: dict[str, float]) -> Plan:
    """``plan`` with the compute seconds of the named nodes set (the shares the headline weighs)."""
    nodes = tuple(
        dataclasses.replace(n, compute_seconds=seconds[n.name]) if n.name in seconds else n
        for n in plan.nodes
    )
    return dataclasses.replace(plan, nodes=nodes)


def collective(
    kind: str, phase: str, tensor: str, node: str, module: str, axis: int = 0, nbytes: int = 2**20, layer=None
) -> Collective:
    return Collective(kind, nbytes, phase, axis, node, tensor, module, 1e-4, layer)


def _spec(spec: tuple[str, ...]) -> str:
    return spec[0] if len(spec) == 1 else "(" + ", ".join(spec) + ")"


def _expand(params: Mapping[str, tuple[str, ...]], layers: int, prefix: str) -> dict[str, tuple[str, ...]]:
    out: dict[str, tuple[str, ...]] = {}
    for fqn, spec in params.items():
        if layers > 1 and fqn.startswith(f"{prefix}.0."):
            for i in range(layers):
                out[fqn.replace(f"{prefix}.0.", f"{prefix}.{i}.", 1)] = spec
        else:
            out[fqn] = spec
    return out


def megatron_mlp(gather_between: bool = False) -> Plan:
    """REFERENCE canonical plan 1 on a 1-D mesh of 8: fc1 column, fc2 row, one forward all-reduce."""
    ops = [
        ("linear", "fc1", LINEAR, "R, S(0) -> S(2)"),
        ("gelu", "act", GELU, "S(2) -> S(2)"),
        ("linear_1", "fc2", LINEAR, "S(2), S(1) -> P" if not gather_between else "R, S(1) -> P"),
    ]
    comms = [collective("all_reduce", "forward", "linear_1", "output", "fc2", nbytes=2**25)]
    if gather_between:
        comms.append(collective("all_gather", "forward", "gelu", "linear_1", "fc2"))
    return make_plan((8,), {"fc1.weight": ("S(0)",), "fc2.weight": ("S(1)",)}, ops, comms)


def data_parallel_and_fsdp() -> Plan:
    """2 x 8 mesh: batch split on axis 0 with weights replicated there; weights stored split on axis 1 and
    all-gathered before use (FSDP), batch split on axis 1 as well."""
    ops = [("linear", "fc", LINEAR, "(S(0), S(0)), (R, R) -> (S(0), S(0))")]
    w = param_node("fc.weight")
    comms = [
        collective("all_gather", "forward", w, "linear", "fc", axis=1),
        collective("reduce_scatter", "backward", w, "fc.weight", "fc", axis=1),
        collective("all_reduce", "backward", w, "fc.weight", "fc", axis=0),
    ]
    return make_plan((2, 8), {"fc.weight": ("R", "S(0)")}, ops, comms, inputs={"x": ("S(0)", "S(0)")})


def ulysses_attention_stack() -> Plan:
    """A 4-layer attention stack on 8 devices: norms split by sequence, all-to-all to heads around SDPA."""
    ops = [
        ("layer_norm", "layers.0.ln", LAYER_NORM, "S(1), R, R -> S(1)"),
        ("linear", "layers.0.attn.qkv", LINEAR, "S(1), R -> S(1)"),
        ("transpose", "layers.0.attn", "aten.transpose.int", "S(1) -> S(2)"),
        ("sdpa", "layers.0.attn", SDPA, "S(1), S(1), S(1) -> S(1)"),
        ("linear_1", "layers.0.attn.out", LINEAR, "S(1), R -> S(1)"),
    ]
    comms = [
        collective("all_to_all", "forward", "transpose", "sdpa", f"layers.{i}.attn", layer=i)
        for i in range(4)
    ]
    params = {
        "layers.0.attn.qkv.weight": ("R",),
        "layers.0.attn.out.weight": ("R",),
        "layers.0.ln.weight": ("R",),
    }
    return make_plan((8,), params, ops, comms, layers=4)


def vocab_parallel() -> Plan:
    """Embedding and LM head split over the vocabulary on 8 devices."""
    ops = [
        ("embedding", "embed", EMBEDDING, "S(0), R -> P"),
        ("linear", "lm_head", LINEAR, "R, S(0) -> S(2)"),
    ]
    params = {"embed.weight": ("S(0)",), "lm_head.weight": ("S(0)",)}
    return make_plan((8,), params, ops, inputs={"ids": ("R",)})


def expert_parallel() -> Plan:
    """Grouped expert matmuls with their weights split by expert on 8 devices, all-to-all dispatch."""
    ops = [
        ("router", "moe.gate", LINEAR, "S(0), R -> S(0)"),
        ("_grouped_mm", "moe.experts", GROUPED_MM, "S(0), S(0), R -> S(0)"),
    ]
    comms = [
        collective("all_to_all", phase, "router", "_grouped_mm", "moe.experts")
        for phase in ("forward", "backward")
    ]
    params = {"moe.gate.weight": ("R",), "moe.experts.w": ("S(0)",)}
    return make_plan((8,), params, ops, comms)
