"""Steering by kind of parallelism: what ``allow=`` / ``forbid=`` (``--allow`` / ``--forbid``) rule out.

Input: the forbidden kinds (:func:`forbidden_kinds`) and a built problem's node records and strategies.
Output: boolean masks over each node's strategies (:func:`kind_masks`), for ``fsdp`` edges whose weight
gathers cost ``inf`` (:func:`forbid_gathers`), and for ``pp`` a refusal of pipeline stages
(:func:`check_stages`).  :func:`autoshard.annotations.pin_problem` folds them into the search problem, next
to the user's annotations.

Every split a strategy makes, of any operand or result of any op on any mesh axis, has a kind, read from
the dim it splits (:mod:`autoshard.steering_dims` finds which dims of every tensor carry the
batch, the sequence and the experts).  Forbidding a kind removes every such split, on every axis:

=======  ======================================================================================
kind     forbidding it removes
=======  ======================================================================================
``dp``   any tensor split on a dim carrying the batch: user inputs, activations (``(B*S, H)``
         after a flatten too), an attention mask built from shapes; FSDP's batch split included
``fsdp`` a weight stored split and gathered before use (FSDP / ZeRO-3): weight-to-op edges that
         would gather cost ``inf``
``tp``   a weight used split on a non-expert dim (column, row, vocabulary, an expert's own
         matrices), and any activation split on a dim carrying neither the batch, the sequence
         nor the experts: attention heads (and the reshapes and transposes around them, so
         Ulysses-style head exchange too), hidden, FFN, head dim, vocabulary logits
``sp``   any tensor split on a dim carrying the sequence, at any op but attention: sequence
         parallelism, and the sequence split outside attention that context parallelism keeps
``cp``   attention computed with its sequence split: q, k, v, the mask or the output split on a
         sequence dim at the attention op (ring attention, or queries split with K/V whole)
``ep``   an expert weight used split on its expert dim (grouped matmul, fused expert MLP)
``pp``   pipeline stages: ``pipeline=`` / ``--pp`` above 1, or a ``"stage"`` annotation
=======  ======================================================================================

A split of a dim carrying two roles (a flattened ``B*S``) is of both kinds, so forbidding either removes it.
A dim whose role cannot be followed (integer or boolean bookkeeping built from shapes alone, such as the
mask helpers of Hugging Face models) is of ``dp``, ``sp`` and ``tp`` at once: forbidding any keeps it whole.
Storing a weight split is not a kind by itself: used as stored it is ``tp`` (or ``ep``), gathered it is
``fsdp``.  Without ``sp`` and ``cp`` nothing is split by sequence; without ``dp``, ``tp``, ``sp``, ``cp``
and ``ep`` every op computes replicated (``fsdp`` may still store weights split).

Example::

    forbidden_kinds(allow=["tp"])           # frozenset({"dp", "fsdp", "sp", "cp", "ep", "pp"})
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from autoshard.errors import AnnotationError, InfeasibleError
from autoshard.placement import Shard
from autoshard.problem.build import BuiltProblem
from autoshard.problem.graph import NodeInfo
from autoshard.search.problem import Edge
from autoshard.steering_dims import Output, carried_dims, is_attention
from autoshard.strategies import OpStrategy

__all__ = [
    "FORBIDS",
    "KINDS",
    "batch_dims",
    "budget_refusal",
    "check_stages",
    "forbid_gathers",
    "forbidden_kinds",
    "has_stage_pin",
    "kind_masks",
    "needed_kinds",
    "no_gather",
    "split_kinds",
]

KINDS = ("dp", "fsdp", "tp", "sp", "cp", "ep", "pp")
"""Kinds ``allow=`` / ``forbid=`` understand (the table in the module docstring)."""

FORBIDS = {
    "dp": "the batch split, on any tensor",
    "fsdp": "weights stored split and gathered before use",
    "tp": "weights used split, and activations split on heads, hidden, FFN or vocabulary",
    "sp": "the sequence split outside attention",
    "cp": "attention split by sequence (ring, or queries only)",
    "ep": "expert weights split by expert",
    "pp": "pipeline stages",
}
"""One line per kind: what forbidding it removes (``--help``; the docstring's table is the definition)."""

_WEIGHTS = ("parameter", "buffer")
_VALUE_KINDS = frozenset(KINDS) - {"fsdp", "pp"}  # the kinds read from a strategy's splits
_UNTOLD = frozenset({"dp", "sp", "tp"})  # a split whose role cannot be told is of every kind it could be


def forbidden_kinds(allow: Sequence[str] = (), forbid: Sequence[str] = ()) -> frozenset[str]:
    """The kinds to rule out: ``forbid``, plus every known kind not in ``allow`` when ``allow`` is given."""
    for kind in (*allow, *forbid):
        if kind not in KINDS:
            raise AnnotationError(
                f"unknown parallelism kind {kind!r} in allow/forbid; known kinds: {', '.join(KINDS)}"
            )
    both = set(allow) & set(forbid)
    if both:
        raise AnnotationError(f"{', '.join(sorted(both))} both allowed and forbidden: drop one side")
    return frozenset(forbid) | (frozenset(KINDS) - frozenset(allow) if allow else frozenset())


def has_stage_pin(annotations: Mapping[str, Any] | None) -> bool:
    """Whether an annotation starts a pipeline stage (``{"model.layers.4": "stage"}``)."""
    return any(isinstance(v, str) and v == "stage" for v in (annotations or {}).values())


def check_stages(kinds: frozenset[str], pipeline: object, stage_pin: bool) -> None:
    """Refuse pipeline stages asked for while ``pp`` is forbidden (one line: what, and the two ways out)."""
    if "pp" not in kinds:
        return
    if pipeline not in (None, 1):
        raise AnnotationError(
            f"pipeline={pipeline!r} asks for pipeline stages but pp is forbidden (allow/forbid): drop the "
            "stages (--pp) or allow pp"
        )
    if stage_pin:
        raise AnnotationError(
            "a 'stage' annotation asks for pipeline stages but pp is forbidden (allow/forbid): drop the "
            "annotation or allow pp"
        )


def kind_masks(
    kinds: frozenset[str], infos: Mapping[str, NodeInfo], strategies: Mapping[str, Sequence[OpStrategy]],
    template: Mapping[str, str], dims: Mapping[Output, Mapping[str, frozenset[int]]] | None = None,
) -> dict[str, np.ndarray]:  # fmt: skip
    """Node masks keeping only the strategies that make no split of a forbidden kind (module docstring);
    ``fsdp`` constrains edges (:func:`forbid_gathers`), ``pp`` the request (:func:`check_stages`).
    ``dims``: :func:`carried_dims` of the same nodes, when the caller masks several kinds one by one."""
    if not kinds & _VALUE_KINDS:
        return {}
    dims = carried_dims(infos, strategies, template) if dims is None else dims
    masks: dict[str, np.ndarray] = {}
    for info in infos.values():
        if template[info.name] != info.name or info.kind not in ("op", "user_input"):
            continue  # a weight's own node is where it is stored: fsdp's, read on its edges
        keep = _node_mask(kinds, info, strategies[info.name], infos, dims)
        if not keep.all():
            masks[info.name] = keep
    return masks


def _node_mask(
    kinds: frozenset[str], info: NodeInfo, options: Sequence[OpStrategy], infos: Mapping[str, NodeInfo],
    dims: Mapping[Output, Mapping[str, frozenset[int]]],
) -> np.ndarray:  # fmt: skip
    memo: dict[tuple[int, int], frozenset[str]] = {}  # (operand position, dim) -> kinds

    def of(position: int, dim: int) -> frozenset[str]:
        if (position, dim) not in memo:
            memo[(position, dim)] = _kinds_of(info, position, dim, infos, dims)
        return memo[(position, dim)]

    return np.array([not _forbids(kinds, s, of) for s in options], dtype=bool)


def _forbids(kinds: frozenset[str], strategy: OpStrategy, of: Callable[[int, int], frozenset[str]]) -> bool:
    return any(kinds & of(position, dim) for position, dim in _splits(strategy))


def _splits(strategy: OpStrategy) -> Iterator[tuple[int, int]]:
    """(operand position, dim) of every split ``strategy`` makes: inputs first, then outputs."""
    for position, spec in enumerate((*strategy.inputs, *strategy.outputs)):
        for p in spec.placements if spec is not None else ():
            if isinstance(p, Shard):
                yield position, p.dim


def split_kinds(
    info: NodeInfo, strategy: OpStrategy, infos: Mapping[str, NodeInfo],
    dims: Mapping[Output, Mapping[str, frozenset[int]]],
) -> frozenset[str]:  # fmt: skip
    """The kinds of the splits ``strategy`` makes at ``info``, operands and results (the docstring's table)."""
    return frozenset().union(*(_kinds_of(info, k, dim, infos, dims) for k, dim in _splits(strategy)))


def _kinds_of(
    info: NodeInfo, position: int, dim: int, infos: Mapping[str, NodeInfo],
    dims: Mapping[Output, Mapping[str, frozenset[int]]],
) -> frozenset[str]:  # fmt: skip
    """The kinds of a split of ``dim`` of operand ``position`` of ``info`` (results follow the operands)."""
    n = len(info.inputs)
    key = (info.inputs[position], info.input_outputs[position]) if position < n else (info.name, position - n)
    roles = dims.get(key, {})
    experts = dim in roles.get("experts", ())
    if position < n and infos[key[0]].kind in _WEIGHTS:  # a weight used split: by expert, or tensor parallel
        return frozenset({"ep" if experts else "tp"})
    kinds = {"dp"} if dim in roles.get("batch", ()) else set()
    if dim in roles.get("sequence", ()):
        kinds.add("cp" if is_attention(info) else "sp")
    if experts:
        kinds.add("ep")
    if kinds:
        return frozenset(kinds)
    outputs = infos[key[0]].outputs
    meta = outputs[key[1]] if key[1] < len(outputs) else None
    if meta is not None and not meta.dtype.startswith(("float", "bfloat", "complex")):
        return _UNTOLD  # integer / bool bookkeeping built from shapes: which role its dim has is not known
    return frozenset({"tp"})


def needed_kinds(
    kinds: frozenset[str], info: NodeInfo, infos: Mapping[str, NodeInfo],
    strategies: Mapping[str, Sequence[OpStrategy]], template: Mapping[str, str], wanted: np.ndarray,
) -> list[str]:  # fmt: skip
    """The fewest forbidden kinds one of the ``wanted`` strategies of ``info`` needs (to say which to
    allow when a pin or the kinds leave the node nothing), in :data:`KINDS` order."""
    dims = carried_dims(infos, strategies, template)
    options = [
        kinds & split_kinds(info, s, infos, dims)
        for s, w in zip(strategies[info.name], wanted, strict=True)
        if w
    ]
    fewest = min(options, key=lambda k: (len(k), sorted(k)), default=frozenset())
    return [k for k in KINDS if k in fewest] or ["that kind"]


def batch_dims(
    infos: Mapping[str, NodeInfo], strategies: Mapping[str, Sequence[OpStrategy]], template: Mapping[str, str]
) -> dict[Output, frozenset[int]]:
    """The dims of every node output that carry the batch (:func:`autoshard.steering_dims.carried_dims`)."""
    dims = carried_dims(infos, strategies, template)
    return {key: roles["batch"] for key, roles in dims.items() if "batch" in roles}


def no_gather(param: OpStrategy, use: OpStrategy, position: int) -> bool:
    """Whether a weight stored as ``param`` chose is used exactly as stored by the op at ``position`` (no FSDP)."""
    return param.outputs[0] == use.inputs[position]


def forbid_gathers(built: BuiltProblem) -> tuple[Edge, ...]:
    """The problem's edges, with a weight and its op priced ``inf`` wherever the op would use the weight
    other than as stored.  A weight read through a fan-out node (tied or shared weights) has no direct edge
    to its ops: one 0 / ``inf`` edge is added for each such pair (edges of one pair are summed)."""
    index = {name: k for k, name in enumerate(built.variables)}
    rules: dict[tuple[int, int], list[int]] = {}
    for use in built.edges:
        if built.infos[use.producer].kind == "parameter":
            u, v = index[built.template[use.producer]], index[built.template[use.consumer]]
            rules.setdefault((u, v), []).append(use.position)

    def keep(u: int, v: int) -> np.ndarray:
        src, dst = built.strategies[built.variables[u]], built.strategies[built.variables[v]]
        return np.array([[all(no_gather(a, b, p) for p in rules[(u, v)]) for b in dst] for a in src])

    out = []
    for edge in built.problem.edges:
        if (edge.u, edge.v) in rules:
            edge = Edge(edge.u, edge.v, np.where(keep(edge.u, edge.v), edge.cost, np.inf))
        out.append(edge)
    direct = {(e.u, e.v) for e in built.problem.edges}
    out += [Edge(u, v, np.where(keep(u, v), 0.0, np.inf)) for u, v in rules if (u, v) not in direct]
    return tuple(out)


def budget_refusal(
    error: InfeasibleError, kinds: frozenset[str], tried: Sequence[str], *, pinned: bool, training: bool
) -> InfeasibleError:
    """A memory-budget refusal whose advice leaves out what the user already did and names what they ruled
    out: no "recompute activations" once none, selective and full were all tried, for inference, or with
    nothing ``tried`` (a model without repeated blocks: recomputation is per block; new-user trial: an MLP
    read "tried recomputation ... of every repeated block"), no "allow fsdp" unless fsdp was forbidden, no
    "relax annotations" without annotations."""
    text = " ".join(str(error).split())
    what, sep, fix = text.partition(" Fix: ")
    training = training and bool(tried)  # nothing to recompute: neither said as tried nor advised
    done = [f"tried recomputation {', '.join(tried)} of every repeated block"] if training else []
    left = [k for k in KINDS if k not in kinds]
    done += (
        [f"{', '.join(k for k in KINDS if k in kinds)} forbidden (left: {', '.join(left) or 'none'})"]
        if kinds
        else []
    )
    said = "".join(f"; {d}" for d in done)
    if not sep:
        return InfeasibleError(f"{text.rstrip('.')}{said}")
    items = [i for i in re.split(r",? or |, ", fix.rstrip(".")) if i]
    recomputed = not training or {"none", "selective", "full"} <= set(tried)
    items = [
        i
        for i in items
        if not (
            ("allow fsdp" in i and "fsdp" not in kinds)
            or ("recompute" in i and recomputed)
            or ("annotations" in i and not pinned)
        )
    ]
    items[-1:-1] = [
        f"allow {kind}"
        for kind in ("fsdp", "tp", "sp", "cp")
        if kind in kinds and f"allow {kind}" not in items
    ]
    advice = (
        items[0] if len(items) == 1 else f"{', '.join(items[:-1])}{',' * (len(items) > 2)} or {items[-1]}"
    )
    return InfeasibleError(f"{what.rstrip('.')}{said}. Fix: {advice}.")
