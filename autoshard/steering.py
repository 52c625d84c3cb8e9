"""Steering by kind of parallelism: what ``allow=`` / ``forbid=`` (``--allow`` / ``--forbid``) rule out.

Input: the forbidden kinds (:func:`forbidden_kinds`) and a built problem's node records and strategies.
Output: boolean masks over each node's strategies (:func:`kind_masks`) and, for ``fsdp``, edges whose weight
gathers cost ``inf`` (:func:`forbid_gathers`).  :func:`autoshard.annotations.pin_problem` folds both into the
search problem, next to the user's annotations.

The kinds, and what forbidding one removes on *every* tensor of the graph:

- ``dp``: any split of the batch.  The batch is dim 0 of every user input, followed through the graph by the
  strategies themselves (:func:`batch_dims`): an output dim carries the batch when some strategy splits an
  input's batch dim and that output dim on the same mesh axis (forward), or when a consumer's strategy
  splits it to yield a batch split of the consumer's output (backward: an attention mask built in the
  graph from shapes alone).  ``(B*S, H)`` after a flatten carries it in dim 0.  So forbidding ``dp`` leaves
  no activation split by batch, not only the inputs.
- ``tp``: an op computing on a weight it uses split (tensor, vocabulary and expert parallelism).
- ``fsdp``: a weight stored split and gathered before use (FSDP / ZeRO-3).

Sequence and context splits (sequence parallelism, ring attention) are no kind of their own: they stay
free under any ``allow`` / ``forbid``; pin them off with annotations if needed.

Example::

    forbidden_kinds(allow=["tp"])           # frozenset({"dp", "fsdp"})
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from autoshard.errors import AnnotationError, InfeasibleError
from autoshard.placement import Shard, ShardingSpec
from autoshard.problem.build import BuiltProblem
from autoshard.problem.graph import NodeInfo
from autoshard.search.problem import Edge
from autoshard.strategies import OpStrategy

__all__ = [
    "KINDS",
    "batch_dims",
    "budget_refusal",
    "forbid_gathers",
    "forbidden_kinds",
    "kind_masks",
    "no_gather",
]

KINDS = ("dp", "tp", "fsdp")
"""Kinds ``allow=`` / ``forbid=`` understand (module docstring)."""

Output = tuple[str, int]  # (node name, output index)


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


def kind_masks(
    kinds: frozenset[str], infos: Mapping[str, NodeInfo], strategies: Mapping[str, Sequence[OpStrategy]],
    template: Mapping[str, str],
) -> dict[str, np.ndarray]:  # fmt: skip
    """Node masks for ``dp`` and ``tp`` (``fsdp`` constrains edges: :func:`forbid_gathers`)."""
    masks: dict[str, np.ndarray] = {}
    params = {i.name for i in infos.values() if i.kind == "parameter"}
    batch = batch_dims(infos, strategies, template) if "dp" in kinds else {}
    for info in infos.values():
        if template[info.name] != info.name:
            continue
        options = strategies[info.name]
        keep = np.ones(len(options), dtype=bool)
        dims = [batch.get((info.name, j), frozenset()) for j in range(len(info.outputs))]
        if any(dims):
            keep &= [
                not any(_splits(out, d) for out, d in zip(s.outputs, dims, strict=False)) for s in options
            ]
        if "tp" in kinds and info.kind == "op" and params & set(info.inputs):
            ks = [k for k, src in enumerate(info.inputs) if src in params]
            keep &= [
                not any(isinstance(p, Shard) for k in ks for p in _placements(s.inputs[k])) for s in options
            ]
        if not keep.all():
            masks[info.name] = keep
    return masks


def batch_dims(
    infos: Mapping[str, NodeInfo], strategies: Mapping[str, Sequence[OpStrategy]], template: Mapping[str, str]
) -> dict[Output, frozenset[int]]:
    """The dims of every node output that carry the batch (module docstring), to a fixed point."""
    dims: dict[Output, set[int]] = defaultdict(set)
    for info in infos.values():
        meta = info.outputs[0] if info.outputs else None
        if info.kind == "user_input" and meta is not None and len(meta.shape) > 0:
            dims[(info.name, 0)].add(0)
    ops = [i for i in infos.values() if i.kind == "op"]
    changed = True
    while changed:
        changed = False
        for info in ops:  # forward: a strategy carries an input's batch split to an output dim
            for s, axis in _pairs(strategies[template[info.name]], len(info.inputs)):
                if any(_in_batch(s, k, axis, info, dims) for k in range(len(info.inputs))):
                    for j, out in enumerate(s.outputs):
                        changed |= _add(dims, (info.name, j), _shard_dim(out, axis))
        for info in reversed(ops):  # backward: a consumer splits this input to split its own batch
            for s, axis in _pairs(strategies[template[info.name]], len(info.inputs)):
                if not any(_shard_dim(out, axis) in dims[(info.name, j)] for j, out in enumerate(s.outputs)):
                    continue
                for k, (src, which) in enumerate(zip(info.inputs, info.input_outputs, strict=True)):
                    if infos[src].kind in ("op", "user_input"):
                        changed |= _add(dims, (src, which), _shard_dim(s.inputs[k], axis))
    return {key: frozenset(value) for key, value in dims.items() if value}


def _pairs(options: Sequence[OpStrategy], arity: int) -> list[tuple[OpStrategy, int]]:
    return [(s, a) for s in options if len(s.inputs) == arity for a in range(_ndim(s))]


def _ndim(s: OpStrategy) -> int:
    return next((spec.mesh_ndim for spec in (*s.inputs, *s.outputs) if spec is not None), 0)


def _in_batch(s: OpStrategy, k: int, axis: int, info: NodeInfo, dims: Mapping[Output, set[int]]) -> bool:
    dim = _shard_dim(s.inputs[k], axis)
    return dim is not None and dim in dims.get((info.inputs[k], info.input_outputs[k]), ())


def _add(dims: dict[Output, set[int]], key: Output, dim: int | None) -> bool:
    if dim is None or dim in dims[key]:
        return False
    dims[key].add(dim)
    return True


def _shard_dim(spec: ShardingSpec | None, axis: int) -> int | None:
    placement = spec.placements[axis] if spec is not None else None
    return placement.dim if isinstance(placement, Shard) else None


def _splits(spec: ShardingSpec | None, dims: frozenset[int]) -> bool:
    return any(isinstance(p, Shard) and p.dim in dims for p in _placements(spec))


def _placements(spec: ShardingSpec | None) -> tuple[Any, ...]:
    return tuple(spec.placements) if spec is not None else ()


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
    out: no "recompute activations" once none, selective and full were all tried (or for inference), no
    "allow fsdp" unless fsdp was forbidden, no "relax annotations" without annotations."""
    text = " ".join(str(error).split())
    what, sep, fix = text.partition(" Fix: ")
    done = [f"tried recomputation {', '.join(tried)} of every repeated block"] if training else []
    done += [f"{', '.join(sorted(kinds))} forbidden"] if kinds else []
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
        f"allow {kind}" for kind in ("fsdp", "tp") if kind in kinds and f"allow {kind}" not in items
    ]
    advice = (
        items[0] if len(items) == 1 else f"{', '.join(items[:-1])}{',' * (len(items) > 2)} or {items[-1]}"
    )
    return InfeasibleError(f"{what.rstrip('.')}{said}. Fix: {advice}.")
