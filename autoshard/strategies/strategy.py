"""The strategy record and its expansion from one mesh axis to the whole mesh.

A rule describes what ONE mesh axis may do to an op as a list of :class:`AxisChoice` (one placement per
operand *role* and per output, plus whether the choice splits the op's work).  :func:`expand` takes the
product of those choices over every mesh axis (outer axis first), maps roles onto ``node.all_input_nodes``
and keeps only strategies that make sense:

- every shard divides (a dim of size 1 cannot be sharded; several axes on one dim multiply);
- ``Partial`` only on floating tensors;
- a node feeding two roles (``mul(x, x)``) gets one spec, so choices that need two specs of it are dropped;
- duplicates (same input and output specs) are dropped, the first kept.

It then derives the backward claim generically, per mesh axis (never per rule):

======================  ==============================  =============
forward input           op's outputs on that axis       input grad
======================  ==============================  =============
``S(d)``                any                             ``S(d)``
``P``                   any                             ``R``
``R``                   some output not ``R``           ``P``
``R``                   all outputs ``R``               ``R``
======================  ==============================  =============

Integer/bool inputs, inputs of ops whose outputs are all integer/bool, and inputs a rule marks
non-differentiable (shape-only arguments such as the tensor of ``zeros_like``) get ``None``.

Example: ``mm`` on a 1-D mesh of 2 with the choice "split k" gives ``S(1), S(0) -> P``; its grads are
``S(1), S(0)``.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import fx

from autoshard.placement import Partial, Placement, Replicate, Shard, ShardingSpec, format_placement

__all__ = [
    "AxisChoice",
    "OpStrategy",
    "expand",
    "fits",
    "grad_spec",
    "node_val",
    "output_vals",
    "tensor_meta",
]


@dataclass(frozen=True, slots=True)
class OpStrategy:
    """One way to run a node on the mesh.

    ``inputs`` is aligned with ``node.all_input_nodes`` (``None``: not a tensor, or any layout will do);
    ``outputs`` has one entry per output tensor (``None`` for non-tensor outputs); ``input_grads`` says in
    which spec this op's backward yields each input's gradient (``None``: no gradient flows to it);
    ``work_divisor`` is how many ways the op's FLOPs are split per device.
    """

    inputs: tuple[ShardingSpec | None, ...]
    outputs: tuple[ShardingSpec | None, ...]
    input_grads: tuple[ShardingSpec | None, ...]
    work_divisor: int

    def __post_init__(self) -> None:
        if len(self.input_grads) != len(self.inputs):
            raise ValueError(
                f"OpStrategy has {len(self.inputs)} inputs but {len(self.input_grads)} input_grads: "
                "give one grad spec (or None) per input"
            )
        if self.work_divisor < 1:
            raise ValueError(f"work_divisor must be >= 1 (1 means no split), got {self.work_divisor}")
        ndims = {s.mesh_ndim for s in (*self.inputs, *self.outputs, *self.input_grads) if s is not None}
        if len(ndims) > 1:
            raise ValueError(f"specs of one strategy disagree on the mesh rank: {sorted(ndims)}")

    def __str__(self) -> str:
        ins = ", ".join(_fmt(s) for s in self.inputs)
        outs = ", ".join(_fmt(s) for s in self.outputs)
        return f"{ins} -> {outs}".strip()


def _fmt(spec: ShardingSpec | None) -> str:
    return "-" if spec is None else str(spec)


@dataclass(frozen=True, slots=True)
class AxisChoice:
    """What one mesh axis does: a placement per operand role and per output (``None`` for non-tensors)."""

    inputs: tuple[Placement | None, ...]
    outputs: tuple[Placement | None, ...]
    splits_work: bool

    def __str__(self) -> str:
        def fmt(ps: tuple[Placement | None, ...]) -> str:
            return ", ".join("-" if p is None else format_placement(p) for p in ps)

        return f"{fmt(self.inputs)} -> {fmt(self.outputs)}".strip()


# -- tensor metadata helpers -----------------------------------------------------------------------------------


def node_val(node: fx.Node) -> object:
    """``node.meta["val"]``: a (Fake)Tensor, a tuple/list of them, a SymInt, or None."""
    return node.meta.get("val")


def tensor_meta(node: object) -> torch.Tensor | None:
    """The node's value if ``node`` is an fx node holding a single tensor, else None."""
    if not isinstance(node, fx.Node):
        return None
    val = node_val(node)
    return val if isinstance(val, torch.Tensor) else None


def output_vals(node: fx.Node) -> tuple[object, ...]:
    """The node's outputs as a tuple: one element for a single tensor, the elements for tuple/list outputs."""
    val = node_val(node)
    return tuple(val) if isinstance(val, tuple | list) else (val,)


def _is_float(t: object) -> bool:
    return isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex())


def fits(placements: Sequence[Placement], shape: Sequence[int], mesh_shape: Sequence[int]) -> bool:
    """Whether ``placements`` can lay out a tensor of ``shape``: dims exist and every shard divides."""
    counts = [1] * len(shape)
    for p, n in zip(placements, mesh_shape, strict=True):
        if isinstance(p, Shard):
            if p.dim >= len(shape):
                return False
            counts[p.dim] *= n
    return all(int(size) % c == 0 for size, c in zip(shape, counts, strict=True) if c > 1)


# -- expansion over the mesh ------------------------------------------------------------------------------------


def expand(
    node: fx.Node,
    roles: Sequence[object],
    choices: Iterable[AxisChoice],
    mesh_shape: Sequence[int],
    *,
    nondiff: Iterable[int] = (),
) -> list[OpStrategy]:
    """Every combination of per-axis ``choices`` over ``mesh_shape`` that fits, as strategies of ``node``.

    ``roles[i]`` is the input node that ``choice.inputs[i]`` constrains (anything else -- ``None`` for an
    absent optional argument, a scalar -- constrains nothing); input nodes of ``node`` that no role names
    are unconstrained (spec ``None``).  ``nondiff`` lists role indices whose gradient is never needed
    (shape-only arguments).
    """
    choices = list(choices)
    mesh_shape = tuple(mesh_shape)
    role_nodes = [r if isinstance(r, fx.Node) else None for r in roles]
    inputs = node.all_input_nodes
    slot = {n: i for i, n in enumerate(inputs)}
    # what a combination is checked against, worked out once per node rather than once per combination:
    # per constraining role (role index, input slot, shape, is float), per tensor output (shape, is float)
    role_facts = []
    for r, role in enumerate(role_nodes):
        val = tensor_meta(role)
        if role is not None and val is not None and role in slot:
            role_facts.append((r, slot[role], tuple(val.shape), _is_float(val)))
    outs = output_vals(node)
    out_facts = [(tuple(o.shape), _is_float(o)) if isinstance(o, torch.Tensor) else None for o in outs]
    nondiff_nodes = {role_nodes[i] for i in nondiff if role_nodes[i] is not None}
    if not any(_is_float(o) for o in outs):  # integer/bool results carry no gradient back
        nondiff_nodes = set(inputs)
    no_grad = [inp in nondiff_nodes or not _is_float(tensor_meta(inp)) for inp in inputs]
    seen: set[tuple[tuple[ShardingSpec | None, ...], tuple[ShardingSpec | None, ...]]] = set()
    result: list[OpStrategy] = []
    for combo in itertools.product(choices, repeat=len(mesh_shape)):
        in_specs = _input_specs(combo, role_facts, len(inputs), mesh_shape)
        if in_specs is None:
            continue
        out_specs = _output_specs(combo, out_facts, mesh_shape)
        if out_specs is None:
            continue
        key = (in_specs, out_specs)
        if key in seen:
            continue
        seen.add(key)
        work = 1
        for choice, n in zip(combo, mesh_shape, strict=True):
            if choice.splits_work:
                work *= n
        splitting = _splitting(out_specs, len(mesh_shape))
        grads = tuple(
            None if skip else _grad(spec, splitting) for spec, skip in zip(in_specs, no_grad, strict=True)
        )
        result.append(OpStrategy(in_specs, out_specs, grads, work))
    return result


def _input_specs(
    combo: Sequence[AxisChoice],
    role_facts: Sequence[tuple[int, int, tuple[int, ...], bool]],
    n_inputs: int,
    mesh_shape: tuple[int, ...],
) -> tuple[ShardingSpec | None, ...] | None:
    specs: list[ShardingSpec | None] = [None] * n_inputs
    for r, i, shape, is_float in role_facts:
        placements = tuple(_or_r(c.inputs[r]) for c in combo)
        if not _valid(placements, shape, is_float, mesh_shape):
            return None
        spec = _spec(placements)
        if specs[i] is not None and specs[i] != spec:
            return None  # the same node would need two different layouts
        specs[i] = spec
    return tuple(specs)


def _output_specs(
    combo: Sequence[AxisChoice],
    out_facts: Sequence[tuple[tuple[int, ...], bool] | None],
    mesh_shape: tuple[int, ...],
) -> tuple[ShardingSpec | None, ...] | None:
    specs: list[ShardingSpec | None] = []
    for o, facts in enumerate(out_facts):
        if facts is None:
            specs.append(None)
            continue
        placements = tuple(_or_r(c.outputs[o]) for c in combo)
        if not _valid(placements, facts[0], facts[1], mesh_shape):
            return None
        specs.append(_spec(placements))
    return tuple(specs)


@functools.lru_cache(maxsize=65536)
def _splitting(out_specs: tuple[ShardingSpec | None, ...], ndim: int) -> tuple[bool, ...]:
    """Per mesh axis, whether some output is split or partial there (isinstance on torch placements is slow:
    computed once per distinct output layout)."""
    return tuple(
        any(o is not None and not isinstance(o.placements[a], Replicate) for o in out_specs)
        for a in range(ndim)
    )


def _or_r(p: Placement | None) -> Placement:
    return Replicate() if p is None else p


@functools.lru_cache(maxsize=65536)
def _spec(placements: tuple[Placement, ...]) -> ShardingSpec:
    return ShardingSpec(placements)


@functools.lru_cache(maxsize=65536)
def _valid(
    placements: tuple[Placement, ...], shape: tuple[int, ...], is_float: bool, mesh_shape: tuple[int, ...]
) -> bool:
    if not is_float and any(isinstance(p, Partial) for p in placements):
        return False
    return fits(placements, shape, mesh_shape)


@functools.lru_cache(maxsize=65536)
def _grad(spec: ShardingSpec | None, splitting: tuple[bool, ...]) -> ShardingSpec | None:
    """Per axis: ``S(d) -> S(d)``, ``P -> R``, ``R -> P`` where the op's outputs are split, else ``R``."""
    if spec is None:
        return None
    grads: list[Placement] = []
    for p, split in zip(spec.placements, splitting, strict=True):
        if isinstance(p, Shard):
            grads.append(p)
        elif isinstance(p, Partial):
            grads.append(Replicate())
        else:
            grads.append(Partial() if split else Replicate())
    return _spec(tuple(grads))


def grad_spec(
    spec: ShardingSpec | None,
    out_specs: tuple[ShardingSpec | None, ...],
    val: torch.Tensor | None,
    nondiff: bool,
) -> ShardingSpec | None:
    """The spec of an input's gradient, derived per axis from its forward spec (table in the module doc)."""
    if spec is None or val is None or nondiff or not _is_float(val):
        return None
    splitting = tuple(
        any(o is not None and not isinstance(o.placements[a], Replicate) for o in out_specs)
        for a in range(spec.mesh_ndim)
    )
    return _grad(spec, splitting)
