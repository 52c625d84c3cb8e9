"""What each mesh axis splits: the facts the report's body shows and its headline is made of.

Input: a :class:`~autoshard.report.groups.PlanView`.  Output: one :class:`AxisUse` per mesh axis
(:func:`axis_uses`), and the degrees ``{"tp": 8, "dp": 16}`` they add up to (:func:`degrees`).

Per axis, two facts are read from the plan, the same ones the strategy section words per module group
(:mod:`autoshard.report.describe`, through :func:`autoshard.report.roles.axis_role`):

- **the compute**: every matmul, grouped matmul, attention and embedding op has a role on the axis; roles
  fall into four families, weighted by the op's compute time (all layers): ``batch``; ``sequence`` (a
  sequence split of activations, or attention heads exchanged by all-to-all around attention: Ulysses);
  ``features`` (weights used split: column, row, heads, vocabulary, hidden); ``experts``.  The family with the
  largest share is what the axis splits;
- **the parameters**: how many are stored split on the axis, and whether they are all-gathered before use.

The kind of parallelism follows from them, and nothing else:

======================  ================================================================================
kind                    when
======================  ================================================================================
``pp``                  the axis the pipeline stages are laid along
``ep``                  the compute is split by experts
``tp``                  the compute uses weights split (Megatron column→row, heads, vocabulary)
``cp``                  the axis runs ring attention (K/V hops around it: ``Plan.ring_transfers`` or
                        ``Plan.context_axis``), whatever else it splits; or the compute is split by
                        sequence and attention itself is
``sp``                  the compute is split by sequence, attention is not (Ulysses, norms only)
``fsdp``                the compute is split by batch and at least half the parameters are stored split
                        and gathered before use (:func:`autoshard.report.roles.fsdp_params`)
``dp``                  the compute is split by batch, parameters mostly replicated
(none)                  nothing is split on the axis: every device of it computes the same
======================  ================================================================================

Example::

    for use in axis_uses(PlanView.of(plan)):
        print(use)   # "axis 1 (8): TP: weights used split (100% of the weighted compute); 7 of 9 ..."
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from autoshard.report.groups import OpRow, PlanView
from autoshard.report.labels import shard_dim
from autoshard.report.roles import all_to_all_axes, axis_role, fsdp_params

__all__ = ["KIND_ORDER", "AxisUse", "axis_uses", "degrees", "dp_weights_note", "experts_note", "fsdp_note"]

KIND_ORDER = ("pp", "tp", "sp", "cp", "ep", "fsdp", "dp")  # the headline's order, outermost kind first
_FAMILY = {
    "batch": "batch",
    "sequence": "sequence",
    "column": "features",
    "row": "features",
    "heads": "features",
    "vocab": "features",
    "hidden": "features",
    "experts": "experts",
}
_WEIGHTED = ("matmul", "grouped_mm", "attention", "embedding")
_SAYS = {
    "batch": "activations split by batch",
    "sequence": "activations split by sequence",
    "features": "weights used split",
    "experts": "experts split",
}


@dataclass(frozen=True, slots=True)
class AxisUse:
    """What one mesh axis splits (module docstring)."""

    axis: int
    size: int
    kind: str | None  # one of KIND_ORDER; None: nothing split on this axis
    compute: str  # the family of the largest share ("batch", "sequence", "features", "experts"), or ""
    share: float  # its share of the weighted ops' compute time
    attention_by_sequence: bool
    params_split: int  # parameters stored split on this axis
    params: int
    gathered: bool  # some parameter stored split is all-gathered before use (FSDP)
    params_gathered: int = 0  # how many of them

    def __str__(self) -> str:
        head = f"axis {self.axis} ({self.size}): "
        if self.kind == "pp":
            return head + "PP: pipeline stages"
        if self.kind is None:
            return head + "nothing split: every device of this axis computes the same"
        what = _SAYS[self.compute] if self.compute else ""
        if (
            self.kind == "cp" and self.compute != "sequence"
        ):  # a ring on an axis that mostly splits other work
            what = "attention split by sequence (ring K/V)" + (f", {what}" if what else "")
        elif self.compute == "sequence":
            what += ", attention too (ring)" if self.attention_by_sequence else ", attention not by sequence"
        stored = f"{self.params_split} of {self.params} parameters stored split"
        if self.gathered:
            every = self.params_gathered in (0, self.params_split)
            stored += ", gathered before use" if every else f", {self.params_gathered} gathered before use"
        return f"{head}{self.kind.upper()}: {what} ({self.share:.0%} of the weighted compute); {stored}"


def axis_uses(view: PlanView, pipeline_axis: int | None = None) -> list[AxisUse]:
    """One record per mesh axis of size > 1."""
    placements = view.plan.param_placements
    gathered = fsdp_params(view)
    plan = view.plan
    rings = {r.mesh_axis for r in plan.ring_transfers} | ({plan.context_axis} - {None})
    out = []
    for axis, size in enumerate(view.plan.mesh_shape):
        if size == 1:
            continue
        split = sum(1 for spec in placements.values() if axis < len(spec) and spec[axis].startswith("S("))
        family, share, ring = _compute(view, axis)
        fsdp = len(gathered.get(axis, ()))
        if axis == pipeline_axis:
            kind: str | None = "pp"
        elif axis in rings:  # K/V hops around this axis: context parallel, whatever else it splits
            kind, ring = "cp", True
        else:
            kind = _kind(family, ring, fsdp, len(placements))
        out.append(AxisUse(axis, size, kind, family, share, ring, split, len(placements), fsdp > 0, fsdp))
    return out


def degrees(uses: list[AxisUse]) -> dict[str, int]:
    """``{"tp": 8, "dp": 16}``: the sizes of the axes of each kind multiplied together."""
    out: dict[str, int] = {}
    for use in uses:
        if use.kind is not None:
            out[use.kind] = out.get(use.kind, 1) * use.size
    return out


def dp_weights_note(view: PlanView, pipeline_axis: int | None = None) -> str:
    """What the headline adds to ``DP n`` when parameters are stored split and gathered (ZeRO-3 / FSDP) on a
    data-parallel axis, yet too few of them for the axis to count as FSDP: ``"ZeRO-3/FSDP on 1 of 148
    parameters"``; ``""`` when the DP axes shard no parameter."""
    uses = [u for u in axis_uses(view, pipeline_axis) if u.kind == "dp"]
    gathered = fsdp_params(view)  # every parameter by its own name, as the axis lines and patterns count
    names = {fqn for u in uses for fqn in gathered.get(u.axis, ())}
    if not names:
        return ""
    return f"ZeRO-3/FSDP on {len(names)} of {len(view.plan.param_placements)} parameters"


def fsdp_note(view: PlanView, pipeline_axis: int | None = None) -> str:
    """What the headline adds to ``FSDP n``: how many parameters the FSDP axes shard (stored split and gathered
    before use, :func:`autoshard.report.roles.fsdp_params`, as the "mesh axes" lines and the patterns count
    them): ``"224 of 291 parameters"``, so that it reads beside the DP note's count of the DP axes."""
    gathered = fsdp_params(view)
    names = {f for u in axis_uses(view, pipeline_axis) if u.kind == "fsdp" for f in gathered.get(u.axis, ())}
    return f"{len(names)} of {len(view.plan.param_placements)} parameters" if names else ""


def experts_note(view: PlanView, pipeline_axis: int | None = None) -> str:
    """What the headline adds to ``EP n``: what every mesh axis does to the experts, read from the grouped
    expert matmuls' operands and the expert weights' placements (the EP axis splits them; another axis may
    give each device its own tokens with the experts replicated or gathered, split inside each expert, or
    hand every device of it the same tokens, so that its devices all compute the same experts):
    ``"experts split on axis 1; axis 0: same tokens, experts computed 2×"``; ``""`` without experts, or when
    every axis splits them."""
    rows = [r for r in view.ops if r.kind == "grouped_mm" and r.layout is not None]
    if not rows:
        return ""
    row = max(rows, key=lambda r: r.node.compute_seconds)  # the expert compute (one per layer position)
    split, others = [], []
    for axis, size in enumerate(view.plan.mesh_shape):
        if size == 1 or axis == pipeline_axis:
            continue
        what = _expert_use(view, row, axis)
        if what == "split":
            split.append(str(axis))
        else:
            others.append(f"axis {axis}: {what.format(n=size)}")
    if not others:
        return ""  # every axis splits the experts: the degree says it all
    head = f"experts split on axis {', '.join(split)}" if split else "experts not split by expert"
    return "; ".join([head, *others])


def _expert_use(view: PlanView, row: OpRow, axis: int) -> str:
    """What mesh ``axis`` does to one grouped expert matmul (``{n}``: the axis size)."""
    assert row.layout is not None
    at = lambda spec: shard_dim(spec[axis]) if spec is not None and axis < len(spec) else None  # noqa: E731
    weight, tokens = at(row.label.input(row.layout.weight)), at(row.label.input(row.layout.activation))
    if weight == 0:
        return "split"
    if weight is not None:
        return "each expert split"
    stored = [
        spec
        for fqn, spec in view.plan.param_placements.items()
        if fqn.startswith(view.layer0(row.node.module) + ".") or fqn == row.weight
    ]
    gathered = any(axis < len(spec) and spec[axis].startswith("S(") for spec in stored)
    if tokens is None:
        return "same tokens, experts " + ("gathered, " if gathered else "") + "computed {n}×"
    return "tokens split, experts " + ("gathered" if gathered else "replicated")


def _compute(view: PlanView, axis: int) -> tuple[str, float, bool]:
    """(family of the largest compute share, that share, attention split by sequence) on ``axis``."""
    ulysses = any("attention" in all_to_all_axes(view, g).get(axis, set()) for g in view.groups())
    seconds: dict[str, float] = defaultdict(float)
    ops: dict[str, int] = defaultdict(int)  # ties (plans without compute times) go to the most ops
    total = 0.0
    ring = False
    for row in view.ops:
        if row.kind not in _WEIGHTED:
            continue
        total += row.node.compute_seconds
        role = axis_role(row, axis)
        if role is None or role not in _FAMILY:
            continue
        family = _FAMILY[role]
        if row.kind == "attention" and role == "heads" and ulysses:
            family = "sequence"  # heads exchanged for the sequence around attention: Ulysses
        ring = ring or (row.kind == "attention" and role == "sequence")
        seconds[family] += row.node.compute_seconds
        ops[family] += 1
    if not seconds:
        return "", 0.0, ring
    family = max(seconds, key=lambda f: (seconds[f], ops[f], f))
    return family, (seconds[family] / total if total else 0.0), ring


def _kind(family: str, ring: bool, gathered: int, params: int) -> str | None:
    if family == "experts":
        return "ep"
    if family == "features":
        return "tp"
    if family == "sequence":
        return "cp" if ring else "sp"
    if family == "batch":
        return "fsdp" if gathered and 2 * gathered >= params else "dp"
    return None
