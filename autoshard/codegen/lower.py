"""Lower a captured graph to the graph ONE device runs under a plan: local shapes, local weights, collectives.

Input: a :class:`~autoshard.capture.Captured` (every layer in the graph), the strategy of every node
(:func:`~autoshard.codegen.assign.assign_strategies`), the :class:`~autoshard.cluster.Cluster` the plan was
priced on, and this device's mesh coordinate.  Output: a :class:`LoweredGraph` -- a new ``fx.Graph`` whose

- user inputs stay placeholders, but take this device's *local* piece (spec of the input's placeholder);
- parameters, buffers and constants become ``get_attr`` nodes named by their FQN (the caller binds each to
  the device's shard: :class:`AttrSpec` says which spec);
- every op runs what its rule's ``local_args`` hook says for this coordinate
  (:func:`autoshard.strategies.registry.local_call`: localised ``view``/``expand``/``arange`` sizes,
  vocab-parallel lookups, a bias added on one device of a Partial axis only);
- every edge ``u -> v`` whose forward or backward moves data gets one
  :func:`~autoshard.codegen.collectives.redistribute` node carrying the steps of
  :func:`autoshard.problem.costs.edge_steps` -- the very function the cost model prices, called with the same
  cluster, so the collectives emitted are the collectives priced;
- one redistribution per (tensor, layout): consumers needing the same steps both ways share one node (its
  forward runs once, autograd sums their gradients before its one backward: :mod:`autoshard.problem.fanout`
  prices exactly that); outputs left ``Partial`` are reduced in the plan's precision (``output_fix_steps``);
  what became dead (a causal mask run as ``is_causal``) is dropped (``causal.drop_dead``).

Two details keep every rank issuing the same collectives in the same order.  The backward of a custom
``autograd.Function`` runs only where its output is used, and a rule's hook may drop an input on some ranks
(a bias): such inputs are tied to the op's output with :func:`~autoshard.codegen.collectives.join_unused`, so
their backward collective runs everywhere.  The autograd engine then runs nodes in decreasing creation order,
the same on every rank since every rank runs the same code.  Ops inlined from a ``no_grad`` region
(``META_NO_GRAD``) get their output detached, as in eager mode.

Meta keys: reads ``META_KIND``, ``META_FQN``, ``META_ALIASES``, ``META_NO_GRAD`` (and those
:func:`autoshard.problem.graph.describe` reads); writes on the new nodes ``META_LOCAL_SHAPE`` (the local shape
each tensor must have, for :class:`LocalShapeChecker`) and ``META_STEPS`` (``redistribute``: fwd, bwd steps).
Example::

    lowered = lower_graph(cap, assign_strategies(cap, plan), cluster, coord=(1,))
    print(lowered.graph.python_code("self").src)     # redistribute(...) wherever data moves
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx
from torch.fx.node import map_aggregate, map_arg

from autoshard.capture import META_ALIASES, META_FQN, META_KIND, META_NO_GRAD, Captured, TensorMeta
from autoshard.cluster import Cluster
from autoshard.codegen.assign import PlanMismatchError
from autoshard.codegen.causal import drop_dead
from autoshard.codegen.collectives import format_steps, join_unused, redistribute
from autoshard.codegen.dispatch import with_dispatch
from autoshard.errors import UnsupportedOpError
from autoshard.placement import ShardingSpec
from autoshard.problem.costs import CostOptions, StepCache, dual_spec, edge_steps, output_fix_steps
from autoshard.problem.graph import NodeInfo, describe
from autoshard.redistribute import COLLECTIVE_KINDS, Step
from autoshard.strategies import OpStrategy, local_call

__all__ = [
    "COMM_ATTR",
    "META_BLOCK",
    "META_LOCAL_SHAPE",
    "META_STEPS",
    "AttrSpec",
    "EdgeRecord",
    "LocalShapeChecker",
    "LoweredGraph",
    "collective_counts",
    "lower_graph",
]

META_LOCAL_SHAPE = "autoshard_local_shape"
META_STEPS = "autoshard_steps"
META_BLOCK = "autoshard_block"
"""Repeated-block index of an emitted op, parameter or move between block nodes (codegen/recompute.py)."""
COMM_ATTR = "autoshard_comm"
"""Attribute of the emitted module holding its :class:`~autoshard.codegen.collectives.MeshComm`."""

aten = torch.ops.aten


@dataclass(frozen=True, slots=True)
class AttrSpec:
    """A parameter, buffer or constant of the emitted module: the caller binds ``fqn`` to its local piece."""

    fqn: str
    kind: str  # "parameter" | "buffer" | "constant"
    spec: ShardingSpec
    global_shape: tuple[int, ...]
    aliases: tuple[str, ...] = ()  # other FQNs of a tied parameter


@dataclass(frozen=True, slots=True)
class EdgeRecord:
    """One inserted redistribution: where, and the steps it runs forward and backward."""

    producer: str
    consumer: str  # a node name, or "output"
    forward: tuple[Step, ...]
    backward: tuple[Step, ...]

    def collectives(self) -> Iterator[tuple[str, Step]]:
        """``(phase, step)`` of every collective of this edge."""
        for phase, steps in (("forward", self.forward), ("backward", self.backward)):
            for s in steps:
                if s.kind in COLLECTIVE_KINDS:
                    yield phase, s


@dataclass(frozen=True)
class LoweredGraph:
    """What :func:`lower_graph` returns."""

    graph: fx.Graph
    attrs: tuple[AttrSpec, ...]
    input_specs: tuple[tuple[str, ShardingSpec, tuple[int, ...]], ...]  # (name, spec, global shape)
    output_specs: tuple[tuple[ShardingSpec, tuple[int, ...]], ...]  # (spec, global shape) per output
    edges: tuple[EdgeRecord, ...] = field(default=())

    def collective_counts(self, phase: str | None = None) -> dict[str, int]:
        """How many collectives of each kind the graph runs per step (``phase``: forward/backward/None)."""
        return collective_counts(self.edges, phase)


def collective_counts(edges: Sequence[EdgeRecord], phase: str | None = None) -> dict[str, int]:
    """Collectives per kind that ``edges`` run in one step (``phase``: forward, backward, or both)."""
    counts: dict[str, int] = {}
    for edge in edges:
        for p, step in edge.collectives():
            if phase is None or p == phase:
                counts[step.kind] = counts.get(step.kind, 0) + 1
    return counts


def lower_graph(
    captured: Captured,
    strategies: Mapping[str, OpStrategy],
    cluster: Cluster,
    coord: tuple[int, ...],
    *,
    training: bool = True,
    device: torch.device | None = None,
    zigzag_axis: int | None = None,
    opts: CostOptions | None = None,
) -> LoweredGraph:
    """The graph device ``coord`` runs (module doc); ``zigzag_axis``: the mesh axis whose splits use the
    load-balanced layout (the plan's ``context_axis`` when ``context_layout == "zigzag"``).  Raises
    :class:`UnsupportedOpError` for graphs that are not plain ATen graphs (the ``symbolic_trace`` fallback)
    or mutate buffers.  ``opts``: the plan's cost options (its precision sizes each step as it was priced)."""
    if captured.method != "export":
        raise UnsupportedOpError(
            f"codegen needs a torch.export graph; this model was captured with {captured.method} "
            "(see Captured.notes for why export failed): make the model exportable"
        )
    mutated = [o.target for o in captured.outputs if o.kind == "buffer_mutation"]
    if mutated:
        raise UnsupportedOpError(
            f"the model writes buffers in forward ({', '.join(str(m) for m in mutated[:3])}): codegen does "
            "not support buffer mutation yet; put the model in eval() mode or make the update explicit"
        )
    lowering = _Lowering(captured, strategies, cluster, coord, opts or CostOptions(training=training), device)
    lowering.zigzag_axis = zigzag_axis
    return with_dispatch(drop_dead(lowering.run()), lowering.infos, strategies, cluster, training)


class _Lowering:
    """The rewrite's state: the new graph, old node name -> new node, and what was emitted."""

    def __init__(
        self,
        captured: Captured,
        strategies: Mapping[str, OpStrategy],
        cluster: Cluster,
        coord: tuple[int, ...],
        opts: CostOptions,  # the plan's: its precision fixes the bytes a step moves, as it was priced
        device: torch.device | None,
    ) -> None:
        self.captured, self.strategies, self.coord, self.device = captured, strategies, coord, device
        self.mesh = tuple(cluster.mesh_shape)
        self.infos: dict[str, NodeInfo] = {i.name: i for i in describe(captured.graph_module)}
        self.cache, self.opts = StepCache(cluster), opts
        self.graph = fx.Graph()
        self.env: dict[str, fx.Node] = {}
        self.attrs: list[AttrSpec] = []
        self.inputs: list[tuple[str, ShardingSpec, tuple[int, ...]]] = []
        self.outputs: list[tuple[ShardingSpec, tuple[int, ...]]] = []
        self.edges: list[EdgeRecord] = []
        self.shared: dict[tuple[fx.Node, str, str], fx.Node] = {}  # one redistribution per (tensor, layout)
        self.aliasing: set[fx.Node] = set()  # outputs of custom Functions: may be views of their inputs
        self.comm = self.graph.get_attr(COMM_ATTR)
        self.zigzag_axis: int | None = None

    def run(self) -> LoweredGraph:
        for node in self.captured.graph_module.graph.nodes:
            if node.op == "placeholder":
                self._placeholder(node)
            elif node.op == "call_function":
                self._call(node)
            elif node.op == "output":
                self._output(node)
            else:
                raise UnsupportedOpError(
                    f"codegen cannot lower {node.op} node {node.name}: not an ATen graph"
                )
        self.graph.lint()
        return LoweredGraph(
            self.graph, tuple(self.attrs), tuple(self.inputs), tuple(self.outputs), tuple(self.edges)
        )

    # -- nodes ---------------------------------------------------------------------------------------------------
    def _spec(self, name: str, which: int = 0) -> ShardingSpec:
        outs = self.strategies[name].outputs
        spec = outs[which] if which < len(outs) else None
        return spec if spec is not None else ShardingSpec.replicate(len(self.mesh))

    def _global_shape(self, name: str, which: int = 0) -> tuple[int, ...]:
        meta = self.infos[name].outputs[which] if which < len(self.infos[name].outputs) else None
        assert isinstance(meta, TensorMeta), f"{name} output {which} is not a tensor"
        return meta.shape

    def _placeholder(self, node: fx.Node) -> None:
        if not isinstance(self.infos[node.name].outputs[0], TensorMeta):
            raise UnsupportedOpError(
                f"input {node.name} is not a tensor: codegen takes tensor inputs only; make it a constant of "
                "the model (an attribute or a default argument) before parallelizing"
            )
        spec, shape = self._spec(node.name), self._global_shape(node.name)
        kind = node.meta.get(META_KIND, "user_input")
        if kind == "user_input":
            new = self.graph.placeholder(node.name)
            self.inputs.append((node.name, spec, shape))
        else:
            fqn = str(node.meta[META_FQN])
            new = self.graph.get_attr(fqn)
            self.attrs.append(AttrSpec(fqn, kind, spec, shape, tuple(node.meta.get(META_ALIASES, ()))))
        new.meta[META_LOCAL_SHAPE] = spec.local_shape(shape, self.mesh)
        self.env[node.name] = new

    def _call(self, node: fx.Node) -> None:
        info = self.infos[node.name]
        if node.target is operator.getitem and isinstance(node.args[0], fx.Node) and len(info.inputs) == 1:
            self._getitem(node, info)
            return
        moved: dict[fx.Node, fx.Node] = {}
        for pos, src in enumerate(node.all_input_nodes):
            moved[src] = self._edge(src, node, pos, info.input_outputs[pos], self.env[src.name])
        if _mutates(node):  # autograd forbids writing into a custom Function's output: write into a copy
            moved = {s: (self._clone(n) if n in self.aliasing else n) for s, n in moved.items()}
        args, kwargs = map_arg(node.args, moved.__getitem__), map_arg(node.kwargs, moved.__getitem__)
        call = local_call(
            node, self.strategies[node.name], self.mesh, self.coord, args, kwargs, self.zigzag_axis
        )
        if getattr(call.target, "takes_comm", False):  # talks to other ranks itself (ring attention, experts)
            call = dataclasses.replace(call, kwargs={**call.kwargs, "comm": self.comm})
        new = self.graph.create_node(
            "call_function", call.target, *self._on_device(call.args, dict(call.kwargs)), name=node.name
        )
        new.meta.update({k: v for k, v in node.meta.items() if k in ("stack_trace", "nn_module_stack")})
        new.meta[META_BLOCK] = _block(info)
        new = self._join(new, node, moved, call.args, call.kwargs)
        if node.meta.get(META_NO_GRAD):
            new = self.graph.call_function(aten.detach.default, (new,))
        self._set_local_shape(new, node)
        self.env[node.name] = new

    def _getitem(self, node: fx.Node, info: NodeInfo) -> None:
        """Take element ``which`` of a multi-output op first, then move that element alone."""
        src, which = node.args[0], node.args[1]
        assert isinstance(src, fx.Node) and isinstance(which, int)
        element = self.graph.call_function(operator.getitem, (self.env[src.name], which))
        new = self._edge(src, node, 0, info.input_outputs[0], element)
        self._set_local_shape(new, node)
        self.env[node.name] = new

    def _output(self, node: fx.Node) -> None:
        values = node.args[0] if isinstance(node.args[0], tuple | list) else (node.args[0],)
        results: list[Any] = []
        for value in values:
            if not isinstance(value, fx.Node):
                results.append(value)
                continue
            info, strategy = self.infos[value.name], self.strategies[value.name]
            op = info.kind == "op"
            fix = output_fix_steps(info, strategy, self.cache, self.opts.precision) if op else ()
            results.append(self._insert(self.env[value.name], value.name, "output", fix, ()))
            self.outputs.append((dual_spec(self._spec(value.name)), self._global_shape(value.name)))
        self.graph.output(results[0] if len(results) == 1 else tuple(results))

    # -- edges -----------------------------------------------------------------------------------------------------
    def _edge(self, src: fx.Node, dst: fx.Node, pos: int, which: int, value: fx.Node) -> fx.Node:
        steps = edge_steps(
            self.infos[src.name],
            which,
            self.strategies[src.name],
            self.strategies[dst.name],
            pos,
            self.opts,
            self.cache,
        )
        if not steps.feasible:
            raise PlanMismatchError(
                f"edge {src.name} -> {dst.name}: no redistribution turns {self.strategies[src.name]} into what "
                f"{self.strategies[dst.name]} needs; the plan is inconsistent with this graph: re-plan"
            )
        moved = self._insert(value, src.name, dst.name, steps.forward, steps.backward)
        if moved is value:
            return moved
        made, into = self.infos[src.name], _block(self.infos[dst.name])
        block = into if _block(made) is not None or made.after_block else None
        if moved.meta.get(META_BLOCK, block) != block:
            block = None  # shared by consumers in two blocks: in neither
        # a move from a block node (or a stage input one made) is its consumer's block's: recompute.reissued
        moved.meta[META_BLOCK] = block
        return moved

    def _insert(
        self, value: fx.Node, producer: str, consumer: str, fwd: tuple[Step, ...], bwd: tuple[Step, ...]
    ) -> fx.Node:
        if not fwd and not bwd:
            return value
        args = (value, self.comm, format_steps(fwd), format_steps(bwd))
        key = (value, args[2], args[3])
        if key in self.shared:
            return self.shared[key]
        new = self.graph.create_node(
            "call_function", redistribute, args, {}, name=f"{producer}_to_{consumer}"
        )
        new.meta[META_STEPS] = (fwd, bwd)
        self.aliasing.add(new)
        self.edges.append(EdgeRecord(producer, consumer, fwd, bwd))
        self.shared[key] = new
        return new

    def _join(
        self, new: fx.Node, node: fx.Node, moved: Mapping[fx.Node, fx.Node], args: Any, kwargs: Any
    ) -> fx.Node:
        """Tie moved inputs the local call dropped, whose backward has a collective, to the op's output."""
        used: set[fx.Node] = set()
        map_aggregate((args, kwargs), lambda a: used.add(a) if isinstance(a, fx.Node) else None)
        dropped = [
            n
            for n in moved.values()
            if n not in used and META_STEPS in n.meta and any(s.is_collective for s in n.meta[META_STEPS][1])
        ]
        meta = self.infos[node.name].outputs[0]
        if not dropped or not (isinstance(meta, TensorMeta) and meta.is_floating):
            return new
        joined = self.graph.call_function(join_unused, (new, *dropped))
        self.aliasing.add(joined)
        return joined

    def _clone(self, value: fx.Node) -> fx.Node:
        return self.graph.call_function(aten.clone.default, (value,))

    def _on_device(self, args: Sequence[Any], kw: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Made or moved tensors (``arange``; ``aten.to.device(x, cpu)``, HF's rotary) go to this rank's device."""
        if self.device is not None and isinstance(kw.get("device"), torch.device):
            kw["device"] = self.device
        return tuple((self.device or a) if isinstance(a, torch.device) else a for a in args), kw

    def _set_local_shape(self, new: fx.Node, node: fx.Node) -> None:
        meta = self.infos[node.name].outputs
        if len(meta) == 1 and isinstance(meta[0], TensorMeta) and node.target is not operator.getitem:
            new.meta[META_LOCAL_SHAPE] = self._spec(node.name).local_shape(meta[0].shape, self.mesh)
        elif node.target is operator.getitem:
            src = node.args[0]
            assert isinstance(src, fx.Node)
            shape = self._global_shape(node.name)
            new.meta[META_LOCAL_SHAPE] = self._spec(node.name).local_shape(shape, self.mesh)


def _block(info: NodeInfo) -> int | None:
    return info.block[0] if info.block is not None else None


def _mutates(node: fx.Node) -> bool:
    schema = getattr(node.target, "_schema", None)
    return bool(schema is not None and schema.is_mutable)


class LocalShapeChecker(fx.Interpreter):
    """Runs an emitted module node by node and checks every tensor's local shape against the plan's.

    A debugging aid: raises :class:`PlanMismatchError` naming the first node whose local value has the wrong
    shape (a size a ``local_args`` hook forgot to localise, a collective on the wrong dim).
    """

    def run_node(self, n: fx.Node) -> Any:
        value = super().run_node(n)
        want = n.meta.get(META_LOCAL_SHAPE)
        if want is not None and isinstance(value, torch.Tensor) and tuple(value.shape) != tuple(want):
            raise PlanMismatchError(
                f"graph node {n.name} ({n.target}): local shape {tuple(value.shape)}, but the plan implies "
                f"{tuple(want)}"
            )
        return value
