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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from operator import itemgetter

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


@functools.lru_cache(maxsize=65536)  # every strategy is labelled for the solver: each spec printed once
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
    choices = tuple(choices)
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
    no_grad = tuple(inp in nondiff_nodes or not _is_float(tensor_meta(inp)) for inp in inputs)
    return list(_combinations(choices, mesh_shape, tuple(role_facts), tuple(out_facts), no_grad))


@functools.lru_cache(maxsize=4096)
def _combinations(
    choices: tuple[AxisChoice, ...],
    mesh_shape: tuple[int, ...],
    role_facts: tuple[tuple[int, int, tuple[int, ...], bool], ...],
    out_facts: tuple[tuple[tuple[int, ...], bool] | None, ...],
    no_grad: tuple[bool, ...],
) -> tuple[OpStrategy, ...]:
    """The strategies :func:`expand` keeps, from all it reads of the node: per constraining role (role index,
    input slot, shape, is float), per output (shape, is float) or None, per input whether it takes no
    gradient (its length is the input count), the choices and the mesh.  Nothing else of the node is read
    below, so nodes alike in these (a LLaMA block's q/k/v-shaped pointwise ops, its two norms) share one
    expansion (70B: 131 expansions, 78 distinct); the records are frozen, so sharing them is safe."""
    table = _Interned(mesh_shape)
    role_cols = [
        (i, table.column([c.inputs[r] for c in choices], shape, fl)) for r, i, shape, fl in role_facts
    ]
    out_cols = [
        None if f is None else table.column([c.outputs[o] for c in choices], *f)
        for o, f in enumerate(out_facts)
    ]
    # per choice: whether some output is split or partial on the axis taking it (the backward claim's input)
    splits = [any(col is not None and not col.replicate[k] for col in out_cols) for k in range(len(choices))]
    seen: set[tuple[int, ...]] = set()
    grads_of: dict[tuple[int, tuple[bool, ...]], ShardingSpec | None] = {}
    result: list[OpStrategy] = []
    for combo in itertools.product(range(len(choices)), repeat=len(mesh_shape)):
        layout = itemgetter(*combo) if len(combo) > 1 else (lambda ids, k=combo[0]: (ids[k],))
        in_specs: list[ShardingSpec | None] = [None] * len(no_grad)
        for i, col in role_cols:
            spec = col.spec(layout(col.ids))
            if spec is None or (in_specs[i] is not None and in_specs[i] is not spec):
                break  # a shard that does not divide, or the same node would need two different layouts
            in_specs[i] = spec
        else:
            out_specs = _combo_outputs(layout, out_cols)
            if out_specs is None:
                continue
            key = tuple(map(id, (*in_specs, *out_specs)))  # specs are canonical within this call
            if key in seen:
                continue
            seen.add(key)
            work = 1
            for k, n in zip(combo, mesh_shape, strict=True):
                if choices[k].splits_work:
                    work *= n
            splitting = tuple(splits[k] for k in combo)
            grads: list[ShardingSpec | None] = []
            for spec, skip in zip(in_specs, no_grad, strict=True):
                if skip or spec is None:
                    grads.append(None)
                    continue
                gkey = (id(spec), splitting)
                if gkey not in grads_of:
                    grads_of[gkey] = _grad(spec, splitting)
                grads.append(grads_of[gkey])
            result.append(_expanded(tuple(in_specs), out_specs, tuple(grads), work))
    return tuple(result)


def _expanded(
    inputs: tuple[ShardingSpec | None, ...],
    outputs: tuple[ShardingSpec | None, ...],
    input_grads: tuple[ShardingSpec | None, ...],
    work_divisor: int,
) -> OpStrategy:
    """An :class:`OpStrategy` of :func:`expand`, whose checks hold by construction (every spec of one mesh, a
    gradient spec per input, a product of axis sizes as the divisor): made without re-running them (a
    sixth of expansion's time on LLaMA-3-70B), the same record."""
    strategy = object.__new__(OpStrategy)
    _set(strategy, "inputs", inputs)
    _set(strategy, "outputs", outputs)
    _set(strategy, "input_grads", input_grads)
    _set(strategy, "work_divisor", work_divisor)
    return strategy


_set = object.__setattr__  # a frozen record's fields, set once as its own __init__ does


def _combo_outputs(
    layout: Callable[[list[int]], tuple[int, ...]], out_cols: list[_Column | None]
) -> tuple[ShardingSpec | None, ...] | None:
    specs: list[ShardingSpec | None] = []
    for col in out_cols:
        spec = None if col is None else col.spec(layout(col.ids))
        if spec is None and col is not None:
            return None
        specs.append(spec)
    return tuple(specs)


class _Interned:
    """The placements of one :func:`expand` call as small integers, and one spec object per layout.

    torch's placements hash and compare in Python; a combination is looked up by a tuple of ints instead,
    and one layout always yields the same :class:`ShardingSpec` object (so ``is`` compares specs).  The ints
    are those of :data:`_PLACEMENT_IDS` (shared by every call), so what a layout means for a tensor is
    cached across calls by ints alone (:func:`_layout_spec`)."""

    def __init__(self, mesh_shape: tuple[int, ...]) -> None:
        self.mesh_shape = mesh_shape
        self.canonical: dict[tuple[int, ...], ShardingSpec] = {}

    def column(self, placements: list[Placement | None], shape: tuple[int, ...], is_float: bool) -> _Column:
        """One role or output: per choice, the id of its placement (``None`` is ``Replicate()``)."""
        ids = [_placement_id(_or_r(p)) for p in placements]
        return _Column(self, ids, [isinstance(_PLACEMENTS[k], Replicate) for k in ids], shape, is_float)


#: every placement :func:`expand` has met, numbered in order of first sight (never renumbered)
_PLACEMENT_IDS: dict[Placement, int] = {}
_PLACEMENTS: list[Placement] = []


def _placement_id(p: Placement) -> int:
    k = _PLACEMENT_IDS.get(p)
    if k is None:
        k = _PLACEMENT_IDS[p] = len(_PLACEMENTS)
        _PLACEMENTS.append(p)
    return k


@functools.lru_cache(maxsize=65536)
def _layout_spec(
    layout: tuple[int, ...], shape: tuple[int, ...], is_float: bool, mesh_shape: tuple[int, ...]
) -> ShardingSpec | None:
    """The spec of ``layout`` (ids of :data:`_PLACEMENTS` per axis), or None where it does not fit."""
    placements = tuple(_PLACEMENTS[k] for k in layout)
    return _spec(placements) if _valid(placements, shape, is_float, mesh_shape) else None


class _Column:
    """One tensor of the op (a constraining role or an output): its placement per choice, and its specs."""

    def __init__(
        self, table: _Interned, ids: list[int], replicate: list[bool], shape: tuple[int, ...], is_float: bool
    ) -> None:
        self.table, self.ids, self.replicate = table, ids, replicate
        self.shape, self.is_float = shape, is_float
        self._specs: dict[tuple[int, ...], ShardingSpec | None] = {}

    def spec(self, layout: tuple[int, ...]) -> ShardingSpec | None:
        """The spec of ``layout`` (placement ids per axis), or None where it does not fit this tensor."""
        try:
            return self._specs[layout]
        except KeyError:
            pass
        t = self.table
        found = _layout_spec(layout, self.shape, self.is_float, t.mesh_shape)
        if found is not None:  # the first object met for this layout in this call stands for all
            found = t.canonical.setdefault(layout, found)
        self._specs[layout] = found
        return found


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
