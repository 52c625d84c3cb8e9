"""Recognise the named parallelisms in a plan.

Input: a :class:`~autoshard.report.groups.PlanView`.
Output: :func:`recognise` → a list of :class:`Pattern` (name, mesh axes, where, evidence).  Everything is
read from what the plan records: each op's strategy label and its role on each mesh axis
(:mod:`autoshard.report.roles`), each parameter's stored placement and the collectives of one step.  The
words per module group are :mod:`autoshard.report.describe`'s (re-exported here).

The named patterns follow REFERENCE.md ("Canonical plans"): data parallel (batch split, weights replicated,
gradients all-reduced), FSDP / ZeRO-3 (weights stored split and all-gathered before use), Megatron column→row
(a column-split matmul feeding a row-split one with no all-gather between), head-parallel attention,
vocab-parallel embedding and LM head, sequence parallel (norms split by sequence; Megatron-style next to
tensor parallelism, Ulysses-style when all-to-alls surround attention), expert parallel.

Example::

    for p in recognise(PlanView.of(plan)):
        print(p)            # "Megatron column→row on axis 0: fc1 → fc2 (...)"
"""

from __future__ import annotations

from dataclasses import dataclass

from autoshard.report.describe import describe_group
from autoshard.report.groups import Group, OpRow, PlanView
from autoshard.report.labels import axes_text, fmt_bytes
from autoshard.report.roles import all_to_all_axes, axis_role, fsdp_params, gathered_param

__all__ = ["Pattern", "axis_role", "describe_group", "recognise"]


@dataclass(frozen=True, slots=True)
class Pattern:
    """A named parallelism seen in the plan."""

    name: str
    axes: tuple[int, ...]
    where: tuple[str, ...]
    evidence: str

    def __str__(self) -> str:
        where = f": {', '.join(self.where)}" if self.where else ""
        return f"{self.name} on {axes_text(self.axes)}{where} ({self.evidence})"


# -- named patterns --------------------------------------------------------------------------------------------


def recognise(view: PlanView) -> list[Pattern]:
    """Every named pattern the plan shows, in a fixed order."""
    ndim = len(view.plan.mesh_shape)
    found = _pipeline(view) + _data_parallel(view)
    for detector in (_fsdp, _megatron, _heads, _vocab, _sequence, _experts):
        per_axis = [detector(view, axis) for axis in range(ndim)]
        found += _merge_axes([p for p in per_axis if p is not None])
    return found


def _merge_axes(patterns: list[Pattern]) -> list[Pattern]:
    """One line for a pattern seen on several axes with the same where and evidence."""
    merged: dict[tuple[str, tuple[str, ...], str], list[int]] = {}
    for p in patterns:
        merged.setdefault((p.name, p.where, p.evidence), []).extend(p.axes)
    return [Pattern(name, tuple(axes), where, ev) for (name, where, ev), axes in merged.items()]


def _matmul_share(view: PlanView, axis: int, role: str) -> float:
    rows = [r for r in view.ops if r.kind in ("matmul", "grouped_mm")]
    total = sum(r.node.compute_seconds for r in rows)
    share = sum(r.node.compute_seconds for r in rows if axis_role(r, axis) == role)
    return share / total if total else 0.0


def _pipeline(view: PlanView) -> list[Pattern]:
    """The stages laid along one mesh axis (``Plan.pipeline``): each device runs its stage's layers only."""
    from autoshard.pipeline.schedules import Schedule  # no torch; the pipeline package is imported lazily

    pipe = view.plan.pipeline
    if pipe is None:
        return []
    v = pipe.virtual_stages
    chunks = f", {v} chunks per device" if v > 1 else ""
    evidence = f"{len(pipe.stages)} stages{chunks}, {Schedule(pipe.schedule).short} schedule, "
    evidence += f"{view.plan.microbatches} microbatch{'es' * (view.plan.microbatches != 1)}"
    return [Pattern("pipeline", (pipe.mesh_axis,), (), evidence)]


def _data_parallel(view: PlanView) -> list[Pattern]:
    """Axes where the batch is split and most parameters are replicated (one pattern for all of them)."""
    placements = view.plan.param_placements
    axes = [
        a
        for a in range(len(view.plan.mesh_shape))
        if _matmul_share(view, a, "batch") >= 0.5 and 2 * len(_replicated(placements, a)) >= len(placements)
    ]
    if not axes:
        return []
    replicated = set.intersection(*(_replicated(placements, a) for a in axes))
    sync = sum(
        c.nbytes
        for c in view.plan.collectives
        if c.phase == "backward" and c.mesh_axis in axes and view.param_nodes.get(c.tensor) in replicated
    )
    evidence = f"batch split; {len(replicated)} of {len(placements)} parameters replicated"
    evidence += f", gradient sync {fmt_bytes(sync)} per step" if sync else ""
    return [Pattern("data parallel", tuple(axes), (), evidence)]


def _replicated(placements: dict[str, tuple[str, ...]], axis: int) -> set[str]:
    return {f for f, spec in placements.items() if axis < len(spec) and spec[axis] == "R"}


def _fsdp(view: PlanView, axis: int) -> Pattern | None:
    nodes = {n.name: n for n in view.plan.nodes}
    gathers = [
        c
        for c in view.plan.collectives
        if c.phase == "forward"
        and c.kind == "all_gather"
        and c.mesh_axis == axis
        and gathered_param(view, c.tensor, nodes) is not None
    ]
    if not gathers:
        return None
    moved = sum(c.nbytes for c in gathers if not c.recompute)
    again = sum(c.nbytes for c in gathers if c.recompute)  # re-gathered where backward recomputes a block
    count = len(fsdp_params(view).get(axis, ()))  # as the headline and the "mesh axes" lines count
    evidence = (
        f"{count} parameter{'s' * (count != 1)} stored split, all-gathered before use "
        f"({fmt_bytes(moved)} per step"
        + (f", {fmt_bytes(again)} more re-gathered to recompute" if again else "")
        + "), gradients reduce-scattered"
    )
    return Pattern("FSDP / ZeRO-3", (axis,), (), evidence)


def _megatron(view: PlanView, axis: int) -> Pattern | None:
    pairs: list[str] = []
    gathers = _forward_gather_consumers(view, axis)
    inputs = {n.name: n.inputs for n in view.plan.nodes}
    for group in _sections(view):
        for part in ("attention", "mlp", "experts", "head", "other"):
            pair = _column_row_pair(group, part, axis, gathers, inputs)
            if pair:
                pairs.append(pair)
    if not pairs:
        return None
    return Pattern("Megatron column→row", (axis,), tuple(pairs), "no collective between the pair")


def _sections(view: PlanView) -> list[Group]:
    """Each layer stack alone, and every op outside the stacks as one sequence (pairs may span modules)."""
    groups = view.groups()
    stacks = [g for g in groups if g.count > 1]
    outside = tuple(r for r in view.ops if all(r.group != g.name for g in stacks))
    return [*stacks, Group("", 1, outside, ())] if outside else stacks


def _forward_gather_consumers(view: PlanView, axis: int) -> set[str]:
    """Ops that receive an all-gathered activation in the forward on ``axis``."""
    found = set()
    for c in view.plan.collectives:
        if (
            c.phase == "forward"
            and c.kind == "all_gather"
            and c.mesh_axis == axis
            and c.tensor not in view.param_nodes
        ):
            row = view.consumer(c)
            if row is not None:
                found.add(row.node.name)
    return found


def _column_row_pair(
    group: Group, part: str, axis: int, gathers: set[str], inputs: dict[str, tuple[str, ...]]
) -> str | None:
    """``"mlp.c_fc → mlp.c_proj"`` when a column op feeds a row op with no all-gather between (a row op that
    does not consume the column op's output, like v_proj after q_proj, is no pair)."""
    rows = [r for r in group.ops if r.part == part]
    cols: list[OpRow] = []
    for row in rows:
        if row.node.name in gathers and cols:
            cols = []  # an all-gather undoes the column split: not Megatron
        role = axis_role(row, axis) if row.kind in ("matmul", "grouped_mm") else None
        if role == "column":
            cols.append(row)
        elif role == "row" and cols:
            upstream = _ancestors(row.node.name, inputs)
            feeding = [c for c in cols if c.node.name in upstream] if any(inputs.values()) else cols
            if feeding:
                return _pair_text(feeding, row, group)
    return None


def _ancestors(name: str, inputs: dict[str, tuple[str, ...]]) -> set[str]:
    seen: set[str] = set()
    todo = list(inputs.get(name, ()))
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo.extend(inputs.get(n, ()))
    return seen


def _pair_text(cols: list[OpRow], row: OpRow, group: Group) -> str:
    """``fc1 → fc2``; ops of one module (fused experts) are named by op: ``experts: _grouped_mm → ...``."""
    modules = {_short(r, group) for r in (*cols, row)}
    if len(modules) == 1:
        names = ", ".join(c.node.name for c in cols)
        return f"{modules.pop()}: {names} → {row.node.name}"
    names = ", ".join(dict.fromkeys(_short(c, group) for c in cols))
    return f"{names} → {_short(row, group)}"


def _short(row: OpRow, group: Group) -> str:
    inside = row.local or row.node.module
    return f"{group.name}.{inside}" if group.count > 1 and inside else inside or group.name


def _heads(view: PlanView, axis: int) -> Pattern | None:
    groups = [g.name for g in view.groups() if any(_is(r, "attention", axis, "heads") for r in g.ops)]
    if not groups:
        return None
    a2a = any("attention" in all_to_all_axes(view, g).get(axis, set()) for g in view.groups())
    how = "all-to-all before and after attention" if a2a else "q/k/v split by heads, no collective inside"
    return Pattern("head-parallel attention", (axis,), tuple(groups), how)


def _vocab(view: PlanView, axis: int) -> Pattern | None:
    embed = [r for r in view.ops if _is(r, "embedding", axis, "vocab")]
    head = [r for r in view.ops if r.kind == "matmul" and r.part == "head" and axis_role(r, axis) == "column"]
    where = tuple(dict.fromkeys(r.group for r in embed + head))
    if not where:
        return None
    name = "vocab-parallel embedding" if embed else "vocab-parallel LM head"
    if embed and head:
        name = "vocab-parallel embedding and LM head"
    return Pattern(name, (axis,), where, "split over the vocabulary")


def _sequence(view: PlanView, axis: int) -> Pattern | None:
    norms = [r for r in view.ops if r.part == "norm" and r.kind != "view"]
    split = [r for r in norms if axis_role(r, axis) == "sequence"]
    if any(_is(r, "attention", axis, "sequence") for r in view.ops):
        return Pattern("sequence / context parallel", (axis,), (), "attention itself split by sequence")
    if _megatron_sp(view, axis):
        how = "Megatron-style: reduce-scatter after row-split, all-gather before column-split"
        return Pattern("sequence parallel", (axis,), (), how)
    if not split or len(split) * 2 < len(norms):
        return None
    if any("attention" in all_to_all_axes(view, g).get(axis, set()) for g in view.groups()):
        return Pattern(
            "sequence parallel", (axis,), (), "Ulysses-style: all-to-all to heads around attention"
        )
    return Pattern("sequence parallel", (axis,), (), "norms and activations split by sequence")


def _megatron_sp(view: PlanView, axis: int) -> bool:
    """A row-split op's partial output reduce-scattered and a column-split op's input all-gathered."""
    forward = [c for c in view.plan.collectives if c.phase == "forward" and c.mesh_axis == axis]
    scatter = any(c.kind == "reduce_scatter" and _role_of(view.row(c.tensor), axis) == "row" for c in forward)
    gather = any(c.kind == "all_gather" and _role_of(view.consumer(c), axis) == "column" for c in forward)
    return scatter and gather


def _role_of(row: OpRow | None, axis: int) -> str | None:
    return axis_role(row, axis) if row is not None and row.kind in ("matmul", "grouped_mm") else None


def _experts(view: PlanView, axis: int) -> Pattern | None:
    rows = [r for r in view.ops if r.kind == "grouped_mm" and axis_role(r, axis) == "experts"]
    if not rows:
        return None
    where = tuple(dict.fromkeys(r.group for r in rows))
    modules = {r.node.module for r in rows}
    at_experts = [c for c in view.plan.collectives if c.mesh_axis == axis and c.module in modules]
    # a routed-experts node's own all-to-alls (problem.dispatch) move and serve that node, in every layer
    names = {r.node.name for r in rows}
    a2a = [
        c
        for c in view.plan.collectives
        if c.mesh_axis == axis
        and c.kind == "all_to_all"
        and ((c.node in names and c.tensor == c.node) or c.module in modules)
    ]
    if a2a:
        how = f"tokens sent by all-to-all: {len(a2a)} per step ({fmt_bytes(sum(c.nbytes for c in a2a))})"
    else:  # Megatron's all-gather dispatcher: tokens gathered over the expert axis, outputs reduced
        how = f"tokens gathered, outputs reduced: {fmt_bytes(sum(c.nbytes for c in at_experts))} per step"
    return Pattern("expert parallel", (axis,), where, f"experts split, {how}")


def _is(row: OpRow, kind: str, axis: int, role: str) -> bool:
    return row.kind == kind and axis_role(row, axis) == role
