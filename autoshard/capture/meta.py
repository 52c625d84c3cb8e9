"""Records that capture produces, and the ``node.meta`` keys it writes.

Every stage after capture reads the graph through these keys and records, never through torch's own
``meta["val"]`` FakeTensors, so that the export path and the ``symbolic_trace`` fallback look the same.

Meta keys (``node.meta[KEY]``), all written by :mod:`autoshard.capture.annotate` unless said:

========================  ==========================================================================
``META_TENSOR``           ``TensorMeta`` of the node's value; a tuple of ``TensorMeta | None`` for nodes
                          returning several values (``split``, ``topk``, the ``output`` node); ``None``
                          for non-tensor values (ints, bools, ``None``).
``META_FLOPS``            ``int``: forward FLOPs of the op (see :mod:`autoshard.capture.flops`); 0 for
                          placeholders, views, indexing and the output node.
``META_MODULE``           ``str``: FQN of the innermost user module the op ran in, ``"model.layers.3.mlp"``;
                          ``""`` at the root.  Parameter/buffer placeholders get their owning module.
``META_MODULE_TYPE``      ``str``: class name of that module (``"LlamaMLP"``), ``""`` when unknown.
``META_OP``               ``str``: the op's name, ``"aten.linear.default"`` for ATen overloads,
                          ``"getitem"`` for tuple indexing, ``"module.Linear"`` / ``"method.relu"`` in a
                          ``symbolic_trace`` graph.
``META_REQUIRES_GRAD``    ``bool``: the value depends on a trainable parameter through differentiable
                          floating-point ops, so a gradient flows back along this edge.
``META_KIND``             placeholders only: ``"parameter" | "buffer" | "constant" | "user_input"``.
``META_FQN``              placeholders of parameters/buffers/constants: their fully qualified name
                          (``"model.layers.0.mlp.up_proj.weight"``) as in ``model.named_parameters()``.
``META_ALIASES``          parameter placeholders of tied weights: ``tuple[str, ...]``, the tensor's other
                          FQNs (GPT-2's ``transformer.wte.weight`` node: ``("lm_head.weight",)``); the
                          graph holds one placeholder per tensor.
``META_BLOCK``            nodes of a repeated block: ``(block_index, position)`` where ``position`` is
                          the node's index among that block's nodes in graph (topological) order, so
                          position *p* of block 0 plays the same role as position *p* of block 1.
                          Written by :mod:`autoshard.capture.blocks`.
``META_RUN``              nodes of a further run of identical blocks (not the primary stack):
                          ``(run, block_index, position)``, positions as for ``META_BLOCK``.
                          Written by :mod:`autoshard.capture.runs`.
``META_NO_GRAD``          ``True`` on nodes inlined from a ``set_grad_enabled(False)`` region
                          (written by :mod:`autoshard.capture.clean`); they never carry gradients.
``META_CAUSAL_MASK``      ``True`` on a ``scaled_dot_product_attention`` whose explicit boolean mask is
                          proven to be the causal mask (written by :mod:`autoshard.capture.causal`).
``META_KV_REPEATS``       ``int`` on a ``scaled_dot_product_attention`` whose K and V are grouped-query
                          copies (each K/V head repeated ``r`` times in a row, HF's ``repeat_kv``):
                          ``r`` (written by :mod:`autoshard.capture.gqa`).
========================  ==========================================================================

Example::

    cap = capture(model, (ids,))
    for node in cap.op_nodes():
        print(node.name, node.meta[META_OP], node.meta[META_TENSOR], node.meta[META_FLOPS])
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import fx

__all__ = [
    "META_ALIASES",
    "META_BLOCK",
    "META_CAUSAL_MASK",
    "META_FLOPS",
    "META_FQN",
    "META_KIND",
    "META_KV_REPEATS",
    "META_MODULE",
    "META_MODULE_TYPE",
    "META_NO_GRAD",
    "META_OP",
    "META_REQUIRES_GRAD",
    "META_RUN",
    "META_TENSOR",
    "BlockInfo",
    "Captured",
    "Method",
    "OutputInfo",
    "PlaceholderKind",
    "RunInfo",
    "TensorMeta",
    "op_name",
    "op_set",
    "tensor_meta_of",
]

META_TENSOR = "autoshard_tensor"
META_FLOPS = "autoshard_flops"
META_MODULE = "autoshard_module"
META_MODULE_TYPE = "autoshard_module_type"
META_OP = "autoshard_op"
META_REQUIRES_GRAD = "autoshard_requires_grad"
META_KIND = "autoshard_kind"
META_FQN = "autoshard_fqn"
META_BLOCK = "autoshard_block"
META_ALIASES = "autoshard_aliases"
META_NO_GRAD = "autoshard_no_grad"
META_RUN = "autoshard_run"
META_CAUSAL_MASK = "autoshard_causal_mask"
META_KV_REPEATS = "autoshard_kv_repeats"

PlaceholderKind = Literal["parameter", "buffer", "constant", "user_input"]
Method = Literal["export", "symbolic_trace"]

OP_KINDS = ("call_function", "call_method", "call_module")

UNKNOWN_DIM = -1
"""A dim whose size is not known statically (an unbacked SymInt); ``numel`` counts it as 1."""


@dataclass(frozen=True, slots=True)
class TensorMeta:
    """Shape and element type of one tensor value; prints as ``float32[2, 16, 64]``."""

    shape: tuple[int, ...]
    dtype: str
    """torch dtype without the ``torch.`` prefix: ``"float32"``, ``"bfloat16"``, ``"int64"``, ``"bool"``."""
    itemsize: int
    """Bytes per element."""

    def __post_init__(self) -> None:
        if any(d < UNKNOWN_DIM for d in self.shape):
            raise ValueError(
                f"TensorMeta shape {self.shape} has a negative dim; use sizes >= 0 (or -1 = unknown)"
            )
        if self.itemsize <= 0:
            raise ValueError(f"TensorMeta itemsize must be positive, got {self.itemsize}")

    @property
    def numel(self) -> int:
        return math.prod(max(d, 1) if d == UNKNOWN_DIM else d for d in self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def is_floating(self) -> bool:
        return self.dtype.startswith(("float", "bfloat", "complex"))

    def __str__(self) -> str:
        return f"{self.dtype}[{', '.join(str(d) for d in self.shape)}]"


def _static_dim(size: Any) -> int:
    try:
        return int(size)
    except Exception:  # an unbacked SymInt cannot be specialised: record it as unknown
        hint = getattr(getattr(size, "node", None), "hint", None)
        return int(hint) if hint is not None else UNKNOWN_DIM


def tensor_meta_of(value: Any) -> TensorMeta | tuple[TensorMeta | None, ...] | None:
    """The ``META_TENSOR`` record of a real or fake value (a tensor, a tuple/list of them, anything else)."""
    if isinstance(value, torch.Tensor):
        shape = tuple(_static_dim(s) for s in value.shape)
        return TensorMeta(shape, str(value.dtype).removeprefix("torch."), value.dtype.itemsize)
    if isinstance(value, (tuple, list)):
        return tuple(_single(tensor_meta_of(v)) for v in value)
    return None


def _single(meta: TensorMeta | tuple[TensorMeta | None, ...] | None) -> TensorMeta | None:
    # Nested tuples (rare: a list inside a tuple) are flattened away: only direct tensor items are tracked.
    return meta if isinstance(meta, TensorMeta) else None


def op_set(names: str) -> frozenset[str]:
    """A set of op base names written as one whitespace-separated string (``"mm bmm linear"``)."""
    return frozenset(names.split())


def op_name(node: fx.Node, root: torch.nn.Module | None = None) -> str:
    """Stable, printable name of what ``node`` computes (the value of ``META_OP``)."""
    if node.op == "call_function":
        target = node.target
        if isinstance(target, torch._ops.OpOverload):
            return str(target)
        name = getattr(target, "__name__", str(target))
        return "getitem" if name == "getitem" else name
    if node.op == "call_method":
        return f"method.{node.target}"
    if node.op == "call_module":
        cls = type(root.get_submodule(str(node.target))).__name__ if root is not None else str(node.target)
        return f"module.{cls}"
    return node.op


@dataclass(frozen=True, slots=True)
class BlockInfo:
    """The model's repeated blocks (an ``nn.ModuleList`` of structurally identical modules).

    ``captured_blocks`` of the ``num_blocks`` blocks are in the graph; every captured block's nodes carry
    ``META_BLOCK``.  Nodes of block ``i`` at position ``p`` correspond one to one across blocks, so a
    planner solves one block and multiplies its cost by ``num_blocks``.
    """

    prefix: str
    """FQN of the ModuleList, ``"model.layers"``; block ``i`` owns the FQNs under ``f"{prefix}.{i}."``."""
    num_blocks: int
    """Blocks in the model."""
    captured_blocks: int
    """Blocks present in the graph (2 on the cut path, ``num_blocks`` on a full capture)."""
    nodes_per_block: int
    """Graph nodes of one block (its parameter/buffer placeholders plus its ops)."""
    block_type: str
    """Class name of a block, ``"LlamaDecoderLayer"``."""
    block_params: Mapping[str, TensorMeta]
    """Parameters of one block by name relative to the block (``"mlp.up_proj.weight"``)."""
    block_flops: int
    """Forward FLOPs of one block."""
    first: int = 0
    """Container index of block 0: the blocks are children ``first .. first + num_blocks - 1`` of ``prefix``
    (``3`` for DeepSeek-V3, whose three dense layers precede 58 identical MoE layers)."""

    def __post_init__(self) -> None:
        if not 1 <= self.captured_blocks <= self.num_blocks:
            raise ValueError(
                f"BlockInfo: captured_blocks={self.captured_blocks} must lie in 1..{self.num_blocks}"
            )

    def fqn(self, block: int, name: str) -> str:
        """FQN of the block-relative ``name`` in block ``block``: ``fqn(3, "mlp.up_proj.weight")``."""
        return f"{self.prefix}.{self.first + block}.{name}"

    def __str__(self) -> str:
        start = f" from {self.prefix}.{self.first}" if self.first else ""
        return (
            f"{self.prefix}: {self.num_blocks} x {self.block_type}{start} "
            f"({self.captured_blocks} captured, {self.nodes_per_block} nodes each)"
        )


@dataclass(frozen=True, slots=True)
class RunInfo:
    """A further run of identical blocks, all in the graph (:mod:`autoshard.capture.runs`): the search
    shares block 0's decisions with the others; nothing else reads it."""

    blocks: tuple[str, ...]
    """Module path of every block, in order (``"encoder.block.1"``, .., or ``"layer0"``, ``"layer1"``, ..)."""
    block_type: str
    nodes_per_block: int

    def __str__(self) -> str:
        return f"{self.blocks[0]}..{self.blocks[-1]}: {len(self.blocks)} x {self.block_type}"


@dataclass(frozen=True, slots=True)
class OutputInfo:
    """One value the graph returns, in the order of the ``output`` node."""

    name: str
    """Name of the graph node returned (``""`` for a constant)."""
    kind: Literal["user_output", "buffer_mutation", "other"]
    tensor: TensorMeta | None
    target: str | None = None
    """For a buffer mutation: the FQN of the buffer written."""


@dataclass(frozen=True, slots=True)
class Captured:
    """A captured, cleaned and annotated forward graph: the output of :func:`autoshard.capture.capture`."""

    graph_module: fx.GraphModule
    params: Mapping[str, TensorMeta]
    """Parameters in the graph, FQN -> meta (on the 2-block path: blocks 0 and 1 only; see ``all_params``)."""
    buffers: Mapping[str, TensorMeta]
    user_inputs: tuple[str, ...]
    """Placeholder names of the user's inputs, in call order."""
    outputs: tuple[OutputInfo, ...]
    blocks: BlockInfo | None
    method: Method
    seconds: float
    """Wall time of the whole capture (export(s), cleaning, annotation)."""
    notes: tuple[str, ...] = ()
    """Human-readable remarks: fallbacks taken and why."""
    constants: Mapping[str, torch.Tensor] = field(default_factory=dict)
    """Lifted tensor constants (export only), FQN -> value."""
    runs: tuple[RunInfo, ...] = ()
    """Further runs of identical blocks besides ``blocks``, every block in the graph (``META_RUN``)."""

    def nodes(self) -> Iterator[fx.Node]:
        """All nodes in topological order (fx keeps a graph's node list topologically sorted)."""
        return iter(self.graph_module.graph.nodes)

    def op_nodes(self) -> Iterator[fx.Node]:
        """Nodes that compute something (not placeholders, attributes or the output)."""
        return (n for n in self.graph_module.graph.nodes if n.op in OP_KINDS)

    def placeholders(self, kind: PlaceholderKind | None = None) -> Iterator[fx.Node]:
        nodes = (n for n in self.graph_module.graph.nodes if n.op == "placeholder")
        return nodes if kind is None else (n for n in nodes if n.meta.get(META_KIND) == kind)

    def node(self, name: str) -> fx.Node:
        for n in self.graph_module.graph.nodes:
            if n.name == name:
                return n
        raise KeyError(f"no node named {name!r} in the captured graph")

    def op_targets(self) -> tuple[str, ...]:
        """Distinct ``META_OP`` names of the op nodes, sorted."""
        return tuple(sorted({n.meta[META_OP] for n in self.op_nodes()}))

    def block_multiplier(self, node: fx.Node) -> float:
        """How many model ops one graph node stands for: ``num_blocks / captured_blocks`` inside a block."""
        if self.blocks is None or META_BLOCK not in node.meta:
            return 1.0
        return self.blocks.num_blocks / self.blocks.captured_blocks

    def total_flops(self) -> int:
        """Forward FLOPs of the whole model, blocks not in the graph included."""
        total = sum(n.meta[META_FLOPS] * self.block_multiplier(n) for n in self.op_nodes())
        return round(total)

    def all_params(self) -> dict[str, TensorMeta]:
        """Parameters of the whole model, FQN -> meta, including blocks left out of the graph."""
        if self.blocks is None or self.blocks.captured_blocks == self.blocks.num_blocks:
            return dict(self.params)
        prefix, first = f"{self.blocks.prefix}.", self.blocks.first

        def in_run(fqn: str) -> bool:
            head = fqn[len(prefix) :].split(".", 1)[0]
            return fqn.startswith(prefix) and head.isdigit() and int(head) >= first

        out = {k: v for k, v in self.params.items() if not in_run(k)}
        for i in range(self.blocks.num_blocks):
            out.update({self.blocks.fqn(i, k): v for k, v in self.blocks.block_params.items()})
        return out
