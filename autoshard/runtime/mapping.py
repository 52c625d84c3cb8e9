"""Map a plan made at real size onto a scaled-down copy of its model on a shrunk mesh (what ``verify`` runs).

Input: a :class:`~autoshard.plans.Plan` (for example LLaMA-3-70B on 128 × 8), a small model of the same
architecture with real weights (:func:`autoshard.zoo.build_scaled`), its example inputs, and a small cluster
whose mesh has the plan's number of axes, each at most 2 wide but a ring's, which keeps up to 4
(:func:`shrink_mesh`).
Output: a :class:`MappedPlan`: a plan for the small model in which every graph node that the big plan
decided takes exactly the big plan's strategy label (``"(S(0), R), R -> S(0)"`` stays ``S(0)`` on the 2-wide
axis), plus the list of what was exercised and what could not be mapped.

How nodes are matched: the plan names its decisions ``block:<position>`` (one per node of the repeated layer)
and ``outside:<index>`` (every other node, in graph order).  The small capture need not have the same node
count: dtype casts, ``contiguous`` calls and views appear or vanish with dtype and size.  So the two
sequences -- the repeated layer's nodes, then the nodes outside it -- are aligned as sequences of
``(op, module path with layer indices erased)`` (:class:`difflib.SequenceMatcher`), and a matched node takes
the plan's label when the small node has a strategy printing exactly so.  A node the plan does not decide
(an extra cast) or whose label does not exist on the small node is *unmapped*: the solver picks its strategy
given the pinned neighbours, and the report lists it.  Nothing is re-planned silently.

Example::

    small = zoo.build_scaled("llama3-70b")
    mapped = map_plan(plan, small.model, small.args, small.kwargs, cluster_2x2)
    mapped.exercised[:2]    # ('model.layers.*.self_attn.q_proj linear: (S(0), R), (R, S(0)) -> ...', ...)
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from autoshard.capture import Captured, capture
from autoshard.capture.experts import plan_fuses_experts
from autoshard.cluster import Cluster
from autoshard.errors import AutoshardError
from autoshard.plans import NodePlan, Plan
from autoshard.problem.build import BuiltProblem, build_problem
from autoshard.problem.costs import CostOptions, Recompute
from autoshard.problem.extract import extract_plan
from autoshard.problem.graph import NodeInfo
from autoshard.search import solve

if TYPE_CHECKING:
    from autoshard.runtime.verify import VerifyReport

__all__ = ["MAX_AXIS", "MAX_RING", "MappedPlan", "align_sequences", "map_plan", "shrink_mesh", "verify_plan"]

MAX_AXIS = 2  # each mesh axis of a mapped plan is at most this wide: 2-4 gloo ranks for 1-2 axes, 8 for 3
MAX_RING = 4
"""How wide a context-parallel ring axis stays: a ring of 2 is one rank each way (a rank's previous and next
are the same rank, every block comes straight from its owner), so it cannot show a hop sent to the wrong
neighbour or a block forwarded in the wrong order; in a ring of 4 every block passes through a rank that
neither made nor keeps it."""
# gloo ranks a mapped plan may take: the scaled copies make every dim a plan splits divisible by 8 (scaled.py)
MAX_RANKS = 8


@dataclass(frozen=True)
class MappedPlan:
    """A big plan's decisions carried onto a small model (module doc)."""

    plan: Plan  # the small model's plan: the big plan's labels where mapped, the solver's elsewhere
    captured: Captured  # the small model's capture (every layer: the scaled copy keeps two)
    exercised: tuple[str, ...]  # "module op: strategy" for every mapped decision that shards something
    mapped: int  # decisions carried over (sharded or not)
    unmapped: tuple[str, ...]  # "module op: strategy (why)" for every decision that could not be carried


def shrink_mesh(mesh_shape: tuple[int, ...], ring_axis: int | None = None) -> tuple[int, ...]:
    """Every axis at most :data:`MAX_AXIS` wide, but ``ring_axis`` (the plan's ``context_axis``) at most
    :data:`MAX_RING` while the mesh keeps to :data:`MAX_RANKS` ranks; an axis of 1 stays 1."""
    shrunk = [min(int(n), MAX_AXIS) for n in mesh_shape]
    if ring_axis is not None:
        # 4 or 2 wide, never 3: the scaled copies' dims divide by powers of 2 only
        ring = MAX_RING if mesh_shape[ring_axis] >= MAX_RING else shrunk[ring_axis]
        if math.prod(shrunk) // shrunk[ring_axis] * ring <= MAX_RANKS:
            shrunk[ring_axis] = ring
    return tuple(shrunk)


def _ring_note(plan: Plan, mesh: tuple[int, ...]) -> str:
    """What the shrunk mesh leaves of the plan's ring, for the report ("" without one): a ring kept at 2
    (over :data:`MAX_RANKS` with 4, or 3 wide) says what it does not check."""
    axis = plan.context_axis
    if axis is None:
        return ""
    wide, ran = plan.mesh_shape[axis], mesh[axis]
    of = f" of the plan's {wide}" if ran < wide else ""
    if ran in (MAX_RING, wide):
        return f"; the ring on axis {axis} runs {ran} ranks{of}"
    return (
        f"; the ring on axis {axis} runs {ran} ranks{of}: a rank's previous and next are one rank, so the "
        "hop order of a longer ring is not checked"
    )


_DIGITS = re.compile(r"(?<=\.)\d+(?=\.|$)")


def _token(target: str, module: str) -> tuple[str, str]:
    return target, _DIGITS.sub("#", module)


def _plan_sequences(plan: Plan) -> tuple[list[NodePlan], list[NodePlan]]:
    def index(n: NodePlan) -> int:
        return int(n.key.partition(":")[2])

    block = sorted((n for n in plan.nodes if n.key.startswith("block:")), key=index)
    outside = sorted((n for n in plan.nodes if n.key.startswith("outside:")), key=index)
    return block, outside


def _small_sequences(built: BuiltProblem) -> tuple[list[NodeInfo], list[NodeInfo]]:
    variables = [built.infos[v] for v in built.variables]
    block = sorted((i for i in variables if i.block is not None), key=lambda i: i.block[1] if i.block else 0)
    return block, [i for i in variables if i.block is None]


def align_sequences(big: list[NodePlan], small: list[NodeInfo]) -> dict[str, NodePlan]:
    """small node name → the plan decision it lines up with (module doc: how nodes are matched)."""
    a = [_token(n.target, n.module) for n in big]
    b = [_token(i.target, i.fqn or i.module) for i in small]
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    pairs: dict[str, NodePlan] = {}
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal" or (tag == "replace" and i2 - i1 == j2 - j1):
            for k in range(i2 - i1):
                if a[i1 + k][0] == b[j1 + k][0]:
                    pairs[small[j1 + k].name] = big[i1 + k]
    return pairs


def _where(info: NodeInfo) -> str:
    return f"{_DIGITS.sub('*', info.fqn or info.module) or '<root>'} {info.op}"


def map_plan(
    plan: Plan,
    model: nn.Module,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    cluster: Cluster,
    *,
    time_limit: float = 30.0,
) -> MappedPlan:
    """The big ``plan``'s strategies pinned on ``model`` (small, real weights) over ``cluster`` (module doc)."""
    if len(cluster.mesh_shape) != len(plan.mesh_shape):
        raise AutoshardError(
            f"the plan has a {len(plan.mesh_shape)}-axis mesh {plan.mesh_shape}, the verify mesh "
            f"{cluster.mesh_shape} has {len(cluster.mesh_shape)}: give one size per axis"
        )
    captured = capture(model, args, dict(kwargs), blocks="auto", fuse_experts=plan_fuses_experts(plan.nodes))
    blocks = captured.blocks
    if blocks is not None and blocks.captured_blocks != blocks.num_blocks:
        raise AutoshardError(
            f"the scaled-down model has {blocks.num_blocks} layers: build it with 2 so that one capture serves "
            "mapping and running"
        )
    zigzag = plan.context_layout == "zigzag"  # run the plan's sequence layout
    opts = CostOptions(
        training=plan.training, cp_layout="zigzag" if zigzag else "contiguous", **_recompute(plan)
    )  # the plan's recomputation runs too: its re-issued collectives are listed and counted
    built = build_problem(captured, cluster, opts)
    big_block, big_outside = _plan_sequences(plan)
    small_block, small_outside = _small_sequences(built)
    if big_block and not small_block:  # the small model was not collapsed: align every layer's nodes alike
        small_outside = [built.infos[v] for v in built.variables]
        big_outside = big_block + big_outside
        big_block = []
    pairs = align_sequences(big_block, small_block) | align_sequences(big_outside, small_outside)
    allowed: dict[str, np.ndarray] = {}
    exercised: list[str] = []
    unmapped: list[str] = []
    decided = set()
    for name in built.variables:
        info, decision = built.infos[name], pairs.get(name)
        if decision is None:
            continue
        decided.add(decision.key)
        labels = [str(s) for s in built.strategies[name]]
        if decision.strategy not in labels:
            unmapped.append(f"{_where(info)}: {decision.strategy} (no such strategy at this size)")
            continue
        allowed[name] = np.array([label == decision.strategy for label in labels], dtype=bool)
        if "S(" in decision.strategy or "P" in decision.strategy:
            exercised.append(f"{_where(info)}: {decision.strategy}")
    for node in plan.nodes:
        if node.key not in decided:
            unmapped.append(
                f"{_DIGITS.sub('*', node.module) or '<root>'} {node.target}: {node.strategy} "
                "(the scaled copy has no such graph node)"
            )
    pinned = _pin(built, allowed)
    solution = solve(pinned.problem, time_limit=time_limit)
    for k, name in enumerate(built.variables):  # graph nodes only the copy has: the solver chose, say so
        if name not in pairs:
            picked = built.strategies[name][solution.choice[k]]
            unmapped.append(
                f"{_where(built.infos[name])}: {picked} (only in the scaled copy; chosen by the solver)"
            )
    out = next(n for n in captured.graph_module.graph.nodes if n.op == "output")
    small = extract_plan(
        pinned,
        solution,
        model=f"{plan.model} (scaled down)",
        block_prefix=blocks.prefix if blocks else None,
        output_order=tuple(n.name for n in out.all_input_nodes),
        timings={},
        notes=(f"mapped from a plan on mesh {plan.mesh_shape}",),
    )
    return MappedPlan(small, captured, tuple(exercised), len(allowed), tuple(unmapped))


def _recompute(plan: Plan) -> dict[str, Any]:
    """The copy's recomputation options: the plan's policy on both blocks, or on one of the two when the plan
    recomputes only some of its blocks (``Plan.recompute_blocks``), so that both kinds of block run."""
    if plan.recompute == "none" or plan.recompute_blocks == 0:
        return {}
    share = 1.0 if plan.recompute_blocks is None else 0.5
    return {"recompute": Recompute(plan.recompute), "recompute_share": share}


def verify_plan(
    plan: Plan,
    spec: str | None = None,
    *,
    float64: bool = False,
    allow_replicated: bool = False,
    seed: int = 0,
    fault: str | None = None,
) -> VerifyReport:
    """Check the plan you will deploy: its strategies mapped onto a scaled-down copy of its model, every mesh
    axis shrunk to at most 2 and a ring's to at most 4 (:func:`shrink_mesh`), run on gloo against one device.

    ``spec``: the zoo name or ``path/to/file.py:function`` to rebuild; default the plan's ``source``.  A zoo
    model is rebuilt by :func:`~autoshard.runtime.scaled.build_scaled`; a file is called as it is, and a model
    it builds on meta is rebuilt small from its Hugging Face config (:func:`~autoshard.runtime.scaled.scale_hf`;
    a plain ``nn.Module`` on meta is refused: return a small copy of it from the file).
    """
    from autoshard import zoo
    from autoshard.plan_model import check_built, check_spec
    from autoshard.runtime.scaled import build_scaled, scalable, scale_hf
    from autoshard.runtime.verify import cluster_for, verify

    recorded = str(plan.source.get("spec") or "")
    if spec is None and ":" in recorded and recorded.rpartition(":")[0].endswith(".py"):
        raise AutoshardError(
            f"the plan was made from {recorded}; a plan file never runs code it names: pass --model {recorded} "
            "(a function returning a small copy of the model) to run it"
        )
    check_spec(plan, spec)  # another zoo model: refused before anything is built
    spec = spec or recorded
    if not spec:
        raise AutoshardError(
            f"the plan does not record which model it was made for ({plan.model}): pass --model SPEC, the zoo "
            "name or path/to/file.py:function it was planned from"
        )
    if plan.pipeline is not None:  # run as deployed: stages, microbatches and schedule on gloo
        from autoshard.runtime.verify_pipeline import verify_pipeline_plan

        return verify_pipeline_plan(plan, spec, float64=float64)
    dtype = torch.float64 if float64 else None
    case = build_scaled(spec, dtype=dtype) if scalable(spec) else zoo.load_spec(spec)
    if any(p.device.type == "meta" for p in case.model.parameters()):  # a user's model at real size
        case = scale_hf(case, dtype=dtype)
    check_built(plan, spec, case.model, scaled=True)  # a copy with fewer layers: its class, not its names
    model = case.model.to(torch.float64) if float64 else case.model
    mesh = shrink_mesh(tuple(plan.mesh_shape), plan.context_axis)
    cluster = cluster_for(str(plan.cluster.get("profile", "cpu")), math.prod(mesh), mesh)
    mapped = map_plan(plan, model, case.args, case.kwargs, cluster)
    report = verify(
        model, case.args, case.kwargs, plan=mapped.plan, cluster=cluster, captured=mapped.captured, name=spec,
        seed=seed, fault=fault, allow_replicated=allow_replicated,
    )  # fmt: skip
    source = (
        f"plan for {spec} on mesh {tuple(plan.mesh_shape)}, mapped onto a scaled-down copy on mesh {mesh}; "
        f"{mapped.mapped} of {len(plan.nodes)} graph-node decisions carried over, {len(mapped.exercised)} of "
        f"them split or reduce something (listed below){_ring_note(plan, mesh)}"
    )
    from autoshard.runtime.verify_scope import not_run, plan_line

    native = str(zoo.default_dtype(spec)).removeprefix("torch.") if spec in zoo.names() else None  # deployed
    return dataclasses.replace(
        report, exercised=mapped.exercised, unmapped=mapped.unmapped, source=source,
        plan_line=f"{report.plan_line} (deployed: {plan_line(plan)})",
        not_run=not_run(plan, mapped.plan, report.dtype, native),
    )  # fmt: skip


def _pin(built: BuiltProblem, allowed: dict[str, np.ndarray]) -> BuiltProblem:
    fanouts = (None,) * (built.problem.num_nodes - len(built.variables))  # fan-out, gather nodes follow
    masks = tuple(allowed.get(v) for v in built.variables) + fanouts
    return dataclasses.replace(built, problem=dataclasses.replace(built.problem, allowed=masks))
