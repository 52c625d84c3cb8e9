"""User annotations: pin the strategy of a few parameters or operators; the planner does the rest.

An annotation maps a *target* to a *choice*:

- target: a module path (``"fc1"``, ``"model.layers.0.mlp.down_proj"``), a parameter or buffer name
  (``"fc1.weight"``), a model input by its argument name (``"input_ids"``), or a glob over any of them
  (``"*.mlp.down_proj"``).  In a model whose repeated layers are solved once, an
  annotation on any layer applies to all of them (they share one decision).
- choice, one of:
  - a named pattern for a linear-like module: ``"column"`` (weight split over output features, ``S(0)``),
    ``"row"`` (over input features, ``S(1)``; the two swap for GPT-2's ``Conv1D``, stored ``[in, out]``),
    ``"vocab"`` (an embedding split over the vocabulary, ``S(0)``), ``"replicate"`` (weights replicated).
    A pattern names what the weight is on *every* mesh axis that splits it: on the tensor-parallel axis (the last,
    or the one written ``"column@0"``) the weight is split that way, stored and used (``column``: output split on
    features; ``row``: a partial sum); on every other axis it is split the same way or not at all, stored and used
    (``column`` is never split on the input dim anywhere; ``replicate`` is replicated on every axis).  A placement
    pin on the weight itself decides its storage on the other axes (FSDP gathers before use: ``o_proj=row`` with
    ``o_proj.weight=(S(0), S(1))``).  Activations stay free for the planner on the other axes;
  - placements of a parameter: ``("S(0)",)``, ``"(R, S(1))"``, or a :class:`~autoshard.placement.ShardingSpec`;
  - ``"ring"`` (or ``"ring@1"``) for an attention module: its ``scaled_dot_product_attention`` runs context
    parallel, the sequence split over the last mesh axis (or the one named) with K/V travelling round it;
  - a MindSpore-style strategy tuple for the op a module runs, one split tuple per tensor input in the op's
    own order: ``((2, 1), (1, 4))`` splits the input's dim 0 in 2 and the weight's dim 1 in 4 (``aten.linear``
    takes input, weight ``[out, in]``, bias; GPT-2's ``aten.addmm`` bias, input, weight ``[in, out]``).

Output: ``dict[node name, bool mask over that node's strategies]`` for the solver.  Errors name the annotation,
what it matched (or that it matched nothing, with close candidates) and how to fix it.

Example::

    autoshard.plan(model, cluster, (x,), annotations={"fc1": "column", "fc2": "row"})
"""

from __future__ import annotations

import dataclasses
import fnmatch
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from autoshard import annotation_ops as aops
from autoshard.annotation_errors import no_attention, no_match
from autoshard.errors import AnnotationError, ShardingError
from autoshard.placement import Partial, Replicate, Shard, ShardingSpec, from_strategy_tuple
from autoshard.problem.build import BuiltProblem
from autoshard.problem.graph import NodeInfo
from autoshard.steering import KINDS, forbid_gathers, forbidden_kinds, kind_masks, needed_kinds, no_gather
from autoshard.strategies import OpStrategy

_PATTERNS = aops.PATTERNS
__all__ = [
    "KINDS",
    "Annotation",
    "forbidden_kinds",
    "kind_masks",
    "no_gather",
    "pin_problem",
    "resolve_annotations",
]


@dataclass(frozen=True, slots=True)
class Annotation:
    target: str
    choice: Any


def resolve_annotations(
    annotations: Mapping[str, Any] | Sequence[Annotation] | None,
    infos: Mapping[str, NodeInfo],
    strategies: Mapping[str, Sequence[OpStrategy]],
    template: Mapping[str, str],
    mesh_shape: tuple[int, ...],
    block_prefix: str | None = None,
    block_first: int = 0,
) -> dict[str, np.ndarray]:
    """Masks of allowed strategies for every node an annotation pins."""
    masks, _ = _resolve_all(annotations, infos, strategies, template, mesh_shape, block_prefix, block_first)
    return masks


def _resolve_all(
    annotations, infos, strategies, template, mesh_shape, block_prefix, block_first
) -> tuple[dict[str, np.ndarray], dict[str, Annotation]]:
    """The masks, and the first annotation that pins each node (to name it in a conflict)."""
    if not annotations:
        return {}, {}
    items = (
        [Annotation(k, v) for k, v in annotations.items()]
        if isinstance(annotations, Mapping)
        else list(annotations)
    )
    masks: dict[str, np.ndarray] = {}
    owner: dict[str, Annotation] = {}
    # Parameters whose storage a placement pin decides: a layout pin then binds how the op uses the weight on
    # every axis and its storage on the named axis only (FSDP gathers before use: torchtitan's 2-D layout
    # pins ``o_proj=row`` with ``o_proj.weight=(S(0), S(1))``).
    stored = frozenset(
        node
        for ann in items
        if _is_placement(ann)
        for node in _resolve_one(ann, infos, strategies, template, mesh_shape, block_prefix, block_first)
    )
    for ann in items:
        for node, mask in _resolve_one(
            ann, infos, strategies, template, mesh_shape, block_prefix, block_first, stored
        ).items():
            masks[node] = mask if node not in masks else masks[node] & mask
            if not masks[node].any():
                first = owner[node]
                raise AnnotationError(
                    f"annotation {ann.target!r} = {ann.choice!r} conflicts with annotation {first.target!r} = "
                    f"{first.choice!r}: no strategy of {_where(infos[node])} satisfies both; drop one"
                )
            owner.setdefault(node, ann)
    return masks, owner


def _where(info: NodeInfo) -> str:
    """``fc1.weight (parameter)``, ``fc1 (linear)``: a node as the user knows it."""
    return f"{info.fqn or info.module or info.name} ({info.op if info.kind == 'op' else info.kind.replace('_', ' ')})"


_TUPLE_OPS = frozenset(
    {"linear", "mm", "matmul", "bmm", "addmm", "embedding", "conv1d", "conv2d", "conv3d", "convolution",
     "_grouped_mm", "grouped_mm", "grouped_mm_fallback", "expert_mlp", "routed_experts"}
)  # fmt: skip


def _normalise_target(target: str, block_prefix: str | None, first: int = 0) -> str:
    # layers beyond the captured two share the first block's decision (layers before the run keep theirs)
    if block_prefix and "*" not in target:
        m = re.match(rf"^{re.escape(block_prefix)}\.(\d+)", target)
        if m and int(m.group(1)) >= first:
            target = f"{block_prefix}.{first}" + target[m.end() :]
    return target


def _matches(pattern: str, name: str) -> bool:
    return bool(name) and (fnmatch.fnmatchcase(name, pattern) or name == pattern)


def _is_placement(ann: Annotation) -> bool:
    """Whether ``ann`` pins a tensor's placements (not a layout pattern, a ring or an op's operands)."""
    if isinstance(ann.choice, str):
        return ann.choice.split("@")[0] not in (*_PATTERNS, "ring")
    return not (isinstance(ann.choice, tuple) and ann.choice and isinstance(ann.choice[0], tuple))


def _resolve_one(
    ann, infos, strategies, template, mesh_shape, block_prefix, block_first=0, stored=frozenset()
) -> dict[str, np.ndarray]:
    target = _normalise_target(ann.target, block_prefix, block_first)
    # a node of a further run of identical blocks (problem/runs.py) pins the decision its run shares
    decides = [i for i in infos.values() if template[i.name] == i.name or i.block is None]
    params = [i for i in decides if i.kind == "parameter"]
    leaves = [i for i in decides if i.kind != "op"]
    by_param = _shared([i for i in leaves if _matches(target, i.fqn or i.name)], infos, template)
    by_module = _shared([i for i in params if _matches(target, i.fqn.rsplit(".", 1)[0])], infos, template)
    if isinstance(ann.choice, tuple) and ann.choice and isinstance(ann.choice[0], tuple):
        ops = [i for i in decides if i.kind == "op" and _matches(target, i.module)]
        ops = [i for i in _shared(ops, infos, template) if i.op in _TUPLE_OPS]
        if not ops:
            raise AnnotationError(
                no_match(
                    ann,
                    infos,
                    "operator (linear, matmul, embedding, convolution, grouped matmul) in a module",
                )
            )
        return {i.name: _tuple_mask(ann, i, infos, strategies[i.name], mesh_shape) for i in ops}
    if isinstance(ann.choice, str) and ann.choice.split("@")[0] == "ring":
        return _ring_masks(ann, infos, strategies, template, mesh_shape, target)
    if isinstance(ann.choice, str) and ann.choice.split("@")[0] in _PATTERNS:
        if not by_module:
            raise AnnotationError(no_match(ann, infos, "module with parameters"))
        flip = aops.stored_transposed(infos)  # Conv1D's weights: [in, out]
        pinned = {i.name: _pattern_mask(ann, i, strategies[i.name], mesh_shape, i.name in stored, i.name in flip)
                  for i in by_module}  # fmt: skip
        return pinned | _computation_masks(ann, by_module, infos, strategies, template, mesh_shape)
    if not by_param:
        raise AnnotationError(no_match(ann, infos, "parameter, buffer or input"))
    spec = _parse_spec(ann, mesh_shape)
    return {i.name: _spec_mask(ann, i, strategies[i.name], spec) for i in by_param}


def _shared(nodes, infos, template) -> list:
    """The solver variable of each node, once each, in order."""
    return list({template[i.name]: infos[template[i.name]] for i in nodes}.values())


def _ring_masks(ann, infos, strategies, template, mesh_shape, target: str) -> dict[str, np.ndarray]:
    """``"ring@axis"``: the attention ops of the matching modules ring over ``axis`` (context parallel)."""
    from autoshard.problem.context import ring_axis_of

    _, _, axis_text = str(ann.choice).partition("@")
    axis = int(axis_text) if axis_text else len(mesh_shape) - 1
    ops = [
        i
        for i in infos.values()
        if i.kind == "op" and template[i.name] == i.name and "scaled_dot_product_attention" in i.target
        and _matches(target, i.module)
    ]  # fmt: skip
    if not ops:
        raise AnnotationError(no_attention(ann, infos))
    masks = {
        i.name: np.array([ring_axis_of(infos, i, s) == axis for s in strategies[i.name]], dtype=bool)
        for i in ops
    }
    if not all(m.any() for m in masks.values()):
        raise AnnotationError(
            f"annotation {ann.target!r} = {ann.choice!r}: the attention cannot ring over axis {axis} (size "
            f"{mesh_shape[axis] if axis < len(mesh_shape) else '?'}): the sequence must divide by it"
        )
    return masks


def _parse_spec(ann: Annotation, mesh_shape: tuple[int, ...]) -> ShardingSpec:
    choice = ann.choice
    try:
        spec = choice if isinstance(choice, ShardingSpec) else ShardingSpec.parse(choice)
    except (ShardingError, TypeError) as e:
        raise AnnotationError(
            f"annotation {ann.target!r}: cannot read {choice!r} as placements ({e}); write e.g. ('S(0)',) or "
            f"a pattern {sorted(_PATTERNS)}"
        ) from e
    if spec.mesh_ndim != len(mesh_shape):
        raise AnnotationError(
            f"annotation {ann.target!r}: {spec} has {spec.mesh_ndim} placements but the mesh {mesh_shape} has "
            f"{len(mesh_shape)} axes; give one placement per axis"
        )
    return spec


def _spec_mask(ann, info: NodeInfo, options: Sequence[OpStrategy], spec: ShardingSpec) -> np.ndarray:
    mask = np.array([s.outputs[0] == spec for s in options], dtype=bool)
    if not mask.any():
        raise AnnotationError(
            f"annotation {ann.target!r}: {info.fqn or info.name} cannot be placed {spec} (shape "
            f"{info.outputs[0].shape if info.outputs[0] else '?'}; a sharded dim must divide by its axis size)"
        )
    return mask


def _pattern_mask(
    ann, info: NodeInfo, options: Sequence[OpStrategy], mesh_shape, stored: bool = False, flip: bool = False
) -> np.ndarray:
    """The weight's storage under a layout pin: the named axis split as pinned; every other axis split the
    same way or not at all, unless a placement pin decides the storage (``stored``: then those are free).
    A weight its op reads ``[in, out]`` (``flip``: GPT-2's Conv1D) swaps the column and row dims."""
    name, _, axis_text = str(ann.choice).partition("@")
    if axis_text and not (axis_text.isdigit() and int(axis_text) < len(mesh_shape)):
        raise AnnotationError(
            f"annotation {ann.target!r}: axis {axis_text!r} in {ann.choice!r} is not a mesh axis of "
            f"{tuple(mesh_shape)}; use "
            + (
                f"{name}@0 .. {name}@{len(mesh_shape) - 1}"
                if len(mesh_shape) > 1
                else f"{name} (or {name}@0)"
            )
        )
    axis = int(axis_text) if axis_text else len(mesh_shape) - 1
    want = aops.pattern_placement(name, flip)
    is_bias = _is_bias(info)
    if is_bias and name != "column":
        want = Replicate()  # a row-split (or replicated) linear's bias is whole on every device
    if is_bias and name == "column":
        want = Shard(0)
    elsewhere = (want, Replicate())  # the other axes: split the same way, or not at all
    mask = np.array(
        [
            s.outputs[0] is not None
            and all(
                p == want if a == axis else (stored or p in elsewhere)
                for a, p in enumerate(s.outputs[0].placements)
            )
            for s in options
        ],
        dtype=bool,
    )
    if not mask.any():
        raise AnnotationError(
            f"annotation {ann.target!r} = {ann.choice!r}: {info.fqn} of shape "
            f"{info.outputs[0].shape if info.outputs[0] else '?'} cannot be split that way on axis {axis} "
            f"(size {mesh_shape[axis]}); check divisibility or choose another pattern"
        )
    return mask


def _computation_masks(ann, params, infos, strategies, template, mesh_shape) -> dict[str, np.ndarray]:
    """Pin how the module's ops *use* its weight, not only where the weight is stored: ``column`` runs on
    the local ``S(0)`` shard with the output split on its last (feature) dim, ``row`` on the local ``S(1)``
    shard with a Partial sum out, ``vocab`` on the local rows of the table, ``replicate`` on the whole weight
    (column and row dims swapped where the op reads the weight ``[in, out]``: Conv1D's ``addmm``).
    Together with the weight's own pin, no gather can sit between the weight and its op on that axis."""
    name, _, axis_text = str(ann.choice).partition("@")
    axis = int(axis_text) if axis_text else len(mesh_shape) - 1
    weights = {i.name for i in params if not _is_bias(i)}
    masks: dict[str, np.ndarray] = {}
    for op in infos.values():
        if op.kind != "op" or template[op.name] != op.name or not weights & set(op.inputs):
            continue
        k = next(k for k, src in enumerate(op.inputs) if src in weights)
        ndim = len(op.outputs[0].shape) if op.outputs and op.outputs[0] is not None else 0
        want = aops.pattern_placement(name, aops.reads_transposed(op, k, infos))

        def fits(s: OpStrategy, k: int = k, ndim: int = ndim, want=want) -> bool:
            used, out = _placements(s.inputs[k]), s.outputs[0]
            if any(p not in (want, Replicate()) for p in used):  # never split another way
                return False
            if name == "column":
                return used[axis] == want and out is not None and out.placements[axis] == Shard(ndim - 1)
            if name == "row":
                return used[axis] == want and out is not None and isinstance(out.placements[axis], Partial)
            return used[axis] == want

        mask = np.array([fits(s) for s in strategies[op.name]], dtype=bool)
        if not mask.any():
            raise AnnotationError(
                f"annotation {ann.target!r} = {ann.choice!r}: {op.target} in {op.module or '<root>'} has no "
                f"{name}-parallel strategy on axis {axis} (size {mesh_shape[axis]}); check that the split dims "
                "divide by the axis size, or pin the weight's placements instead"
            )
        masks[op.name] = mask
    return masks


def _is_bias(info: NodeInfo) -> bool:
    return info.fqn.endswith("bias") or (info.outputs[0] is not None and len(info.outputs[0].shape) == 1)


def _tuple_mask(ann, info: NodeInfo, infos, options: Sequence[OpStrategy], mesh) -> np.ndarray:
    """The strategies whose inputs, in the op's own order (``addmm``: bias, input, weight), split as told."""
    aops.check_tuples(ann, info, infos)
    try:
        specs = [from_strategy_tuple(t, mesh) for t in ann.choice]
    except ShardingError as e:
        raise AnnotationError(f"annotation {ann.target!r}: {e}") from e
    mask = np.array([all(s.inputs[k] == spec for k, spec in enumerate(specs)) for s in options], dtype=bool)
    if not mask.any():
        valid = {t: 0 for s in options if (t := aops.split_tuples(s.inputs, info, infos, mesh))}
        raise AnnotationError(
            f"annotation {ann.target!r} = {ann.choice!r} ({', '.join(map(str, specs))}) is not a valid strategy "
            f"of {info.target} at {info.module}, whose tensors are ({', '.join(aops.operands(info, infos))}) in "
            f"that order; valid ones include {', '.join(map(str, list(valid)[:6]))}"
        )
    return mask


def _placements(spec: ShardingSpec | None) -> tuple[Any, ...]:
    return tuple(spec.placements) if spec is not None else ()


def pin_problem(
    built: BuiltProblem,
    annotations: Mapping[str, Any] | None,
    kinds: frozenset[str] = frozenset(),
    block_prefix: str | None = None,
    block_first: int = 0,
) -> BuiltProblem:
    """``built`` with the annotations' masks and the forbidden kinds folded into its search problem."""
    infos, strategies, template = built.infos, built.strategies, built.template
    mesh = built.cluster.mesh_shape
    masks, owner = _resolve_all(annotations, infos, strategies, template, mesh, block_prefix, block_first)
    for name, mask in kind_masks(kinds, infos, strategies, template).items():
        both = mask & masks[name] if name in masks else mask
        if not both.any():
            steer = f"forbidding {', '.join(k for k in KINDS if k in kinds)}"
            wanted = masks.get(name, np.ones(len(mask), dtype=bool))
            allow = " or ".join(needed_kinds(kinds, infos[name], infos, strategies, template, wanted))
            if name in owner:
                pin = owner[name]
                raise AnnotationError(
                    f"annotation {pin.target!r} = {pin.choice!r} contradicts {steer}: no strategy of "
                    f"{_where(infos[name])} satisfies both; drop the annotation or allow {allow}"
                )
            raise AnnotationError(f"{steer} leaves {_where(infos[name])} no strategy: allow {allow}")
        masks[name] = both
    fanouts = (None,) * (built.problem.num_nodes - len(built.variables))  # fan-out, gather nodes follow
    allowed = tuple(masks.get(v) for v in built.variables) + fanouts
    edges = built.problem.edges
    if "fsdp" in kinds:
        edges = forbid_gathers(built)
    problem = dataclasses.replace(built.problem, allowed=allowed, edges=edges)
    return dataclasses.replace(built, problem=problem)
