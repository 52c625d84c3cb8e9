"""The text report of a plan: what was decided, what one step costs, and how it compares with data parallel.

Input: a :class:`~autoshard.plans.Plan`, optionally a :class:`Baseline` (the same model planned as pure data
parallel, or why that is impossible) and the wall time the planning took.
Output: lines of at most ``width`` columns (default 100):

1. the cluster and its mesh (which axes cross nodes), and what each mesh axis splits
   (:mod:`autoshard.report.axes`: the headline's degrees);
2. the strategy per module group, repeated layers shown once (``model.layers.0–31 (×32)``);
3. the named patterns recognised (:mod:`autoshard.report.patterns`);
4. the collectives of one step, grouped by phase, kind, axis and purpose, with bytes and time;
5. step time with its compute / communication split and memory per device against capacity, beside the
   data-parallel baseline;
6. the solver's certificate, where the planning time went (:mod:`autoshard.report.timing`) and the
   plan's notes.

:func:`report_data` returns the same content as plain JSON-able data for ``autoshard search --json``.

Example::

    print(render(plan, baseline=Baseline.of(dp_plan)))
    print(render(plan, baseline=Baseline.impossible("does not fit: ...")))
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from autoshard.pipeline.summary import headline
from autoshard.plans import Collective, Plan, RingTransfer
from autoshard.report.axes import axis_uses
from autoshard.report.figures import Baseline, figure_lines, zero_split
from autoshard.report.groups import Group, PlanView
from autoshard.report.labels import fmt_bytes, fmt_seconds, spec_text, wrap
from autoshard.report.notes import user_notes
from autoshard.report.patterns import describe_group, recognise
from autoshard.report.proof import proof_line
from autoshard.report.timing import Phase, timing_text

__all__ = ["NOT_COMPARED", "Baseline", "collective_rows", "render", "report_data", "summary"]

MINOR_SHARE = 0.005  # groups below this share of compute, without parameters, are listed by name only
MAX_COLLECTIVE_ROWS = 12
MAX_PARAMETER_ROWS = 24
_PHASE = {"forward": "fwd", "backward": "bwd", "regather": "bwd", "recompute": "bwd", "optimizer": "opt"}
ZERO_PURPOSE = "ZeRO-1 all-gather of updated weights"  # Plan.optimizer_gathers, after backward
#: A gradient all-reduce on an axis where the parameter is replicated: ZeRO-1 (runtime/zero.py) runs it as a
#: reduce-scatter of the gradient, then an all-gather of the updated weights (the same bytes)
ZERO_SYNC = "gradient sync (ZeRO-1 split: see optimizer)"
RING_KIND, RING_PURPOSE = "ring K/V hop", "ring K/V"  # context parallelism's point-to-point sends


@dataclass(frozen=True, slots=True)
class CollectiveRow:
    """Collectives of one step sharing phase, kind, axis and purpose."""

    phase: str
    kind: str
    axis: int
    purpose: str  # "gradient sync", "weight gather", "activations", "output"
    where: str
    count: int
    nbytes: int
    seconds: float


#: What :meth:`Plan.summary` says in place of the pure data-parallel column when given no baseline plan.
NOT_COMPARED = (
    "not compared (summary() sees only this plan): pass summary(baseline=...) the same model planned with every "
    "parameter annotated R, or run `autoshard search`, which plans both"
)


def summary(plan: Plan, width: int, baseline: Plan | None) -> str:
    """:meth:`Plan.summary`: the report beside ``baseline`` (pure data parallel), or saying it was not compared."""
    if baseline is not None:
        return render(plan, width=width, baseline=Baseline.of(baseline))
    return render(plan, width=width, baseline=Baseline("data parallel", reason=NOT_COMPARED))


def render(
    plan: Plan,
    *,
    baseline: Baseline | None = None,
    width: int = 100,
    planned_seconds: float | None = None,
    memory_budget: float | None = None,
    phases: Sequence[Phase] | None = None,
) -> str:
    """The whole report as one string; every line fits ``width`` columns.

    ``memory_budget``: the per-device limit the plan was made under (bytes), when not the device's memory.
    ``phases``: what the planning command measured (:mod:`autoshard.report.timing`); writing this report is
    measured here and added to them, ``planned_seconds`` is the wall time before it.
    """
    start = time.perf_counter()
    view = PlanView.of(plan)
    sections = [
        wrap(headline(plan), width, "  ", ""),  # wrapped, never cut; a replicated plan has one too
        _header(plan, width),
        _axes(view, width),
        _strategy(view, width),
        _placements(view, width),
        _patterns(view, width),
        _collectives(view, width),
        figure_lines(plan, baseline, width, memory_budget),
    ]
    if phases is not None:
        report = time.perf_counter() - start
        phases = [*phases, Phase("report", report)]
        planned_seconds = None if planned_seconds is None else planned_seconds + report
    sections.append(_footer(plan, timing_text(plan, phases, planned_seconds), width))
    text = "\n\n".join("\n".join(lines) for lines in sections if lines)
    return "\n".join(_fit(line, width) for line in text.splitlines())


def _fit(line: str, width: int) -> str:
    return line if len(line) <= width else line[: width - 1] + "…"


# -- sections --------------------------------------------------------------------------------------------------


def _header(plan: Plan, width: int) -> list[str]:
    mode = "training" if plan.training else "inference"
    lines = [f"autoshard plan: {plan.model}, {mode}, {plan.num_devices} devices"]
    description = str(plan.cluster.get("description", "")) or f"mesh {plan.mesh_shape}"
    hardware, _, mesh = description.partition("\n")
    lines += wrap(hardware, width, " " * 10, "cluster   ")
    if mesh:
        lines += wrap(mesh.removeprefix("mesh "), width, " " * 10, "mesh      ")
    return lines


def _axes(view: PlanView, width: int) -> list[str]:
    """What each mesh axis splits: the facts the headline's degrees are made of."""
    uses = axis_uses(view, 0 if view.plan.pipeline is not None else None)
    if not uses:
        return []
    lines = ["mesh axes (what each splits; the headline's degrees)"]
    for use in uses:
        lines += wrap(str(use), width, "    ", "  ")
    return lines


def _strategy(view: PlanView, width: int) -> list[str]:
    groups = view.groups()
    total = sum(g.compute for g in groups) or 1.0
    shown = [g for g in groups if g.params or g.compute / total >= MINOR_SHARE]
    minor = [g.name for g in groups if g not in shown]
    names = [_group_title(g) for g in shown]
    column = min(max((len(n) for n in names), default=0) + 2, 34)
    lines = ["strategy by module group"]
    for group, name in zip(shown, names, strict=True):
        text = ", ".join(describe_group(view, group))
        first = f"  {name:<{column}}" if len(name) < column else f"  {name}  "
        lines += wrap(text, width, " " * (column + 2), first)
    if minor:
        plural = "s" * (len(minor) != 1)
        lines += wrap(
            f"({len(minor)} small group{plural} without parameters: {', '.join(minor)})", width, "    ", "  "
        )
    return lines


def _placements(view: PlanView, width: int) -> list[str]:
    """One row per parameter, repeated layers collapsed; the notation annotations accept."""
    rows = dict.fromkeys((view.layer_of(fqn), spec) for fqn, spec in view.plan.param_placements.items())
    if not rows:
        return []
    column = min(max(len(name) for name, _ in rows) + 2, width - 24)
    lines = ["parameter placements (per mesh axis)"]
    for name, spec in list(rows)[:MAX_PARAMETER_ROWS]:
        lines.append(f"  {name:<{column}}{spec_text(spec)}")
    if len(rows) > MAX_PARAMETER_ROWS:
        lines.append(f"  … {len(rows) - MAX_PARAMETER_ROWS} more (autoshard search --json lists all)")
    return lines


def _group_title(group: Group) -> str:
    return f"{group.name} (×{group.count})" if group.count > 1 else group.name


def _patterns(view: PlanView, width: int) -> list[str]:
    patterns = recognise(view)
    lines = ["patterns recognised"]
    for p in patterns:
        lines += wrap(str(p), width, "    ", "  ")
    if not patterns and any(use.kind is not None for use in axis_uses(view)):
        lines.append("  none of the named ones (the mesh axes above say what each axis splits)")
    elif not patterns:
        lines.append("  none: every device runs the whole model on the whole batch")
    return lines


def collective_rows(view: PlanView) -> list[CollectiveRow]:
    """The step's collectives grouped by (phase, kind, axis, purpose, where), most time first."""
    buckets: dict[tuple[str, str, int, str, str], list[Collective]] = defaultdict(list)
    for c in (*view.plan.collectives, *view.plan.optimizer_gathers):  # every collective the step priced
        purpose, where = _purpose(view, c)
        buckets[(_row_phase(c), c.kind, c.mesh_axis, purpose, where)].append(c)
    rows = [
        CollectiveRow(
            *key[:4], _where(key[4], cs), len(cs), sum(c.nbytes for c in cs), sum(c.seconds for c in cs)
        )
        for key, cs in buckets.items()
    ]
    return sorted(rows + _ring_rows(view), key=lambda r: (-r.seconds, r.phase, r.kind, r.axis, r.where))


def _ring_rows(view: PlanView) -> list[CollectiveRow]:
    """Context parallelism's K/V hops (``Plan.ring_transfers``) by (phase, axis, module group): count = hops
    per device, bytes = what one device sends in them."""
    rows: dict[tuple[str, int, str], list[RingTransfer]] = defaultdict(list)
    for r in view.plan.ring_transfers:
        rows[(r.phase, r.mesh_axis, view.layer_of(r.module))].append(r)
    return [
        CollectiveRow(
            phase,
            RING_KIND,
            axis,
            RING_PURPOSE,
            where,
            sum(r.hops for r in rs),
            sum(r.hops * r.nbytes for r in rs),
            sum(r.seconds for r in rs),
        )
        for (phase, axis, where), rs in rows.items()
    ]


def _where(collapsed: str, cs: list[Collective]) -> str:
    """The collapsed module path, unless every collective of the row is in one layer (then that layer's)."""
    layers = {c.layer for c in cs}
    modules = {c.module for c in cs}
    return modules.pop() if len(layers) == 1 and None not in layers and len(modules) == 1 else collapsed


def _row_phase(c: Collective) -> str:
    """A row's phase: ``recompute`` for a forward move backward runs again with its block (it runs in
    backward, so it reads ``bwd``), else the collective's own."""
    return "recompute" if c.recompute else c.phase


def _purpose(view: PlanView, c: Collective) -> tuple[str, str]:
    """(purpose, where): gradient sync and weight gathers of parameters, ZeRO-1's gathers of updated
    shards, else activations at a module."""
    if c.phase == "optimizer":
        return ZERO_PURPOSE, ""
    if c.tensor in view.param_nodes:
        kinds = {"forward": "weight all-gather (FSDP)", "regather": "weight re-gather (FSDP)"}
        if c.recompute:
            return "weight re-gather (recompute)", ""
        return kinds.get(c.phase) or _gradient_purpose(view, c), ""
    if c.node == "output":  # the graph's return value (a training graph's loss): the root module has no name
        return (
            ("output of", view.layer_of(c.module))
            if c.module
            else ("the model's output (its return value)", "")
        )
    if not c.module:  # the root module's own op: its node name alone read as a module ("at pad")
        return "activations", f"{c.node} ({_op_of(view, c.node)} on {c.tensor}, outside any submodule)"
    return "activations", view.layer_of(c.module)


def _gradient_purpose(view: PlanView, c: Collective) -> str:
    """A parameter's backward move is its gradient's: an all-gather there gathers reduced gradient shards
    (the last hop of a hierarchical sync), never weights; an all-reduce where the weight is replicated is
    the one ZeRO-1 splits (new-user trial: both read "gradient sync" beside a ZeRO-1 note naming neither)."""
    if c.kind == "all_gather":
        return "gradient sync (gathers gradient shards)"
    fqn = c.module if c.module in view.plan.param_placements else view.param_nodes.get(c.tensor, "")
    return ZERO_SYNC if zero_split(view.plan, c, fqn) else "gradient sync"


def _op_of(view: PlanView, node: str) -> str:
    """``aten.pad`` for a node whose target is ``aten.pad.default``; the node's name when not in the table."""
    row = view.row(node)
    return row.node.target.removesuffix(".default") if row is not None else node


def _collectives(view: PlanView, width: int) -> list[str]:
    rows = collective_rows(view)
    head = f"  {'':<4}{'kind':<15}{'axis':>4}{'count':>6}{'bytes':>11}{'time':>10}  what"
    title = "collectives of one step (fwd: forward, bwd: backward"
    title += ", opt: after backward)" if view.plan.optimizer_gathers else ")"
    lines = [title, head]
    for r in rows[:MAX_COLLECTIVE_ROWS]:
        what = f"at {r.where}" if r.purpose == "activations" else f"{r.purpose} {r.where}".strip()
        what += " (recompute)" if r.phase == "recompute" and r.purpose == "activations" else ""
        what = f"at {r.where}" if r.purpose == RING_PURPOSE else what
        cells = (
            f"  {_PHASE.get(r.phase, r.phase):<4}{r.kind:<15}{r.axis:>4}{r.count:>6}{fmt_bytes(r.nbytes):>11}"
            f"{fmt_seconds(r.seconds):>10}  "
        )
        lines += wrap(what, width, " " * (len(cells) + 2), cells)  # a long "what" wraps, never cut
    rest = rows[MAX_COLLECTIVE_ROWS:]
    if rest:
        n, secs = sum(r.count for r in rest), sum(r.seconds for r in rest)
        lines.append(f"  … {len(rest)} more rows: {n} collectives, {fmt_seconds(secs)}")
    if not rows:
        return ["collectives of one step", "  none: no device ever waits for another"]
    lines += wrap(_totals(view), width, " " * 9, "  total: ")  # wrapped, never cut
    ring = view.plan.ring_transfers
    if ring:
        hops, sent = sum(r.hops for r in ring), sum(r.hops * r.nbytes for r in ring)
        text = (
            f"{hops} point-to-point hops per device ({fmt_bytes(sent)} sent, "
            f"{fmt_seconds(sum(r.seconds for r in ring))}), overlapped with attention: what it does not hide "
            "is in the compute figure, not in communication (the total above)"
        )
        lines += wrap(text, width, " " * 12, "  ring K/V: ")
    return lines


def _totals(view: PlanView) -> str:
    """Count, bytes and time per phase, ZeRO-1's optimizer gathers included: the collectives' time adds up
    to the communication figure (of a plan without pipeline stages).

    A weight gather backward runs again to recompute its block is a re-gather like FSDP's reshard after
    forward (``regather``, with how many of them recomputation's); other recomputed moves are ``recompute``."""
    phases: dict[str, list[Collective]] = defaultdict(list)
    for c in (*view.plan.collectives, *view.plan.optimizer_gathers):
        regathered = c.recompute and c.kind == "all_gather" and c.tensor in view.param_nodes
        phases["regather" if regathered else _row_phase(c)].append(c)
    parts = []
    for phase in ("forward", "backward", "regather", "recompute", "optimizer"):
        cs = phases.get(phase, [])
        if cs:
            again = sum(c.recompute for c in cs) if phase == "regather" else 0
            parts.append(
                f"{phase} {len(cs)} ({fmt_bytes(sum(c.nbytes for c in cs))}, "
                f"{fmt_seconds(sum(c.seconds for c in cs))}"
                + (f"; {again} for recomputation" if again else "")
                + ")"
            )
    return "; ".join(parts)


def _footer(plan: Plan, timing: str, width: int) -> list[str]:
    s = plan.solver
    proof = "linear step model optimal" if s.optimal else f"linear step model gap {s.gap:.2%}"
    line = f"solver {s.method}: {proof} in {fmt_seconds(s.seconds)}" + (f"; {timing}" if timing else "")
    lines = wrap(proof_line(plan), width, "  ", "proven: ") + wrap(line, width, "  ", "")
    for note in user_notes(plan):  # those that concern this plan, in a user's words
        lines += wrap(note, width, "      ", "note: ")
    return lines


# -- machine-readable ------------------------------------------------------------------------------------------


def report_data(plan: Plan, baseline: Baseline | None = None) -> dict[str, Any]:
    """The report's content as JSON-able data (groups, patterns, collective rows, baseline)."""
    view = PlanView.of(plan)
    data: dict[str, Any] = {
        "headline": headline(plan),  # the text report's first line, the same function
        "groups": [
            {"name": g.name, "layers": g.count, "strategy": describe_group(view, g)} for g in view.groups()
        ],
        "patterns": [
            {"name": p.name, "axes": list(p.axes), "where": list(p.where), "evidence": p.evidence}
            for p in recognise(view)
        ],
        "collectives": [
            {
                "phase": r.phase,
                "kind": r.kind,
                "mesh_axis": r.axis,
                "purpose": r.purpose,
                "where": r.where,
                "count": r.count,
                "nbytes": r.nbytes,
                "seconds": r.seconds,
            }
            for r in collective_rows(view)
        ],
    }
    if baseline is not None:
        data["baseline"] = baseline.as_dict()
    return data
