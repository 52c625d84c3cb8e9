"""The compute families of one mesh axis: what its weighted ops split, by share of their compute time.

Input: a :class:`~autoshard.report.groups.PlanView` and a mesh axis.  Output: ``{family: share}`` over the
weighted ops (:func:`shares_of`) or over the matmuls alone (:func:`matmul_shares`), and the kind of
parallelism the largest family makes (:func:`kind_of`); :mod:`autoshard.report.axes` builds each axis's
record from them.  Roles come from :func:`autoshard.report.roles.axis_role`; they fall into four families:
``batch``; ``sequence`` (a sequence split of activations, or attention heads exchanged by all-to-all around
attention: Ulysses, :func:`ulysses`); ``features`` (weights used split: column, row, heads, vocabulary,
hidden); ``experts``.

Example::

    shares, ring = shares_of(view, 1)   # ({"features": 0.93, "batch": 0.07}, False)
    kind_of(*largest(shares)[:1], ring, gathered=0, params=291)   # "tp"
"""

from __future__ import annotations

from collections import defaultdict

from autoshard.report.groups import PlanView
from autoshard.report.roles import all_to_all_axes, axis_role

__all__ = [
    "FAMILY",
    "WEIGHTED",
    "kind_of",
    "largest",
    "matmul_shares",
    "norms_by_sequence",
    "shares_of",
    "ulysses",
]

FAMILY = {
    "batch": "batch",
    "sequence": "sequence",
    "column": "features",
    "row": "features",
    "heads": "features",
    "vocab": "features",
    "hidden": "features",
    "experts": "experts",
}
"""Role (:func:`~autoshard.report.roles.axis_role`) -> family."""
WEIGHTED = ("matmul", "grouped_mm", "attention", "embedding")
"""The op kinds whose compute the shares weigh."""


def ulysses(view: PlanView, axis: int) -> bool:
    """Attention heads exchanged for the sequence by all-to-all around attention on ``axis`` (Ulysses)."""
    return any("attention" in all_to_all_axes(view, g).get(axis, set()) for g in view.groups())


def shares_of(view: PlanView, axis: int) -> tuple[dict[str, float], bool]:
    """({family: share of the weighted ops' compute time} on ``axis``, attention split by sequence); the
    families in the order the largest share wins ties in (plans without compute times: the most ops)."""
    exchanged = ulysses(view, axis)
    seconds: dict[str, float] = defaultdict(float)
    ops: dict[str, int] = defaultdict(int)  # ties (plans without compute times) go to the most ops
    total = 0.0
    ring = False
    for row in view.ops:
        if row.kind not in WEIGHTED:
            continue
        total += row.node.compute_seconds
        role = axis_role(row, axis)
        if role is None or role not in FAMILY:
            continue
        family = FAMILY[role]
        if row.kind == "attention" and role == "heads" and exchanged:
            family = "sequence"  # heads exchanged for the sequence around attention: Ulysses
        ring = ring or (row.kind == "attention" and role == "sequence")
        seconds[family] += row.node.compute_seconds
        ops[family] += 1
    order = sorted(seconds, key=lambda f: (seconds[f], ops[f], f), reverse=True)
    return {f: (seconds[f] / total if total else 0.0) for f in order}, ring


def matmul_shares(view: PlanView, axis: int) -> dict[str, float]:
    """{family: share of the matmuls' compute time} on ``axis`` (the ops that hold the weights: attention and
    embeddings left out), which decides whether a sequence-split axis uses its matrices split (TP + SP)."""
    seconds: dict[str, float] = defaultdict(float)
    total = 0.0
    for row in view.ops:
        if row.kind not in ("matmul", "grouped_mm"):
            continue
        total += row.node.compute_seconds
        family = FAMILY.get(axis_role(row, axis) or "")
        if family is not None:
            seconds[family] += row.node.compute_seconds
    return {f: s / total for f, s in seconds.items()} if total else {}


def norms_by_sequence(view: PlanView, axis: int) -> bool:
    """Some norm runs split by sequence on ``axis`` (Megatron's sequence parallelism between TP regions)."""
    norms = (row for row in view.ops if row.kind == "norm" or row.part == "norm")
    return any(axis_role(row, axis) == "sequence" for row in norms)


def largest(shares: dict[str, float]) -> tuple[str, float]:
    """The family that wins (the first of :func:`shares_of`' order) and its share; ``("", 0.0)`` for none."""
    return next(iter(shares.items()), ("", 0.0))


def kind_of(family: str, ring: bool, gathered: int, params: int) -> str | None:
    """The kind the largest ``family`` makes (the table of :mod:`autoshard.report.axes`): ``ring``, attention
    split by sequence; ``gathered`` of ``params`` parameters stored split and gathered before use."""
    if family == "experts":
        return "ep"
    if family == "features":
        return "tp"
    if family == "sequence":
        return "cp" if ring else "sp"
    if family == "batch":
        return "fsdp" if gathered and 2 * gathered >= params else "dp"
    return None
