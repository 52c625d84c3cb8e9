"""Which dims of every tensor carry the batch, the sequence or the experts (what :mod:`autoshard.steering`
reads to say which kind of parallelism a split is).

Input: a built problem's node records and strategies.  Output: ``{(node, output index): {role: dims}}`` for
the roles ``"batch"``, ``"sequence"`` and ``"experts"`` (:func:`carried_dims`).  A dim of no role is a
*feature* dim: a weight's dims, attention heads, the hidden and FFN dims, the head dim, the vocabulary.

Seeds, then followed through the graph by the strategies themselves, to a fixed point:

- ``batch``: dim 0 of every user input;
- ``sequence``: dim 1 of every integer user input of two or more dims (token ids, labels, positions) and
  of every 3-D user input (``(B, S, H)`` embeddings, as the report reads them; not ``(B, H)`` features nor
  ``(B, C, H, W)`` images), and
  the sequence dims of every attention op (dim -2 of its q, k, v and output, the last two of its mask), so
  a model fed embeddings has a sequence too;
- ``experts``: dim 0 of every 3-D operand of a grouped matmul or fused expert MLP (the stacked expert
  weights).

Forward: an output dim carries a role when some strategy splits an input's dim of that role and that output
dim on the same mesh axis, every other input it splits there having that role or none (``(B*S, H)`` after a
flatten carries the batch in dim 0; ``(B, heads, S, d)`` after a transpose carries the sequence in dim 2).
Backward: an input dim carries a role when a consumer's strategy splits it to split its own output's dim
of that role, the inputs it splits there agreeing (an attention mask or rotary table built from shapes
alone; an expert weight read through a transpose).

Example::

    dims = carried_dims(built.infos, built.strategies, built.template)
    dims[("input_ids", 0)]        # {"batch": frozenset({0}), "sequence": frozenset({1})}
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

from autoshard.placement import Shard, ShardingSpec
from autoshard.problem.graph import NodeInfo
from autoshard.strategies import OpStrategy

__all__ = ["ATTENTION", "EXPERT_OPS", "ROLES", "Output", "carried_dims", "is_attention"]

ROLES = ("batch", "sequence", "experts")
EXPERT_OPS = frozenset({"_grouped_mm", "grouped_mm", "grouped_mm_fallback", "expert_mlp", "routed_experts"})
ATTENTION = ("scaled_dot_product", "flash_attention", "efficient_attention", "cudnn_attention")

Output = tuple[str, int]  # (node name, output index)
Dims = dict[Output, dict[str, set[int]]]


def is_attention(info: NodeInfo) -> bool:
    """An attention op (its own sequence split is context parallelism)."""
    return info.kind == "op" and any(a in info.target or a in info.op for a in ATTENTION)


def carried_dims(
    infos: Mapping[str, NodeInfo], strategies: Mapping[str, Sequence[OpStrategy]], template: Mapping[str, str]
) -> dict[Output, dict[str, frozenset[int]]]:
    """The dims of every node output that carry each role (module docstring), to a fixed point."""
    dims: Dims = defaultdict(lambda: defaultdict(set))
    _seed(infos, dims)
    ops = [i for i in infos.values() if i.kind == "op"]
    patterns = _all_patterns(ops, strategies, template)
    changed = True
    while changed:
        changed = False
        for info in ops:  # forward: a strategy carries its inputs' role to the output dims it splits
            for ins, outs in patterns[info.name]:
                for role in _agreed(info, ins, dims):
                    for j, d in enumerate(outs):
                        changed |= _add(dims, (info.name, j), role, d)
        for info in reversed(ops):  # backward: a consumer splits an input to split its own output's role
            for ins, outs in patterns[info.name]:
                agreed = _agreed(info, ins, dims, every=True)
                for role in ROLES:
                    if role not in agreed or not any(
                        _in(d, dims, (info.name, j), role) for j, d in enumerate(outs)
                    ):
                        continue
                    for k, d in enumerate(ins):
                        if infos[info.inputs[k]].kind != "constant":
                            changed |= _add(dims, _src(info, k), role, d)
    return {
        key: {role: frozenset(ds) for role, ds in roles.items() if ds}
        for key, roles in dims.items()
        if any(roles.values())
    }


def _agreed(info: NodeInfo, ins: tuple[int | None, ...], dims: Dims, every: bool = False) -> set[str]:
    """The roles every input split on this axis that has a role at all agrees on.  A split of the tokens by
    batch and of the expert weights by expert on one axis carries neither role on: no role crosses from a
    weight to the activations or back.  ``every``: with no role among the inputs, every role (backward
    may then name them)."""
    known = [r for r in (_roles(dims, _src(info, k), d) for k, d in enumerate(ins) if d is not None) if r]
    if not known:
        return set(ROLES) if every else set()
    return set.intersection(*known)


def _roles(dims: Dims, key: Output, dim: int) -> set[str]:
    roles = dims.get(key)
    return {role for role, ds in roles.items() if dim in ds} if roles else set()


def _seed(infos: Mapping[str, NodeInfo], dims: Dims) -> None:
    for info in infos.values():
        meta = info.outputs[0] if info.outputs else None
        if info.kind == "user_input" and meta is not None and len(meta.shape) > 0:
            dims[(info.name, 0)]["batch"].add(0)
            if (len(meta.shape) >= 2 and meta.dtype.startswith(("int", "uint"))) or len(meta.shape) == 3:
                dims[(info.name, 0)]["sequence"].add(1)
        if is_attention(info):
            for k in range(min(3, len(info.inputs))):  # q, k, v: (..., S, E)
                shape = _shape(infos, _src(info, k))
                if len(shape) >= 2:
                    dims[_src(info, k)]["sequence"].add(len(shape) - 2)
            if len(info.inputs) > 3:  # the mask: (..., L, S)
                shape = _shape(infos, _src(info, 3))
                dims[_src(info, 3)]["sequence"].update(
                    d for d in range(len(shape) - 2, len(shape)) if shape[d] > 1
                )
            out = info.outputs[0] if info.outputs else None
            if out is not None and len(out.shape) >= 2:
                dims[(info.name, 0)]["sequence"].add(len(out.shape) - 2)
        if info.kind == "op" and info.op in EXPERT_OPS:
            for k in range(len(info.inputs)):
                if len(_shape(infos, _src(info, k))) == 3:
                    dims[_src(info, k)]["experts"].add(0)


def _shape(infos: Mapping[str, NodeInfo], key: Output) -> tuple[int, ...]:
    outputs = infos[key[0]].outputs
    meta = outputs[key[1]] if key[1] < len(outputs) else None
    return tuple(meta.shape) if meta is not None else ()


def _src(info: NodeInfo, k: int) -> Output:
    return info.inputs[k], info.input_outputs[k]


Pattern = tuple[tuple[int | None, ...], tuple[int | None, ...]]


def _all_patterns(
    ops: Sequence[NodeInfo], strategies: Mapping[str, Sequence[OpStrategy]], template: Mapping[str, str]
) -> dict[str, set[Pattern]]:
    """Each op's patterns, read once per template (repeated layers share their template's strategies)."""
    shared: dict[tuple[str, int], set[Pattern]] = {}
    for i in ops:
        key = (template[i.name], len(i.inputs))
        if key not in shared:
            shared[key] = _patterns(strategies[key[0]], key[1])
    return {i.name: shared[(template[i.name], len(i.inputs))] for i in ops}


def _patterns(options: Sequence[OpStrategy], arity: int) -> set[Pattern]:
    """The dims one mesh axis of some strategy splits, per input and per output (``None``: not split), once
    each: a strategy is a product of per-axis choices, so far fewer patterns than strategies."""
    out: set[Pattern] = set()
    for s in options:
        if len(s.inputs) != arity:
            continue
        for a in range(_ndim(s)):
            ins, outs = tuple(_shard_dim(x, a) for x in s.inputs), tuple(_shard_dim(x, a) for x in s.outputs)
            if any(d is not None for d in (*ins, *outs)):
                out.add((ins, outs))
    return out


def _ndim(s: OpStrategy) -> int:
    return next((spec.mesh_ndim for spec in (*s.inputs, *s.outputs) if spec is not None), 0)


def _in(dim: int | None, dims: Dims, key: Output, role: str) -> bool:
    return dim is not None and key in dims and dim in dims[key][role]


def _add(dims: Dims, key: Output, role: str, dim: int | None) -> bool:
    if dim is None or dim in dims[key][role]:
        return False
    dims[key][role].add(dim)
    return True


def _shard_dim(spec: ShardingSpec | None, axis: int) -> int | None:
    placement = spec.placements[axis] if spec is not None else None
    return placement.dim if isinstance(placement, Shard) else None
