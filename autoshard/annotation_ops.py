"""How an annotation reads the op it pins: which dim of a weight a layout pattern splits, and which tensor
each split tuple of a strategy tuple describes.

A weight's layout depends on the op that uses it, not on the module: ``nn.Linear`` stores ``[out, in]`` and
runs ``linear(x, w, b)``; Hugging Face's ``Conv1D`` (GPT-2's ``c_attn``, ``c_proj``, ``c_fc``) stores
``[in, out]`` and runs ``addmm(b, x, w)``.  So ``"column"`` (split the output features) is ``S(0)`` of a
linear's weight and ``S(1)`` of a Conv1D's; ``"row"`` (split the input features, a Partial sum out) is
``S(1)`` and ``S(0)``.  The bias follows the output features either way (``S(0)`` under column, whole
under row, added once after the reduce).

A strategy tuple gives one split tuple per tensor input *in the op's own order*: ``aten.linear`` takes
``(input, weight [out, in], bias)``, ``aten.addmm`` ``(bias, input, weight [in, out])``.
:func:`operands` names them for error messages.

Example::

    pattern_placement("column", infos[name], 2, infos)   # Shard(1): addmm(bias, x, w) reads w as [in, out]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from autoshard.errors import AnnotationError
from autoshard.placement import Placement, Replicate, Shard, ShardingSpec
from autoshard.problem.graph import NodeInfo

__all__ = [
    "PATTERNS",
    "check_tuples",
    "operands",
    "pattern_placement",
    "reads_transposed",
    "split_tuples",
    "stored_transposed",
]

PATTERNS: dict[str, Placement] = {
    "column": Shard(0),
    "row": Shard(1),
    "vocab": Shard(0),
    "replicate": Replicate(),
}
"""What each layout pattern splits of a weight stored ``[out, in]`` (``nn.Linear``, ``nn.Embedding``)."""

TRANSPOSED = {"addmm": 2, "mm": 1, "matmul": 1}
"""Ops that read a weight as ``x @ w`` (``[in, out]``): the operand position of that weight."""


def reads_transposed(op: NodeInfo, position: int, infos: Mapping[str, NodeInfo]) -> bool:
    """Whether ``op`` reads its operand ``position`` as a 2-D ``[in, out]`` matrix (``x @ w``)."""
    if TRANSPOSED.get(op.op) != position:
        return False
    meta = infos[op.inputs[position]].outputs[op.input_outputs[position]]
    return meta is not None and len(meta.shape) == 2


def stored_transposed(infos: Mapping[str, NodeInfo]) -> frozenset[str]:
    """The weights (and other inputs) some op reads as ``[in, out]`` (Conv1D): layout patterns swap dims."""
    return frozenset(
        src
        for op in infos.values()
        if op.kind == "op" and op.op in TRANSPOSED
        for k, src in enumerate(op.inputs)
        if reads_transposed(op, k, infos)
    )


def pattern_placement(name: str, transposed: bool) -> Placement:
    """What pattern ``name`` splits of a weight, ``transposed`` when it is read ``[in, out]``."""
    if transposed and name in ("column", "row"):
        return Shard(1) if name == "column" else Shard(0)
    return PATTERNS[name]


def operands(info: NodeInfo, infos: Mapping[str, NodeInfo]) -> list[str]:
    """The op's tensor inputs in its own order, named and shaped: ``["bias (96,)", "input (32, 32)", ...]``."""
    activations = sum(infos[src].kind not in ("parameter", "buffer") for src in info.inputs)
    names = []
    for k, src in enumerate(info.inputs):
        node = infos[src]
        if node.kind in ("parameter", "buffer"):
            name = node.fqn.rsplit(".", 1)[-1]
        else:
            name = "input" if activations == 1 else f"input {k}"
        meta = node.outputs[info.input_outputs[k]] if info.input_outputs[k] < len(node.outputs) else None
        names.append(f"{name} {tuple(meta.shape) if meta is not None else '?'}")
    return names


def check_tuples(ann: Any, info: NodeInfo, infos: Mapping[str, NodeInfo]) -> None:
    """Refuse split tuples that cannot be the op's operands: more tuples than tensor inputs, or a tuple
    longer than its operand's rank (a tuple numbered from the wrong end, such as ``addmm``'s input and weight
    written first when its bias comes first).  A shorter tuple is left to the strategy match, as before: pins
    written for a 3-D activation keep matching where the graph carries an extra unit dim (DeepSeek's MLA)."""
    names, ranks = operands(info, infos), _ranks(info, infos)
    tuples = list(ann.choice)
    wrong = len(tuples) > len(names) or any(
        rank is not None and len(t) > rank for t, rank in zip(tuples, ranks, strict=False)
    )
    if wrong:
        raise AnnotationError(
            f"annotation {ann.target!r} = {ann.choice!r}: {info.target} at {info.module} takes its tensors "
            f"in its own order ({', '.join(names)}); give one split tuple per tensor in that order, one entry "
            "per dim"
        )


def _ranks(info: NodeInfo, infos: Mapping[str, NodeInfo]) -> list[int | None]:
    metas = [infos[src].outputs[info.input_outputs[k]] for k, src in enumerate(info.inputs)]
    return [len(m.shape) if m is not None else None for m in metas]


def split_tuples(
    specs: Sequence[ShardingSpec | None], info: NodeInfo, infos: Mapping[str, NodeInfo], mesh: Sequence[int]
) -> tuple[tuple[int, ...], ...] | None:
    """A strategy's inputs as split tuples (``((1,), (1, 1), (1, 2))``), or ``None`` where one has no
    tuple (a Partial input, or one whose layout is free)."""
    out = []
    for spec, rank in zip(specs, _ranks(info, infos), strict=False):
        if (
            spec is None
            or rank is None
            or not all(isinstance(p, (Shard, Replicate)) for p in spec.placements)
        ):
            return None
        splits = [1] * rank
        for a, p in enumerate(spec.placements):
            if isinstance(p, Shard):
                splits[p.dim] *= mesh[a]
        out.append(tuple(splits))
    return tuple(out)
