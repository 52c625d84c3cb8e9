"""The kinds of parallelism a plan uses, and the report's one-line headline.

Input: a :class:`~autoshard.plans.Plan`.  Output: ``Plan.degrees`` (``{"pp": 8, "tp": 8, "dp": 16}``) and the
line ``PP 8 (interleaved, v=3) × TP 8 × DP 16, 64 microbatches of 1``.  Both are read off what each mesh axis
splits (:func:`autoshard.report.axes.axis_uses`), the facts the report's body prints under "mesh axes", so the
headline and the body cannot disagree.  No torch: the report imports this.
"""

from __future__ import annotations

from collections.abc import Callable

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
    an older version may hold differently), so the line matches the report's "mesh axes" section.  An axis
    splitting weights and experts alike is named by both (``TP/EP 8``); a module an axis splits otherwise
    than its kind says is named (``DP 16 (lm_head vocab-split on axis 0)``,
    :func:`autoshard.report.axes.split_notes`); a plan that splits nothing says so (``replicated on 8
    devices: no collective``).  ``autoshard search`` and ``show`` both print this line first."""
    from autoshard.report.axes import KIND_ORDER, axis_uses, degrees, split_notes, unsplit_parts
    from autoshard.report.groups import PlanView

    view = PlanView.of(plan)
    every = axis_uses(view, 0 if plan.pipeline is not None else None)
    uses = [u for u in every if u.kind is not None]
    sizes: dict[str, int] = {}  # axis label -> degree, outermost kind first
    for use in sorted(uses, key=lambda u: KIND_ORDER.index(str(u.kind))):
        sizes[use.label] = sizes.get(use.label, 1) * use.size
    notes = split_notes(view, uses)
    parts, told = [], set()  # a note said once (TP/EP 8 × EP 2 share the experts note)
    for label, size in sizes.items():
        said = [note for kind in label.lower().split("/") for note in _kind_notes(plan, kind)]
        extra = notes.get(label, [])
        said = [n for n in extra if n == "+SP"] + said + [n for n in extra if n != "+SP"]  # "TP 8 (+SP; ..."
        said = [note for note in dict.fromkeys(said) if note not in told]
        told |= set(said)
        parts.append(f"{label} {size}" + (f" ({'; '.join(said)})" if said else ""))
    rest = unsplit_parts(every)  # axes no kind names: weights stored split, or plain replicas
    head = " × ".join(parts + rest) if parts or any(p.startswith("ZeRO") for p in rest) else _replicated(plan)
    found = degrees(uses)
    batch = max((shape[0][0] for shape in plan.input_shapes.values() if shape[0]), default=0)
    replicas = found.get("dp", 1) * found.get("fsdp", 1)
    if plan.microbatches > 1 and batch:
        each = batch // plan.microbatches // max(1, replicas)
        return f"{head}, {plan.microbatches} microbatches of {max(1, each)}"
    return f"{head}, 1 microbatch"


def _replicated(plan: Plan) -> str:
    """The headline of a plan no mesh axis splits: what every device waits for (``Plan.collectives``, ring
    hops and ZeRO-1's ``Plan.optimizer_gathers``)."""
    devices = f"{plan.num_devices} device{'s' * (plan.num_devices != 1)}"
    moved = len(plan.collectives) + sum(r.hops for r in plan.ring_transfers)
    waits = "no collective" if not moved else f"{moved} collective{'s' * (moved != 1)} of small ops"
    gathers = len(plan.optimizer_gathers)
    if gathers:
        waits += (
            f"{' but' if not moved else ','} ZeRO-1's {gathers} optimizer all-gather{'s' * (gathers != 1)}"
        )
    return f"replicated on {devices}: {waits}"


def _kind_notes(plan: Plan, kind: str) -> list[str]:
    """What the headline says beside one kind's degree (schedule, ring layout, parameter counts)."""
    if kind == "pp" and plan.pipeline is not None:
        name = Schedule(plan.pipeline.schedule).short
        v = plan.pipeline.virtual_stages
        return [f"{name}, v={v}" if v > 1 else name]
    said = []
    if kind == "cp" and plan.context_axis is not None:
        said.append(plan.context_layout)  # the ring axis's sequence layout (zigzag: load-balanced)
    note = {"fsdp": _fsdp_note, "dp": _dp_note, "ep": _ep_note}.get(kind, _weights_note(kind))
    text = note(plan) if note is not None else ""
    return [*said, text] if text else said


def _ep_note(plan: Plan) -> str:
    from autoshard.report.axes import experts_note
    from autoshard.report.groups import PlanView

    return experts_note(PlanView.of(plan), 0 if plan.pipeline is not None else None)


def _dp_note(plan: Plan) -> str:
    from autoshard.report.axes import dp_weights_note
    from autoshard.report.groups import PlanView

    return dp_weights_note(PlanView.of(plan), 0 if plan.pipeline is not None else None)


def _weights_note(kind: str) -> Callable[[Plan], str] | None:
    """A ring, sequence or tensor-parallel axis storing parameters split and gathering them says so as a DP
    axis does (``CP 8 (contiguous; ZeRO-3/FSDP on 560 of 723 parameters)``)."""
    if kind not in ("cp", "sp", "tp"):
        return None
    from autoshard.report.axes import dp_weights_note
    from autoshard.report.groups import PlanView

    return lambda plan: dp_weights_note(PlanView.of(plan), 0 if plan.pipeline is not None else None, kind)


def _fsdp_note(plan: Plan) -> str:
    from autoshard.report.axes import fsdp_note
    from autoshard.report.groups import PlanView

    return fsdp_note(PlanView.of(plan), 0 if plan.pipeline is not None else None)
