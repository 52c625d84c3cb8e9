"""What each mesh axis splits: the facts the report's body shows and its headline is made of.

Input: a :class:`~autoshard.report.groups.PlanView`.  Output: one :class:`AxisUse` per mesh axis
(:func:`axis_uses`), and the degrees ``{"tp": 8, "dp": 16}`` they add up to (:func:`degrees`).

Per axis, two facts are read from the plan, the same ones the strategy section words per module group
(:mod:`autoshard.report.describe`, through :func:`autoshard.report.roles.axis_role`):

- **the compute**: every matmul, grouped matmul, attention and embedding op has a role on the axis; roles
  fall into four families, weighted by the op's compute time (all layers): ``batch``; ``sequence`` (a
  sequence split of activations, or attention heads exchanged by all-to-all around attention: Ulysses);
  ``features`` (weights used split: column, row, heads, vocabulary, hidden); ``experts``.  The family with the
  largest share is what the axis splits (:mod:`autoshard.report.families`);
- **the parameters**: how many are stored split on the axis, and whether they are all-gathered before use.

The kind of parallelism follows from them, and nothing else:

======================  ================================================================================
kind                    when
======================  ================================================================================
``pp``                  the axis the pipeline stages are laid along
``ep``                  the compute is split by experts
``tp``                  the compute uses weights split (Megatron column→row, heads, vocabulary); also
                        an axis whose compute is mostly split by sequence when its *matmuls* mostly use
                        weights split: Megatron tensor parallelism with sequence parallelism, the
                        sequence split only between the split matrices (norms) and around
                        attention.  Such an axis, or a TP axis whose norms run split by sequence, reads
                        ``TP 8 (+SP)`` (:attr:`AxisUse.sequence_between`)
``cp``                  the axis runs ring attention (K/V hops around it: ``Plan.ring_transfers`` or
                        ``Plan.context_axis``), whatever else it splits; or the compute is split by
                        sequence and attention itself is
``sp``                  the compute is split by sequence, attention is not (Ulysses, norms only), and
                        the matmuls keep their weights whole
``fsdp``                the compute is split by batch and at least half the parameters are stored split
                        and gathered before use (:func:`autoshard.report.roles.fsdp_params`)
``dp``                  the compute is split by batch, parameters mostly replicated
(none)                  nothing is split on the axis: every device of it computes the same
======================  ================================================================================

An axis splitting experts by expert and weights otherwise (attention heads, column/row) is named by both
kinds, ``TP/EP`` (:attr:`AxisUse.label`, thresholds :data:`MIXED_SHARE`, :data:`NOTE_SHARE`); its degree in
``Plan.degrees`` stays under the larger share's kind.  A module whose weights an axis splits otherwise than
its kind says (the LM head split over the vocabulary on a DP axis) is named beside the degree
(:func:`split_notes`), so that the headline never says less than the body.

Example::

    for use in axis_uses(PlanView.of(plan)):
        print(use)   # "axis 1 (8): TP: weights used split (100% of the weighted compute); 7 of 9 ..."
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from dataclasses import dataclass

from autoshard.report.families import FAMILY as _FAMILY
from autoshard.report.families import WEIGHTED as _WEIGHTED
from autoshard.report.families import kind_of, largest, matmul_shares, norms_by_sequence, shares_of, ulysses
from autoshard.report.groups import OpRow, PlanView
from autoshard.report.labels import axes_text, shard_dim
from autoshard.report.roles import axis_role, fsdp_params

__all__ = [
    "KIND_ORDER",
    "AxisUse",
    "axis_uses",
    "degrees",
    "dp_weights_note",
    "experts_note",
    "fsdp_note",
    "split_notes",
    "unsplit_parts",
]

KIND_ORDER = ("pp", "tp", "sp", "cp", "ep", "fsdp", "dp")  # the headline's order, outermost kind first
MIXED_SHARE = 0.10
"""An EP axis whose weight splits (heads, column/row) hold at least this share of the weighted compute is
named by both kinds ("TP/EP 8"): Mixtral's attention is ~17 % of a layer's matmul time beside its experts,
its router below 1 % (a router split alone leaves the axis EP).  A TP axis that splits experts by expert
is TP/EP from :data:`NOTE_SHARE` of the compute: splitting the experts is what makes an axis EP."""
NOTE_SHARE = 0.01
"""A module whose weights an axis splits otherwise than the axis's kind says (an LM head split over the
vocabulary on a DP axis) is named in the headline from this share of the weighted compute (LLaMA-3-8B's
head: 6.5 %; an embedding's lookup, ~0 %, is not: the strategy section shows it)."""
_KIND_FAMILY = {"tp": "features", "ep": "experts", "dp": "batch", "fsdp": "batch", "sp": "sequence"}
_KIND_FAMILY["cp"] = "sequence"
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
    also: str = ""  # a second kind the axis is named by ("ep" beside "tp": MIXED_SHARE), "" for none
    also_share: float = 0.0  # its share of the weighted compute
    sequence_between: bool = False  # a TP axis whose activations between the split matrices are split by
    # sequence (norms; Megatron's sequence parallelism): "TP 8 (+SP)"
    matmul_share: float = 0.0  # a TP axis: the share of the matmuls' compute that uses weights split
    sequence_share: float = 0.0  # a TP axis: the share of the weighted compute split by sequence
    sequence_attention: bool = False  # ... of which attention, its heads exchanged by all-to-all (Ulysses)

    @property
    def label(self) -> str:
        """The axis's name in the headline and the "mesh axes" lines: ``TP``, ``TP/EP``; "" when nothing
        is split."""
        kinds = sorted({self.kind, self.also} - {None, ""}, key=KIND_ORDER.index)
        return "/".join(str(k).upper() for k in kinds)

    def __str__(self) -> str:
        head = f"axis {self.axis} ({self.size}): "
        if self.kind == "pp":
            return head + "PP: pipeline stages"
        if self.kind is None and not self.params_split:
            return head + "nothing split: every device of this axis computes the same"
        if self.kind is None:  # weights stored split (and gathered before use), the compute not split
            return f"{head}compute not split: every device of this axis computes the same; {self._stored()}"
        what = _SAYS[self.compute] if self.compute else ""
        if self.sequence_between:
            return f"{head}{self.label} (+SP): {self._tp_sp()}; {self._stored()}"
        if (
            self.kind == "cp" and self.compute != "sequence"
        ):  # a ring on an axis that mostly splits other work
            what = "attention split by sequence (ring K/V)" + (f", {what}" if what else "")
        elif self.compute == "sequence":
            what += ", attention too (ring)" if self.attention_by_sequence else ", attention not by sequence"
        stored = self._stored()
        share = f"{self.share:.0%} of the weighted compute"
        if self.also:  # two weight splits on one axis: both shares
            share = f"{self.share:.0%}; {_SAYS[_KIND_FAMILY[self.also]]}: {self.also_share:.0%} of the weighted compute"
        return f"{head}{self.label}: {what} ({share}); {stored}"

    def _tp_sp(self) -> str:
        """What a TP axis with sequence parallelism splits: the weights in the matmuls, the sequence between."""
        what = f"weights used split ({self.matmul_share:.0%} of the matmul compute, {self.share:.0%} of the weighted)"
        between = "activations between them split by sequence"
        if self.sequence_share >= 0.005:  # matmuls or attention split by sequence too: said with their share
            around = ", attention's heads exchanged by all-to-all" if self.sequence_attention else ""
            between += f" ({self.sequence_share:.0%} of the weighted compute{around})"
        else:
            between += " (norms)"
        also = f"; {_SAYS[_KIND_FAMILY[self.also]]}: {self.also_share:.0%}" if self.also else ""
        return f"{what}, {between}{also}"

    def _stored(self) -> str:
        stored = f"{self.params_split} of {self.params} parameters stored split"
        if self.gathered:
            every = self.params_gathered in (0, self.params_split)
            stored += ", gathered before use" if every else f", {self.params_gathered} gathered before use"
        return stored


def unsplit_parts(uses: list[AxisUse]) -> list[str]:
    """What the headline says of the axes no kind names (their compute is not split), after the kinds: an
    axis storing weights split and gathering them is no replica (``ZeRO-3 2 (axis 1: 2 of 31
    parameters stored split and gathered, compute not split)``); the others, together, replicate the rest
    (``replicated 2 (axis 1 splits nothing)``).  ``[]`` when every axis has a kind."""
    parts, plain, size = [], [], 1
    for use in uses:
        if use.kind is not None:
            continue
        if not use.params_split:
            plain.append(use.axis)
            size *= use.size
            continue
        stored = f"{use.params_split} of {use.params} parameters stored split"
        if use.gathered:
            every = use.params_gathered in (0, use.params_split)
            stored += " and gathered" if every else f", {use.params_gathered} gathered"
        parts.append(f"ZeRO-3 {use.size} (axis {use.axis}: {stored}, compute not split)")
    if plain:
        verb = "splits" if len(plain) == 1 else "split"
        parts.append(f"replicated {size} ({axes_text(plain)} {verb} nothing)")
    return parts


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
        shares, ring = shares_of(view, axis)
        family, share = largest(shares)
        fsdp = len(gathered.get(axis, ()))
        if axis == pipeline_axis:
            kind: str | None = "pp"
        elif axis in rings:  # K/V hops around this axis: context parallel, whatever else it splits
            kind, ring = "cp", True
        else:
            kind = kind_of(family, ring, fsdp, len(placements))
        matmuls = matmul_shares(view, axis)
        if kind == "sp" and matmuls.get("features", 0.0) > matmuls.get("sequence", 0.0):
            kind = "tp"  # the matrices are used split, the sequence split lies between them: TP with SP
            family, share = "features", shares.get("features", 0.0)
        between = (kind == "tp" and not ring) and (  # attention split by sequence is CP's, not SP's
            shares.get("sequence", 0.0) > 0.0 or norms_by_sequence(view, axis)
        )
        also, also_share = "", 0.0
        if kind in ("tp", "ep"):  # weights split and experts split on one axis: name both (MIXED_SHARE)
            other = "ep" if kind == "tp" else "tp"
            also_share = shares.get(_KIND_FAMILY[other], 0.0)
            also = other if also_share >= (MIXED_SHARE if other == "tp" else NOTE_SHARE) else ""
        uses = (split, len(placements), fsdp > 0, fsdp)
        use = AxisUse(axis, size, kind, family, share, ring, *uses, also, also_share if also else 0.0)
        if between:  # what lies between the split matrices, for the "mesh axes" line
            sequence = shares.get("sequence", 0.0)
            use = dataclasses.replace(
                use,
                sequence_between=True,
                matmul_share=matmuls.get("features", 0.0),
                sequence_share=sequence,
                sequence_attention=ulysses(view, axis),
            )
        out.append(use)
    return out


def degrees(uses: list[AxisUse]) -> dict[str, int]:
    """``{"tp": 8, "dp": 16}``: the sizes of the axes of each kind multiplied together."""
    out: dict[str, int] = {}
    for use in uses:
        if use.kind is not None:
            out[use.kind] = out.get(use.kind, 1) * use.size
    return out


def dp_weights_note(view: PlanView, pipeline_axis: int | None = None, kind: str = "dp") -> str:
    """What the headline adds to ``DP n`` when parameters are stored split and gathered (ZeRO-3 / FSDP) on a
    data-parallel axis, yet too few of them for the axis to count as FSDP: ``"ZeRO-3/FSDP on 1 of 148
    parameters"``; ``""`` when the DP axes shard no parameter.  The same for the axes of another ``kind``
    (``"cp"``: a ring axis may store most parameters split and gather them, LLaMA-3-70B's CP 8)."""
    uses = [u for u in axis_uses(view, pipeline_axis) if u.kind == kind]
    gathered = fsdp_params(view)  # every parameter by its own name, as the axis lines and patterns count
    names = {fqn for u in uses for fqn in gathered.get(u.axis, ())}
    if not names:
        return ""
    return f"ZeRO-3/FSDP on {len(names)} of {len(view.plan.param_placements)} parameters"


def fsdp_note(view: PlanView, pipeline_axis: int | None = None) -> str:
    """What the headline adds to ``FSDP n``: how many parameters the FSDP axes shard (stored split and gathered
    before use, :func:`autoshard.report.roles.fsdp_params`, as the "mesh axes" lines and the patterns count
    them): ``"224 of 291 parameters"``, so that it reads beside the DP note's count of the DP axes.  When
    several FSDP axes split different parameters the headline's degree holds only for those split over all of
    them, so it says how many: ``"224 of 291 parameters split, 160 of them 16-way"`` (LLaMA-3-8B on 2 x 8,
    whose k_proj and v_proj are split 8-way only)."""
    gathered = fsdp_params(view)
    uses = [u for u in axis_uses(view, pipeline_axis) if u.kind == "fsdp"]
    sets = [set(gathered.get(u.axis, ())) for u in uses]
    names = set().union(*sets)
    if not names:
        return ""
    count = f"{len(names)} of {len(view.plan.param_placements)} parameters"
    full = set.intersection(*sets)
    if len(full) == len(names):
        return count
    degree = math.prod(u.size for u in uses)
    return f"{count} split, {len(full)} of them {degree}-way"


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


def split_notes(view: PlanView, uses: list[AxisUse]) -> dict[str, list[str]]:
    """What the headline adds to each axis label (:attr:`AxisUse.label`) so that it never says less than
    the body: the modules whose weights an axis splits otherwise than its kind says, from
    :data:`NOTE_SHARE` of the weighted compute, largest first (at most :data:`MAX_NOTES`):
    ``{"DP": ["lm_head vocab-split on axis 0"]}``; first, ``"+SP"`` for a TP axis whose activations between
    the split matrices are split by sequence (:attr:`AxisUse.sequence_between`).  A CP axis may split
    weights without a note (its "mesh axes" line names both)."""
    rows = [r for r in view.ops if r.kind in _WEIGHTED]
    total = sum(r.node.compute_seconds for r in rows)
    seconds: dict[tuple[str, str, str], float] = defaultdict(float)
    axes: dict[tuple[str, str, str], list[int]] = defaultdict(list)
    for use in uses:
        if use.kind is None or use.kind == "pp":
            continue
        named = {_KIND_FAMILY[use.kind], _KIND_FAMILY.get(use.also, "")}
        named |= {use.compute} if use.kind == "cp" else set()
        exchanged = ulysses(view, use.axis)
        for row in rows:
            role = axis_role(row, use.axis)
            family = _FAMILY.get(role or "")
            if row.kind == "attention" and role == "heads" and exchanged:
                family = "sequence"
            if family not in ("features", "experts") or family in named or role is None:
                continue
            key = (use.label, _module_words(view, row), _SPLIT_WORDS[role](row))
            seconds[key] += row.node.compute_seconds
            if use.axis not in axes[key]:
                axes[key].append(use.axis)
    out: dict[str, list[str]] = defaultdict(list)
    for key in sorted(seconds, key=lambda k: -seconds[k]):
        label, module, split = key
        if seconds[key] >= NOTE_SHARE * total > 0.0:
            out[label].append(f"{module} {split} on {axes_text(axes[key])}")
    sp = [use.label for use in uses if use.sequence_between]  # Megatron's sequence parallelism: "TP 8 (+SP)"
    return {label: ["+SP"] * (label in sp) + _capped(out[label]) for label in dict.fromkeys([*sp, *out])}


MAX_NOTES = 3  # the headline names at most this many modules per axis label; the body lists them all
_SPLIT_WORDS = {
    "column": lambda r: "vocab-split" if r.part == "head" else "column-split",
    "row": lambda r: "row-split",
    "heads": lambda r: "split by heads",
    "vocab": lambda r: "vocab-split",
    "hidden": lambda r: "hidden-split",
    "experts": lambda r: "split by expert",
}
_PART_WORDS = {"attention": "attention", "mlp": "MLP", "experts": "experts", "head": "output layer"}


def _module_words(view: PlanView, row: OpRow) -> str:
    """``lm_head``; in a stack, the stack and the part: ``model.layers.0–31 experts``."""
    count = max((r.node.count for r in view.ops if r.group == row.group), default=1)
    if count <= 1:
        return row.group
    return f"{row.group} {_PART_WORDS.get(row.part, row.local or row.part)}"


def _capped(notes: list[str]) -> list[str]:
    if len(notes) <= MAX_NOTES:
        return notes
    rest = len(notes) - MAX_NOTES
    return [*notes[:MAX_NOTES], f"{rest} more module{'s' * (rest > 1)} split otherwise (mesh axes below)"]
