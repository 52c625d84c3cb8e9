"""Say in words what each module group does on each mesh axis: the body of the report.

Input: a :class:`~autoshard.report.groups.PlanView` and one of its groups.  Output: :func:`describe_group`
→ one phrase list per module group ("attention by heads on axis 1, MLP column→row on axis 1, batch on
axis 0"), from the roles of :mod:`autoshard.report.roles`.

Example::

    for g in view.groups():
        print(g.name, describe_group(view, g))
"""

from __future__ import annotations

from collections import defaultdict

from autoshard.report.groups import Group, PlanView
from autoshard.report.labels import axes_text
from autoshard.report.roles import all_to_all_axes, axis_role, fsdp_axes

__all__ = ["describe_group"]

_PART_TITLE = {
    "attention": "attention",
    "mlp": "MLP",
    "experts": "experts",
    "head": "output layer",
    "other": "linears",
}


def describe_group(view: PlanView, group: Group) -> list[str]:
    """Phrases for one module group, each naming its axes: ``["batch on axis 0", ...]``."""
    ndim = len(view.plan.mesh_shape)
    phrases: dict[str, list[int]] = defaultdict(list)
    a2a = all_to_all_axes(view, group)
    fsdp = fsdp_axes(view, set(group.params))
    for axis in range(ndim):
        for phrase in _group_phrases(group, axis, a2a.get(axis, set()), axis in fsdp):
            phrases[phrase].append(axis)
    if not phrases:
        return ["replicated (every device computes all of it)"]
    return [f"{p} on {axes_text(axes)}" for p, axes in phrases.items()]


def _group_phrases(group: Group, axis: int, a2a_parts: set[str], fsdp: bool) -> list[str]:
    roles: dict[str, set[str]] = defaultdict(set)  # part -> roles of its weighted ops / attention
    data: set[str] = set()
    other: set[str] = set()
    for row in group.ops:
        role = axis_role(row, axis)
        if role is None:
            continue
        if row.kind in ("matmul", "grouped_mm", "embedding", "attention"):
            roles[row.part].add(role)
        if role in ("batch", "sequence"):
            data.add(role)
        elif role.startswith("dim "):
            other.add(role)
    out = [_attention_phrase(roles.get("attention", set()), "attention" in a2a_parts)]
    for part in ("mlp", "experts", "head", "other"):
        out.append(_linear_phrase(_PART_TITLE[part], roles.get(part, set())))
    out.append(_embedding_phrase(roles.get("embedding", set())))
    out += [role for role in ("batch", "sequence") if role in data]
    if fsdp:
        out.append("weights FSDP-sharded")
    tensor_parallel = any(r & {"column", "row"} for r in roles.values())
    if tensor_parallel and "dim 1" in other and "sequence" not in data:  # Megatron sequence parallelism
        out.append("sequence")
        other.discard("dim 1")
    out = [p for p in out if p]
    if not out and other:
        out.append("activations split on " + ", ".join(sorted(other)))
    return out


def _attention_phrase(roles: set[str], all_to_all: bool) -> str:
    how = ""
    if "column" in roles and "row" in roles:
        how = " (column→row projections)"
    elif all_to_all:
        how = " (all-to-all)"
    if "heads" in roles:
        return "attention by heads" + how
    if "sequence" in roles and "batch" not in roles:
        return "attention by sequence (context parallel)"
    return "attention column→row" if how.startswith(" (column") else ""


def _linear_phrase(title: str, roles: set[str]) -> str:
    if "experts" in roles:
        return f"{title} split by expert"
    if "column" in roles and "row" in roles:
        return f"{title} column→row"
    if "column" in roles:
        return f"{title} column-split"
    if "row" in roles:
        return f"{title} row-split"
    return ""


def _embedding_phrase(roles: set[str]) -> str:
    if "vocab" in roles:
        return "embedding split by vocabulary"
    return "embedding split by hidden dim" if "hidden" in roles else ""
