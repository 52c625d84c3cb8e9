"""The amp recipe's activations: what ``torch.autocast`` changes in a graph captured in the 16-bit dtype.

Input: per node, its op, kind and captured output dtype and its inputs' autocast dtypes (:func:`autocast_dtype`,
called by :func:`autoshard.problem.graph.describe` in graph order); per priced node, its
:class:`~autoshard.problem.graph.NodeInfo`, inputs and bytes (:func:`autocast_seconds`, :func:`autocast_scale`).
Output: each node's dtype under amp (``NodeInfo.autocast_dtype``); seconds to add to a node's compute and the
factor on the activation bytes it keeps, when the plan prices ``precision="amp"``
(:data:`cost_models.memory.AMP_BF16`).

The planner captures the model in its 16-bit dtype; under amp the weights are fp32 and autocast decides each
op's dtype (torch's CUDA autocast op lists):

* matrix products and fused attention (:data:`LOWER`) run in the 16-bit dtype and cast every fp32 operand
  down first, an activation once per use (weights once per forward: the optimizer's
  :func:`~autoshard.problem.elementwise.autocast_update_seconds`), its gradient back up in backward;
* ops of autocast's fp32 list (:data:`UPPER`: norms, ``pow``, ``rsqrt``, softmax, sums) run in fp32;
* every other op runs in the promoted dtype of its float inputs: fp32 as soon as one is (an embedding of fp32
  weights, the residual stream added to a product's 16-bit output, a 16-bit tensor times fp32 ``cos``), the
  16-bit dtype when all are (a view or activation of a product's output, also in a graph captured in fp32);
* a cast to the model's dtype (HF's ``.to(input_dtype)``) casts to fp32, the model's dtype under amp: a cast
  whose source already has its target dtype runs nothing.

Priced (:func:`autocast_seconds`): an op's bytes at its operands' amp dtypes instead of the captured ones
(forward, and backward once per gradient it yields), the activation casts in front of matrix products, and
the casts that no longer run taken back out.  Not priced: the elementwise extras of
:mod:`autoshard.problem.elementwise` stay at the captured dtype; a sharded operand's bytes are scaled by the
output's shard (exact on one device).

Moved (:func:`moved_itemsize`, read by every redistribution the intra-op problem prices and by the
``Plan.collectives`` it reports): a tensor moves, and its gradient comes back, in its producer's amp dtype --
a product's 16-bit output, the fp32 residual stream and norms.  A parameter (fp32 under amp) moves as the
recipe says, FSDP2's mixed precision (``PrecisionPolicy.gather_dtype`` / ``reduce_dtype``, torch's
``fully_shard`` ``MixedPrecisionPolicy``): its shard is cast to the 16-bit dtype and all-gathered in it (half
the bytes of an fp32 gather), its gradient reduced (reduce-scattered, or all-reduced when replicated) in fp32.
The gathered buffer, held while its consumer runs, is the 16-bit one (:mod:`autoshard.problem.extras`).  The
emitted program does the same under autocast (:func:`autoshard.codegen.collectives.gather_dtype`).

Ring hops (:func:`ring_itemsize`, read by :func:`autoshard.problem.attention.ring_block_bytes`): autocast
casts every float operand of fused attention to the 16-bit dtype before it runs, so a ring's K/V blocks and
their gradients travel in it -- the K of HF's rotary (fp32 under amp: ``k * cos`` with fp32 ``cos``) at half
its moved bytes.  :func:`autoshard.codegen.context.context_sdpa` casts q, k, v as autocast would before the
ring when autocast is on, so the emitted hops carry exactly these bytes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from autoshard.problem.hidden_ops import UPCAST_BYTES, hidden_seconds
from cost_models.memory import itemsize

if TYPE_CHECKING:  # graph.py reads this module
    from autoshard.cluster import Cluster
    from autoshard.problem.graph import NodeInfo
    from cost_models.memory import PrecisionPolicy

__all__ = [
    "LOWER",
    "UPPER",
    "autocast_dtype",
    "autocast_scale",
    "autocast_seconds",
    "moved_itemsize",
    "recast_parameter",
    "ring_itemsize",
    "uses_autocast",
    "weight_bytes",
]

LOWER = frozenset(
    {"linear", "mm", "addmm", "matmul", "bmm", "baddbmm", "conv1d", "conv2d", "convolution",
     "scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
     "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention"}
)  # fmt: skip
UPPER = frozenset(
    {"layer_norm", "native_layer_norm", "group_norm", "pow", "rsqrt", "exp", "log", "softmax", "log_softmax",
     "_softmax", "_log_softmax", "sum", "cumsum", "prod", "norm", "logsumexp", "reciprocal"}
)  # fmt: skip
_CASTS = frozenset({"_to_copy", "to", "type_as"})
_FLOATS = ("float", "bfloat")


def autocast_dtype(op: str, kind: str, dtype: str | None, inputs: Sequence[str], model_dtype: str) -> str:
    """A node's output dtype under amp (module doc): ``dtype`` captured, ``inputs`` its float inputs' amp
    dtypes, ``model_dtype`` the captured parameters' 16-bit dtype; "" for a node without a tensor output."""
    if dtype is None:
        return ""
    if not dtype.startswith(_FLOATS):
        return dtype
    if kind in ("parameter", "buffer", "constant"):
        return "float32" if dtype == model_dtype else dtype
    if kind != "op":
        return dtype
    if op in LOWER:
        return model_dtype
    if op in UPPER:
        return "float32"
    if op in _CASTS:
        return "float32" if dtype == model_dtype else dtype
    floats = [d for d in inputs if d.startswith(_FLOATS)]
    if "float32" in floats:
        return "float32"
    if floats and dtype == "float32" and all(d == model_dtype for d in floats):
        return model_dtype  # a graph captured in fp32: 16-bit operands (a product's output) stay 16-bit
    return dtype


def uses_autocast(policy: PrecisionPolicy | None) -> bool:
    """Whether ``policy`` (``CostOptions.precision``) is an autocast recipe."""
    return policy is not None and policy.autocast is not None


def moved_itemsize(
    info: NodeInfo, which: int, policy: PrecisionPolicy | None, *, gradient: bool = False
) -> int:
    """Bytes per element of ``info``'s output ``which`` as a redistribution moves it forward, or (with
    ``gradient``) as its gradient comes back: its amp dtype's (``NodeInfo.autocast_dtype``) under an
    autocast ``policy``, else the captured tensor's own -- but an fp32 parameter moves (is all-gathered) in
    the policy's ``gather_dtype`` and its gradient in its ``reduce_dtype`` (module doc).  Outputs of another
    dtype than the first (integer indices) keep theirs."""
    meta = info.outputs[which]
    assert meta is not None
    amp, first = info.autocast_dtype, info.outputs[0]
    if not uses_autocast(policy) or first is None or meta.dtype != first.dtype:
        return meta.itemsize
    assert policy is not None
    recast = policy.reduce_dtype if gradient else policy.gather_dtype
    if recast is not None and recast_parameter(info, policy):
        return itemsize(recast)
    return meta.itemsize if amp in ("", meta.dtype) else itemsize(amp)


def recast_parameter(info: NodeInfo, policy: PrecisionPolicy | None) -> bool:
    """Whether ``info`` is a parameter that moves in ``policy``'s gather and reduce dtypes (module doc): an
    fp32 parameter under an autocast recipe that names them.  The emitted program casts those gathers
    (:func:`autoshard.codegen.collectives.gather_dtype`)."""
    return (
        uses_autocast(policy)
        and policy is not None
        and (policy.gather_dtype, policy.reduce_dtype) != (None, None)
        and info.kind == "parameter"
        and info.autocast_dtype == "float32"
    )


def ring_itemsize(info: NodeInfo, captured: int, policy: PrecisionPolicy | None) -> int:
    """Bytes per element of a K or V block (``captured`` bytes per element in the graph) as ring attention
    ``info`` rotates it: under an autocast ``policy``, the attention's own amp dtype (autocast's 16-bit
    dtype, to which it casts every float operand first: module doc), else ``captured``."""
    if not uses_autocast(policy) or not info.autocast_dtype.startswith(_FLOATS):
        return captured
    return itemsize(info.autocast_dtype)


def weight_bytes(itemsize: int, policy: PrecisionPolicy | None) -> int:
    """Weight bytes per parameter element: the precision policy's (amp: fp32 and the bf16 copy autocast keeps
    for backward), else the parameter's own ``itemsize``."""
    return itemsize if policy is None else policy.recipe().weights


def _amp_bytes(meta: object, amp: str) -> float:
    nbytes = float(getattr(meta, "nbytes", 0))
    size = getattr(meta, "itemsize", 0)
    return nbytes * (4 if amp == "float32" else 2) / size if size and amp.startswith(_FLOATS) else nbytes


def autocast_scale(info: NodeInfo, policy: PrecisionPolicy | None) -> float:
    """Factor on the bytes of an op's output under ``policy`` (1 without autocast): fp32 activations kept
    for backward take twice their captured 16-bit bytes."""
    out = info.outputs[0] if info.outputs else None
    if not uses_autocast(policy) or out is None or info.kind != "op" or not out.nbytes:
        return 1.0
    return _amp_bytes(out, info.autocast_dtype) / out.nbytes


def autocast_seconds(
    info: NodeInfo, inputs: tuple[NodeInfo, ...], moved: float, local: float, cluster: Cluster, training: bool
) -> tuple[float, float]:
    """(forward, backward) seconds amp adds to ``info``'s captured price (negative where a cast no longer
    runs); ``moved``: the bytes it reads and writes, ``local``: its output's bytes, both on this device."""
    out = info.outputs[0] if info.outputs else None
    if out is None or info.kind != "op" or not out.nbytes:
        return 0.0, 0.0
    backward = training and info.requires_grad
    metas = [
        src.outputs[w] if w < len(src.outputs) else None
        for src, w in zip(inputs, info.input_outputs, strict=True)
    ]
    if info.op in _CASTS:
        source = inputs[0].autocast_dtype if inputs else ""
        if source == info.autocast_dtype:  # the cast runs nothing under amp
            f, b = hidden_seconds(info, inputs, moved, local, cluster, training)
            return -f, -b
        return 0.0, 0.0
    shard = local / out.nbytes  # this device's share of the output (and, approximately, of each operand)
    if info.op in LOWER:  # autocast's casts of fp32 activations, one per use
        fwd = bwd = 0.0
        for src, meta in zip(inputs, metas, strict=True):
            if meta is None or src.kind != "op" or src.autocast_dtype != "float32":
                continue
            elements = math.prod(meta.shape) * shard
            fwd += cluster.compute_time(0.0, elements * 6, info.autocast_dtype)
            if backward and src.requires_grad:
                bwd += cluster.compute_time(0.0, elements * UPCAST_BYTES, "float32")
        return fwd, bwd
    if info.is_view:
        return 0.0, 0.0
    captured = sum(float(m.nbytes) for m in metas if m is not None) + out.nbytes
    amp = sum(_amp_bytes(m, s.autocast_dtype) for s, m in zip(inputs, metas, strict=True) if m is not None)
    ratio = (amp + _amp_bytes(out, info.autocast_dtype)) / captured
    if ratio == 1.0:
        return 0.0, 0.0
    delta = cluster.compute_time(0.0, moved * ratio, "float32") - cluster.compute_time(0.0, moved, "float32")
    grads = sum(1 for s in inputs if s.requires_grad) if info.op in ("mul", "div") else 1
    return delta, delta * max(1, grads) if backward else 0.0
