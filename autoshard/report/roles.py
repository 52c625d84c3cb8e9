"""What one op does on one mesh axis, read from the plan's labels and collectives.

Input: an :class:`~autoshard.report.groups.OpRow` (or a :class:`~autoshard.report.groups.PlanView`) and a
mesh axis.  Output: a role (:func:`axis_role`) or per-axis facts of the collectives (:func:`all_to_all_axes`,
:func:`fsdp_axes`).  The body of the report (:mod:`autoshard.report.describe`), the named patterns
(:mod:`autoshard.report.patterns`) and the headline (:mod:`autoshard.report.axes`) all read these.

The role of an op on one mesh axis:

- a matmul-like op (``linear``, ``addmm``, ``mm``, grouped MoE matmul; see ``WEIGHT_LAYOUT``): ``row`` when its
  output is ``P`` or its weight is split on the contracted dim, ``column`` when the weight is split on the
  output-feature dim, ``experts`` when a grouped matmul's weight is split on the expert dim, otherwise the
  activation decides: ``batch`` (dim 0 split) or ``sequence`` (a later dim split, weight whole);
- ``scaled_dot_product_attention`` (``(B, H, S, D)`` operands): ``batch``, ``heads`` or ``sequence``;
- an embedding: ``vocab`` (weight dim 0 split) or ``hidden`` (dim 1);
- a norm or any other op on ``(B, S, H)`` activations: ``batch`` (dim 0) or ``sequence`` (dim 1).

Example::

    axis_role(view.ops[0], 1)      # "column"
"""

from __future__ import annotations

import re
from collections import defaultdict

from autoshard.plans import NodePlan
from autoshard.report.groups import Group, OpRow, PlanView
from autoshard.report.labels import Spec, shard_dim

__all__ = ["all_to_all_axes", "axis_role", "fsdp_axes", "fsdp_params"]


def axis_role(row: OpRow, axis: int) -> str | None:
    """What ``row`` does on mesh ``axis`` (see the module docstring); ``None``: nothing to say."""
    if row.kind in ("matmul", "grouped_mm", "embedding"):
        return _weighted_role(row, axis)
    if row.kind == "attention":
        # dim 0 is the batch, not "no split" (a DP axis's line left attention's share out)
        dim = _dim(row.label.input(0), axis)
        return {0: "batch", 1: "heads", 2: "sequence"}.get(dim) if dim is not None else None
    if row.kind == "view":
        return None
    dim = _dim(row.label.output, axis)
    if dim is None:
        return "partial" if _at(row.label.output, axis) == "P" else None
    if dim == 0:
        return "batch"
    # a norm normalises the last dim, so a split dim 1 of its (B, S, H) input is the sequence; elsewhere a
    # dim-1 split may be features of a 2-D activation
    return "sequence" if row.kind == "norm" or row.part == "norm" else f"dim {dim}"


def _weighted_role(row: OpRow, axis: int) -> str | None:
    layout = row.layout
    assert layout is not None
    w = _dim(row.label.input(layout.weight), axis)
    if row.kind == "embedding":
        if w is not None:
            return "vocab" if w == layout.in_dim else "hidden"
    elif (
        row.kind == "grouped_mm" and w == 0
    ):  # split over experts: its output is Partial, yet not a row split
        return "experts"
    elif _at(row.label.output, axis) == "P" or (w is not None and w == layout.in_dim):
        return "row"
    elif w is not None:
        return "experts" if row.kind == "grouped_mm" and w == 0 else "column"
    x = _dim(row.label.input(layout.activation), axis)
    if x is None:
        return None
    return "batch" if x == 0 else "sequence"


def _at(spec: Spec | None, axis: int) -> str | None:
    return spec[axis] if spec is not None and axis < len(spec) else None


def _dim(spec: Spec | None, axis: int) -> int | None:
    placement = _at(spec, axis)
    return shard_dim(placement) if placement is not None else None


def all_to_all_axes(view: PlanView, group: Group) -> dict[int, set[str]]:
    """axis -> parts of ``group`` whose ops receive a forward all-to-all on that axis."""
    names = {r.node.name for r in group.ops}
    out: dict[int, set[str]] = defaultdict(set)
    for c in view.plan.collectives:
        if c.phase != "forward" or c.kind != "all_to_all":
            continue
        row = view.consumer(c)
        if row is not None and row.node.name in names:
            out[c.mesh_axis].add(row.part)
    return out


def fsdp_axes(view: PlanView, fqns: set[str] | None = None) -> dict[int, list[str]]:
    """axis -> parameters stored split on it and all-gathered in the forward (FSDP / ZeRO-3)."""
    out: dict[int, list[str]] = defaultdict(list)
    nodes = {n.name: n for n in view.plan.nodes}
    for c in view.plan.collectives:
        fqn = gathered_param(view, c.tensor, nodes) if c.phase == "forward" else None
        if c.kind != "all_gather" or fqn is None:
            continue
        if (fqns is None or fqn in fqns) and fqn not in out[c.mesh_axis]:
            out[c.mesh_axis].append(fqn)
    return out


def fsdp_params(view: PlanView) -> dict[int, set[str]]:
    """axis -> the parameters FSDP-sharded on it: stored split on the axis (``Plan.param_placements``) and
    all-gathered there in the forward.  Every parameter is counted once, by its own name: a gather recorded
    for one layer (``Collective.layer``) names that layer's copy, one recorded for the captured block without
    a layer stands for every layer's copy.  The headline, the "mesh axes" lines and the patterns all count
    this (they disagreed: 224 gathered in the patterns, "7 gathered" on the axis line)."""
    placements = view.plan.param_placements
    prefix = view.block_prefix
    out: dict[int, set[str]] = defaultdict(set)
    nodes = {n.name: n for n in view.plan.nodes}
    for c in view.plan.collectives:
        fqn = gathered_param(view, c.tensor, nodes) if c.phase == "forward" else None
        if c.kind != "all_gather" or fqn is None:
            continue
        names = {fqn}
        if prefix and fqn.startswith(prefix + "."):
            rest = re.sub(rf"^{re.escape(prefix)}\.\d+", "", fqn)
            layers = [c.layer] if c.layer is not None else range(max(view.block_count, 1))
            names = {f"{prefix}.{i}{rest}" for i in layers}
        axis = c.mesh_axis
        out[axis] |= {f for f in names if f in placements and _stored_split(placements[f], axis)}
    return {axis: names for axis, names in out.items() if names}


_VIEWS = ("aten.t.", "aten.transpose.", "aten.permute.", "aten.view.", "aten.reshape.", "aten._unsafe_view.")


def gathered_param(view: PlanView, tensor: str, nodes: dict[str, NodePlan] | None = None) -> str | None:
    """The parameter an all-gathered ``tensor`` is, through the views taken of it (a routed expert weight is
    gathered as its transpose, Mixtral's ``transpose_4``); ``None`` for an activation.  ``nodes``: the plan's
    nodes by name, when the caller asks for many tensors."""
    nodes = nodes if nodes is not None else {n.name: n for n in view.plan.nodes}
    while tensor not in view.param_nodes:
        node = nodes.get(tensor)
        if node is None or len(node.inputs) != 1 or not node.target.startswith(_VIEWS):
            return None
        tensor = node.inputs[0]
    return view.param_nodes[tensor]


def _stored_split(spec: tuple[str, ...], axis: int) -> bool:
    return axis < len(spec) and spec[axis].startswith("S(")
