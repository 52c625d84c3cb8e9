"""The kinds of parallelism a plan uses, and the report's one-line headline.

Input: a :class:`~autoshard.plans.Plan`.  Output: ``Plan.degrees`` (``{"pp": 8, "tp": 8, "dp": 16}``) and the
line ``PP 8 (interleaved, v=3) × TP 8 × DP 16, 64 microbatches of 1``.  Both are read off what each mesh axis
splits (:func:`autoshard.report.axes.axis_uses`), the facts the report's body prints under "mesh axes", so the
headline and the body cannot disagree.  No torch: the report imports this.
"""

from __future__ import annotations

from autoshard.pipeline.schedules import Schedule
from autoshard.plans import Plan

__all__ = ["degrees_of", "headline"]


def degrees_of(plan: Plan, pipeline_axis: int | None = None) -> dict[str, int]:
    """Degree per kind of parallelism: the kind of each mesh axis (:mod:`autoshard.report.axes`) with the
    sizes of the axes of one kind multiplied together."""
    from autoshard.report.axes import axis_uses, degrees  # the report reads plans; import it only when asked
    from autoshard.report.groups import PlanView

    return degrees(axis_uses(PlanView.of(plan), pipeline_axis))


def headline(plan: Plan) -> str:
    """One line: ``PP 8 (interleaved, v=3) × TP 8 × DP 16, 64 microbatches of 1`` (``CP 16 (zigzag)``).

    The degrees are derived again from the plan's axes (not read from ``Plan.degrees``, which a file saved by
    an older version may hold differently), so the line matches the report's "mesh axes" section."""
    from autoshard.report.axes import KIND_ORDER

    found = degrees_of(plan, 0 if plan.pipeline is not None else None)
    parts = []
    for kind in KIND_ORDER:
        size = found.get(kind, 1)
        if size <= 1:
            continue
        text = f"{kind.upper()} {size}"
        if kind == "pp" and plan.pipeline is not None:
            name = Schedule(plan.pipeline.schedule).short
            v = plan.pipeline.virtual_stages
            text += f" ({name}, v={v})" if v > 1 else f" ({name})"
        if kind == "cp" and plan.context_axis is not None:
            text += f" ({plan.context_layout})"  # the ring axis's sequence layout (zigzag: load-balanced)
        if kind == "fsdp":  # how many parameters, counted as the DP note and the body count them
            text += _fsdp_note(plan)
        if kind == "dp":  # some weights FSDP-sharded on a DP axis: say so (report.axes.dp_weights_note)
            text += _dp_note(plan)
        if kind == "ep":  # what every axis does to the experts (report.axes.experts_note)
            text += _ep_note(plan)
        parts.append(text)
    head = " × ".join(parts) or "no parallelism (replicated)"
    batch = max((shape[0][0] for shape in plan.input_shapes.values() if shape[0]), default=0)
    replicas = found.get("dp", 1) * found.get("fsdp", 1)
    if plan.microbatches > 1 and batch:
        each = batch // plan.microbatches // max(1, replicas)
        return f"{head}, {plan.microbatches} microbatches of {max(1, each)}"
    return f"{head}, 1 microbatch"


def _ep_note(plan: Plan) -> str:
    from autoshard.report.axes import experts_note
    from autoshard.report.groups import PlanView

    note = experts_note(PlanView.of(plan), 0 if plan.pipeline is not None else None)
    return f" ({note})" if note else ""


def _dp_note(plan: Plan) -> str:
    from autoshard.report.axes import dp_weights_note
    from autoshard.report.groups import PlanView

    note = dp_weights_note(PlanView.of(plan), 0 if plan.pipeline is not None else None)
    return f" ({note})" if note else ""


def _fsdp_note(plan: Plan) -> str:
    from autoshard.report.axes import fsdp_note
    from autoshard.report.groups import PlanView

    note = fsdp_note(PlanView.of(plan), 0 if plan.pipeline is not None else None)
    return f" ({note})" if note else ""
