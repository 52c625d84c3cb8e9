"""Training-aware costs of one node's strategy and of one edge's spec change.

Input: :class:`~autoshard.problem.graph.NodeInfo` records, their :class:`~autoshard.strategies.OpStrategy`
lists, a :class:`~autoshard.cluster.Cluster` and :class:`CostOptions`.
Output: seconds and bytes as plain floats; the builder turns them into the solver's arrays, and the plan
report itemises the chosen ones with the same functions (one source of truth for every figure).

The backward pass is derived from the forward by duality (ARCHITECTURE.md, "Training"):

- compute: a matmul-like op's backward costs twice its forward (a gradient for each operand), any other op
  that carries gradients once; recomputation (:class:`Recompute`, one choice for the repeated blocks) adds
  the forward of every block node it re-runs again (:func:`recomputed`), and re-issues the forward
  redistributions into those blocks (priced by the builder on the edges);
- communication on an edge ``u → v`` (:mod:`autoshard.problem.moves`): forward, ``u``'s output spec is
  redistributed to the spec ``v``'s strategy wants; backward, the gradient ``v``'s strategy yields
  (``OpStrategy.input_grads``) is redistributed to the dual of ``u``'s output spec (``S(d) → S(d)``,
  ``P → R``, ``R → R``).  Gradient synchronisation of replicated parameters is this rule on the parameter's
  edges: a batch-split consumer yields a ``P`` gradient and the parameter's dual spec is ``R``, hence one
  all-reduce; an ``S(0)`` (ZeRO-3/FSDP) parameter gets a reduce-scatter instead;
- memory per device: each parameter's shard and its gradient (the parameter's itemsize per element each, or
  the bytes of ``CostOptions.precision``), its Adam state (fp32 master + two moments, 12 bytes per element,
  for 16-bit parameters; two moments, 8 bytes, for fp32 ones), plus the activations backward keeps (outputs
  of non-view ops that carry gradients; under recomputation only the tensors that leave a repeated block,
  and under the selective policy the outputs of matmul-like ops too), plus the recompute working set (one
  block's re-run activations at a time), plus an fp32 copy of each returned float tensor and its gradient
  (the loss upcasts logits).  The plan adds what no node owns (:mod:`autoshard.problem.extract`): the
  runtime reserve, gathered FSDP weights and the largest temporary;
- optimizer: with ``shard_optimizer`` (the default, as Megatron's distributed optimizer and ZeRO-1 do), the
  Adam state and its update are split over every device, whatever the parameter's placement: a replicated
  parameter's gradient is reduce-scattered and the updated shard all-gathered, which moves exactly the
  volume of the all-reduce the edge already pays, so only memory and update time change;
- microbatches (gradient accumulation, ``CostOptions.microbatches = m``): the graph is captured at the
  microbatch's shapes, so its FLOPs, activations and activation traffic are one microbatch's; compute and
  every redistribution of activations (forward and backward) and every forward gather of a parameter
  (ZeRO-3/FSDP re-gathers it for each microbatch) happen ``m`` times per step, while gradient
  synchronisation (a parameter edge's backward) and the optimizer happen once (:func:`repeats`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Literal

import numpy as np

from autoshard.cluster import Cluster
from autoshard.placement import Shard, ShardingSpec
from autoshard.problem.attention import causal_attention
from autoshard.problem.autocast import autocast_scale, autocast_seconds, uses_autocast, weight_bytes
from autoshard.problem.context import ring_seconds
from autoshard.problem.elementwise import autocast_update_seconds, extra_seconds, master_cast_seconds, recipe
from autoshard.problem.graph import NodeInfo
from autoshard.problem.hidden_ops import hidden_seconds

# the edge half of the cost model (split along the node / edge seam); re-exported for existing importers
from autoshard.problem.moves import (
    COLLECTIVE_KINDS,
    EdgeSteps,
    StepCache,
    dual_spec,
    edge_steps,
    output_fix_steps,
    steps_time,
)
from autoshard.strategies import OpStrategy
from cost_models.compute import gemm_efficiency
from cost_models.memory import PrecisionPolicy
from cost_models.overlap import OverlapPolicy

__all__ = [
    "COLLECTIVE_KINDS",
    "MEMORY_TIE_BREAK",
    "CostOptions",
    "EdgeSteps",
    "Recompute",
    "StepCache",
    "compute_parts",
    "dual_spec",
    "edge_steps",
    "grad_factor",
    "node_compute",
    "node_memory",
    "operand_bytes",
    "output_fix_steps",
    "recipe",
    "recomputed",
    "repeats",
    "steps_time",
    "timed",
]


Seconds = float | np.ndarray  # one strategy's figure, or one per strategy of a node (builder)

MEMORY_TIE_BREAK = 1e-18
"""Seconds charged per byte of memory per device, only to break ties between plans of equal time in favour
of the one that holds less (a sharded input over a replicated one that is sliced on arrival).  1 GiB costs
a nanosecond: it never outweighs a real difference in time."""


class Recompute(str, Enum):
    """Recomputation of the repeated blocks, searched by the planner.  ``SELECTIVE``: torchtitan's op-level
    selective checkpointing (``create_selective_checkpoint_contexts``), matmul-like outputs saved, the rest
    re-run; Korthikanti et al.'s attention-core recompute is what a fused SDPA kernel does anyway."""

    NONE = "none"  # keep every activation backward needs
    SELECTIVE = "selective"  # keep matmul-like outputs; re-run the rest of each block in backward
    FULL = "full"  # keep only each repeated block's inputs; recompute the block in backward


@dataclass(frozen=True, slots=True)
class CostOptions:
    """Knobs of the cost model that are not hardware.

    ``overlap`` is the one overlap / bucket / prefetch policy of the step: the plan's predicted step time
    prices it (:mod:`cost_models.overlap`) and the plan records it for the runtime to execute.
    ``precision`` fixes the bytes per parameter of weights, gradients and optimizer state; None derives
    them from each parameter's dtype (16-bit: fp32 master + Adam moments; fp32: moments only).
    """

    training: bool = True
    recompute: Recompute = Recompute.NONE
    shard_optimizer: bool = True  # ZeRO-1 / distributed optimizer: Adam state split over all devices
    overlap: OverlapPolicy = field(default_factory=OverlapPolicy)
    precision: PrecisionPolicy | None = None
    microbatches: int = 1  # per step; the graph is captured at one microbatch's shapes (see repeats)
    # sequence layout of context parallelism's ring axis (problem/context.py): "auto" prices rings balanced
    # and lets the planner pick zigzag or contiguous after the search; "zigzag" / "contiguous" pin one
    cp_layout: Literal["auto", "zigzag", "contiguous"] = "contiguous"
    # share of the N repeated blocks that ``recompute`` applies to (k / N, Megatron's "recompute the first k
    # layers"); the others keep every activation.  Compute, re-issued moves and kept activations scale with
    # it, the working set (one block re-run at a time) does not: problem/mix.py
    recompute_share: float = 1.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.recompute_share <= 1.0:
            raise ValueError(f"CostOptions.recompute_share must be in [0, 1], got {self.recompute_share!r}")
        if (
            isinstance(self.microbatches, bool)
            or not isinstance(self.microbatches, int)
            or self.microbatches < 1
        ):
            raise ValueError(
                f"CostOptions.microbatches must be a whole number >= 1, got {self.microbatches!r}"
            )

    def adam_bytes(self, itemsize: int) -> int:
        """Optimizer state per element: the precision policy's, else fp32 master + m + v for 16-bit
        parameters and m + v for fp32 ones."""
        if self.precision is not None:
            return self.precision.recipe().optimizer
        return 12 if itemsize <= 2 else 8

    def grad_bytes(self, itemsize: int) -> int:
        """Gradient bytes per element: the precision policy's, else the parameter's own itemsize."""
        return itemsize if self.precision is None else self.precision.recipe().gradients


def repeats(opts: CostOptions, *, parameter: bool, backward: bool) -> int:
    """How often per step a cost of one microbatch occurs: once for a parameter's gradient synchronisation
    (the backward of a parameter edge), ``microbatches`` times for everything else (compute, activation
    traffic both ways, a sharded parameter's forward gather)."""
    return 1 if (parameter and backward) else opts.microbatches


def _local_bytes(nbytes: int, spec: ShardingSpec | None, mesh_shape: tuple[int, ...]) -> float:
    if spec is None:
        return float(nbytes)
    return nbytes / _shards(spec, tuple(mesh_shape))


@functools.lru_cache(maxsize=8192)  # isinstance on torch placements is slow; a plan sees few distinct specs
def _shards(spec: ShardingSpec, mesh_shape: tuple[int, ...]) -> int:
    """Pieces a tensor under ``spec`` is cut into: the product of the axes that shard it."""
    shards = 1
    for p, size in zip(spec.placements, mesh_shape, strict=True):
        if isinstance(p, Shard):
            shards *= size
    return shards


def node_compute(
    info: NodeInfo, strategy: OpStrategy, cluster: Cluster, opts: CostOptions, inputs: tuple[NodeInfo, ...]
) -> tuple[float, float]:
    """(forward seconds, backward seconds) of ``info`` under ``strategy`` on one device."""
    if info.kind != "op":
        return 0.0, 0.0
    fwd, hidden = compute_parts(
        info, strategy, cluster, opts.training, inputs, autocast=uses_autocast(opts.precision)
    )

    def ring(f: float, b: float) -> tuple[float, float]:
        return ring_seconds(info, strategy, cluster, inputs, f, b, opts.cp_layout, opts.precision)

    f, b = timed(info, fwd, hidden, grad_factor(info, inputs), opts, ring)
    return float(f), float(b)


def compute_parts(
    info: NodeInfo,
    strategy: OpStrategy,
    cluster: Cluster,
    training: bool,
    inputs: tuple[NodeInfo, ...],
    sizes: tuple[int | None, ...] | None = None,
    autocast: bool = False,
) -> tuple[float, tuple[float, float]]:
    """What :func:`node_compute` prices before recomputation and context parallelism (an op's node only):
    the op's forward seconds (0 for a view) and the hidden casts / loss (``hidden_seconds``).  The builder
    keeps these per strategy and composes every recomputation policy from them (:func:`timed`);
    ``sizes``: :func:`operand_bytes`, worked out once for all of a node's strategies."""
    mesh = cluster.mesh_shape
    sizes = operand_bytes(info, inputs) if sizes is None else sizes
    ins, outs = sizes[: len(inputs)], sizes[len(inputs) :]
    moved = 0.0
    for nbytes, spec in zip(ins, strategy.inputs, strict=True):
        if nbytes is not None:
            moved += _local_bytes(nbytes, spec, mesh)
    for nbytes, spec in zip(outs, strategy.outputs, strict=False):
        if nbytes is not None:
            moved += _local_bytes(nbytes, spec, mesh)
    dtype = next((t.dtype for t in info.outputs if t is not None), "float32")
    local = _local_bytes(outs[0], strategy.outputs[0], mesh) if outs[0] is not None else 0.0
    hidden = hidden_seconds(info, inputs, moved, local, cluster, training)  # casts, the loss
    hidden = _plus(hidden, extra_seconds(info, inputs, moved, local, cluster, training))  # strided, sums
    if autocast:  # the amp recipe: fp32 activations, autocast's casts (problem/autocast.py)
        hidden = _plus(hidden, autocast_seconds(info, inputs, moved, local, cluster, training))
    if info.is_view:
        return 0.0, hidden
    # shape-aware rate (cost_models.compute): tile/wave quantisation of the local GEMM, fused attention's own
    # efficiency; priced by scaling the FLOPs the roofline sees
    factor = _shape_factor(info, strategy, inputs, cluster)
    share, unread = causal_attention(info, strategy, inputs, mesh)  # a proven causal mask: the triangle
    fwd = cluster.compute_time(info.flops * share / strategy.work_divisor / factor, moved - unread, dtype)
    return fwd, hidden


def operand_bytes(info: NodeInfo, inputs: tuple[NodeInfo, ...]) -> tuple[int | None, ...]:
    """Bytes of each input the node reads, then of each output (None where not a tensor)."""
    read = [
        (src.outputs[which].nbytes if which < len(src.outputs) and src.outputs[which] is not None else None)  # type: ignore[union-attr]
        for src, which in zip(inputs, info.input_outputs, strict=True)
    ]
    return (*read, *(None if meta is None else meta.nbytes for meta in info.outputs))


def grad_factor(info: NodeInfo, inputs: tuple[NodeInfo, ...]) -> float:
    """Backward kernels per forward, each about its forward: a product's or quotient's, one per operand that
    needs a gradient (torch's derivatives.yaml: d(a·b) = b·da + a·db; fc1 on the user's input: the weight's
    only); 2 for another matrix-like op; 1 for every other elementwise op."""
    operands = _PRODUCTS.get(info.op)
    if operands is None:
        return 2.0 if info.is_matmul_like else 1.0
    return float(max(1, sum(1 for src in inputs[operands] if src.requires_grad)))


#: Products by their operands among a node's inputs (a matrix product's first two: x and the weight)
_PRODUCTS: dict[str, slice] = {op: slice(2) for op in ("linear", "mm", "matmul", "bmm")}
_PRODUCTS |= {"mul": slice(None), "div": slice(None)}


def timed(
    info: NodeInfo,
    fwd: Seconds,
    hidden: tuple[Seconds, Seconds],
    grads: float,
    opts: CostOptions,
    ring: Callable[[Any, Any], tuple[Any, Any]],
) -> tuple[Seconds, Seconds]:
    """(forward, backward) seconds of an op from :func:`compute_parts` under ``opts``' recomputation: floats
    for one strategy or arrays over a node's strategies alike (the same float operations in the same order,
    so both give the same bits).  ``ring(fwd, bwd)``: what context parallelism adds (``ring_seconds``)."""
    again = recomputed(info, opts.recompute)
    if info.is_view:  # a cast re-runs with its recomputed block
        return hidden[0], hidden[1] + (hidden[0] * opts.recompute_share if again else 0)
    if not (opts.training and info.requires_grad):
        return fwd + ring(fwd, 0.0)[0] + hidden[0], 0.0
    bwd = fwd * grads
    ring_fwd, ring_bwd = ring(fwd, bwd)  # CP only
    if again and opts.recompute_share:
        bwd = bwd + fwd * opts.recompute_share  # only the recomputed blocks re-run it
        ring_bwd = ring_bwd + ring_fwd * opts.recompute_share  # a ring's forward hops and imbalance with it
    return fwd + ring_fwd + hidden[0], bwd + ring_bwd + hidden[1]


def _plus(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
    return a[0] + b[0], a[1] + b[1]


def recomputed(info: NodeInfo, policy: Recompute) -> bool:
    """Whether backward re-runs this node's forward under ``policy`` (block nodes only)."""
    if info.block is None or policy is Recompute.NONE:
        return False
    return policy is Recompute.FULL or not info.is_matmul_like


_GEMM_OPS = frozenset({"linear", "mm", "addmm", "matmul", "bmm", "baddbmm"})
_ATTENTION_OPS = frozenset(
    {"scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
     "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention"}
)  # fmt: skip


def _local_shape(shape: tuple[int, ...], spec: ShardingSpec | None, mesh: tuple[int, ...]) -> tuple[int, ...]:
    dims = list(shape)
    if spec is not None:
        for p, size in zip(spec.placements, mesh, strict=True):
            if isinstance(p, Shard) and p.dim < len(dims):
                dims[p.dim] = -(-dims[p.dim] // size)
    return tuple(dims)


def _shape_factor(
    info: NodeInfo, strategy: OpStrategy, inputs: tuple[NodeInfo, ...], cluster: Cluster
) -> float:
    """Fraction of η_max the op reaches for its local shape: ``gemm_efficiency`` of a matrix product's local
    M × N output, ``attention_efficiency / efficiency_max`` for fused attention, 1 otherwise."""
    profile = cluster.profile
    if info.op in _ATTENTION_OPS:
        c = profile.compute
        return (c.attention_efficiency or c.efficiency_max) / c.efficiency_max
    if info.op not in _GEMM_OPS or len(inputs) < 2:
        return 1.0
    shapes = []
    for src, which, spec in zip(inputs, info.input_outputs, strategy.inputs, strict=True):
        meta = src.outputs[which] if which < len(src.outputs) else None
        shapes.append(None if meta is None else _local_shape(tuple(meta.shape), spec, cluster.mesh_shape))
    a, b = (shapes[0], shapes[1]) if info.op == "linear" else (shapes[-2], shapes[-1])
    if a is None or b is None or len(a) < 1 or len(b) < 1:
        return 1.0
    batch, k = 1, a[-1]
    if info.op == "linear":
        m, n = math.prod(a[:-1]), b[0]
    elif info.op in ("bmm", "baddbmm") and len(a) == 3 and len(b) == 3:
        batch, m, n = a[0], a[1], b[2]
    else:
        m, n = math.prod(a[:-1]), (b[-1] if len(b) >= 2 else 1)
    if m < 1 or n < 1:
        return 1.0
    first = (
        inputs[0].outputs[info.input_outputs[0]] if info.input_outputs[0] < len(inputs[0].outputs) else None
    )
    return gemm_efficiency(m, n, profile, batch, k, first.itemsize if first is not None else 0)


def node_memory(
    info: NodeInfo, strategy: OpStrategy, cluster: Cluster, opts: CostOptions, keeps: bool
) -> float:
    """Bytes one device holds for this node: parameter state, buffers, or saved activations.

    ``keeps`` says whether backward keeps this node's output (decided by the builder from the recompute
    policy and the graph around the node).
    """
    mesh = cluster.mesh_shape
    meta = info.outputs[0]
    if meta is None:
        return 0.0
    spec = strategy.outputs[0]
    local = _local_bytes(meta.nbytes, spec, mesh)
    if info.kind == "parameter":
        if not opts.training:
            return local
        grads = local * opts.grad_bytes(meta.itemsize) / meta.itemsize
        return (
            local * weight_bytes(meta.itemsize, opts.precision) / meta.itemsize
            + grads
            + _optimizer_elements(meta.numel, spec, cluster, opts) * opts.adam_bytes(meta.itemsize)
        )
    if info.kind in ("buffer", "constant", "user_input"):
        return local
    held = 0.0
    if opts.training and info.is_output and info.requires_grad and meta.dtype.startswith(("float", "bfloat")):
        # the loss upcasts a returned float tensor (logits) to fp32 and keeps it and its gradient
        held += 8 * local / meta.itemsize
    if opts.training and keeps and info.requires_grad and not info.is_view:
        return held + local * autocast_scale(info, opts.precision)
    return held


def optimizer_time(info: NodeInfo, strategy: OpStrategy, cluster: Cluster, opts: CostOptions) -> float:
    """Seconds of the optimizer update of a parameter shard: memory-bound over its state."""
    if not (opts.training and info.kind == "parameter" and info.outputs[0] is not None):
        return 0.0
    meta = info.outputs[0]
    numel = _optimizer_elements(meta.numel, strategy.outputs[0], cluster, opts)
    if uses_autocast(opts.precision):  # amp: fp32 weights, autocast
        return autocast_update_seconds(numel, opts.precision, cluster)
    state = numel * (opts.adam_bytes(meta.itemsize) + 2 * meta.itemsize)  # read and write state, param, grad
    casts = master_cast_seconds(numel, meta.itemsize, opts.adam_bytes(meta.itemsize), cluster)
    return cluster.compute_time(numel * 10, 2 * state, "float32") + casts


def _optimizer_elements(numel: int, spec: ShardingSpec | None, cluster: Cluster, opts: CostOptions) -> float:
    if opts.shard_optimizer:
        return numel / cluster.num_devices
    return _local_bytes(numel, spec, cluster.mesh_shape)
