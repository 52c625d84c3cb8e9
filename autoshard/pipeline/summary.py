"""The kinds of parallelism a plan uses, and the report's one-line headline.

Input: a :class:`~autoshard.plans.Plan`.  Output: ``Plan.degrees`` (``{"pp": 8, "tp": 8, "dp": 16}``) and the
line ``PP 8 (interleaved, v=3) × TP 8 × DP 16, 64 microbatches of 1``.  No torch: the report imports this.
"""

from __future__ import annotations

from autoshard.pipeline.schedules import Schedule
from autoshard.plans import Plan

__all__ = ["degrees_of", "headline"]


_KINDS = (  # the pattern names of autoshard.report.patterns, by the degree they give; first match wins
    ("dp", ("data parallel",)),  # most parameters replicated: a few stored split (FSDP) do not make it FSDP
    ("fsdp", ("FSDP",)),
    ("ep", ("expert parallel",)),
    ("tp", ("Megatron", "vocab-parallel")),
    ("cp", ("sequence / context parallel",)),
    ("sp", ("sequence parallel",)),  # Ulysses: heads split around attention, weights whole
    ("tp", ("head-parallel",)),
)


def degrees_of(plan: Plan, pipeline_axis: int | None = None) -> dict[str, int]:
    """Degree per kind of parallelism, read off the patterns the report recognises on each mesh axis
    (:func:`autoshard.report.patterns.recognise`): data parallel → ``dp``, else FSDP/ZeRO-3 → ``fsdp``, expert
    parallel → ``ep``, Megatron column→row / vocab-parallel → ``tp``, attention split by sequence → ``cp``,
    norms split by sequence (Megatron-style next to ``tp``, else Ulysses) → ``sp``, head-parallel attention
    alone → ``tp``."""
    from autoshard.report.groups import PlanView  # the report reads plans; import it only when asked
    from autoshard.report.patterns import recognise

    names: dict[int, list[str]] = {}
    for pattern in recognise(PlanView.of(plan)):
        for axis in pattern.axes:
            names.setdefault(axis, []).append(pattern.name)
    degrees: dict[str, int] = {}
    for axis, size in enumerate(plan.mesh_shape):
        if size == 1:
            continue
        seen = names.get(axis, [])
        kind = "pp" if axis == pipeline_axis else None
        for candidate, prefixes in _KINDS:
            if kind is None and any(n.startswith(prefixes) for n in seen):
                kind = candidate
        if kind is not None:
            degrees[kind] = degrees.get(kind, 1) * size
    return degrees


def headline(plan: Plan) -> str:
    """One line: ``PP 8 (interleaved, v=3) × TP 8 × DP 16, 64 microbatches of 1`` (``CP 16 (zigzag)``)."""
    order = ("pp", "tp", "sp", "cp", "ep", "fsdp", "dp")
    parts = []
    for kind in order:
        size = plan.degrees.get(kind, 1)
        if size <= 1:
            continue
        text = f"{kind.upper()} {size}"
        if kind == "pp" and plan.pipeline is not None:
            name = Schedule(plan.pipeline.schedule).short
            v = plan.pipeline.virtual_stages
            text += f" ({name}, v={v})" if v > 1 else f" ({name})"
        if kind == "cp" and plan.context_axis is not None:
            text += f" ({plan.context_layout})"  # the ring axis's sequence layout (zigzag: load-balanced)
        parts.append(text)
    head = " × ".join(parts) or "no parallelism (replicated)"
    batch = max((shape[0][0] for shape in plan.input_shapes.values() if shape[0]), default=0)
    replicas = plan.degrees.get("dp", 1) * plan.degrees.get("fsdp", 1)
    if plan.microbatches > 1 and batch:
        each = batch // plan.microbatches // max(1, replicas)
        return f"{head}, {plan.microbatches} microbatches of {max(1, each)}"
    return f"{head}, 1 microbatch"
