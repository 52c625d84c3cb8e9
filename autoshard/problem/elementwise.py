"""Device time of elementwise work that a node's bytes at full bandwidth do not show.

Input: one node's :class:`~autoshard.problem.graph.NodeInfo`, its input nodes, the bytes the node moves and
its output's bytes on one device (local shapes), the cluster and whether the step trains.
Output: (forward seconds, backward seconds) to add to the node's compute (:func:`extra_seconds`).

Each term is a kernel torch runs that the graph shows only indirectly, measured on an H100 training step
(benchmarks/results/gpu_step_ops_llama-1b.txt, section 6 of gpu_h100_2026-11-24.md):

* **gradient accumulation**: a tensor read by k > 1 consumers that need its gradient gets k gradients, and
  autograd sums them: k - 1 ``add`` kernels of the tensor's size (read two, write one).  HF LLaMA: the
  residual stream, a norm's output feeding q/k/v or gate/up, q and k feeding both halves of the rotary
  embedding, the fp32 upcast feeding ``pow`` and ``mul`` (145 bf16 + 33 fp32 ``add`` calls measured,
  145 + 33 counted from the graph, 128 + 33 priced: consumers in another repeated block, such as a layer's
  output read by the next layer, are left out so that every copy of a block prices alike).  Not for a
  multi-output node (``split``, ``chunk``): its consumers take different outputs, whose gradients are
  concatenated, not summed;
* **strided elementwise kernels**: a binary op with a broadcast operand (a norm's weight, ``rsqrt`` of the
  variance, rotary ``cos``/``sin``) or a transposed one runs TensorIterator's non-vectorised loop, which is
  bound by index arithmetic, not by HBM: at least ``STRIDED_BYTES_PER_ELEMENT`` of achieved bandwidth per
  output element.  Its backward runs the same loop once per full-size operand that needs a gradient;
* **a broadcast operand's gradient**: ``d(w * x)/dw`` is the full-size product summed over the broadcast
  dimensions, a reduction that reads the product once more (the product itself is already priced as the
  op's backward kernel, :func:`autoshard.problem.costs.grad_factor`);
* **master-weight casts** (:func:`master_cast_seconds`, the optimizer's): 16-bit weights updated through an
  fp32 master copy cast each gradient up and each master back down, ``MASTER_CAST_BYTES`` per element;
* **a linear layer's bias gradient**: the output gradient summed over the rows, one more read of it
  (GPT-2's ``addmm``: 49 bf16 ``sum`` reductions measured);
* **layer norms**: torch's fused ``layer_norm`` kernels run at ``LAYER_NORM_BYTES`` per element forward and
  backward, above the roofline's bytes;
* **copies behind view-like ops**: ``contiguous`` of a transposed / permuted / sliced tensor and ``clone``
  copy it (read and write) and their backward copies the gradient back into the strided layout.

Not priced here, and why: a ``reshape`` of an ``expand`` (HF's ``repeat_kv`` under capture) is a copy in the
captured graph, but eager torch passes ``enable_gqa`` to SDPA and never runs it; kernels' launch gaps on a
slow host are the profile's ``launch_floor``.
"""

from __future__ import annotations

import math

from autoshard.cluster import Cluster
from autoshard.errors import ProfileError
from autoshard.problem.graph import NodeInfo
from autoshard.problem.hidden_ops import UPCAST_BYTES
from cost_models.memory import FOREACH_ADAMW_BYTES, RECIPES, PrecisionPolicy, itemsize

__all__ = [
    "LAYER_NORM_BYTES",
    "MASTER_CAST_BYTES",
    "STRIDED_BYTES_PER_ELEMENT",
    "autocast_update_seconds",
    "extra_seconds",
    "master_cast_seconds",
    "recipe",
]

MASTER_CAST_BYTES = UPCAST_BYTES + 6
"""Bytes per parameter element a step with an fp32 master copy of 16-bit weights casts: the gradient up to
fp32 (a widening cast, ``UPCAST_BYTES``) and the updated master back into the weight (4 read + 2 written, at
the roofline).  Measured on an H100 (benchmarks/results/gpu_step_ops_llama-1b.txt, second session: the
``copy_`` calls of parameter shapes, 6.97 ms for 1.24 B parameters = 17.0 bytes each at 3.015 TB/s, small
tensors at the launch floor included; the first session's 12 came from a profile that mixed in the norms'
casts)."""

LAYER_NORM_BYTES = (9.2, 23.8)
"""Bytes of achieved HBM bandwidth per element of torch's fused ``native_layer_norm`` (forward) and
``native_layer_norm_backward`` (dx, and the weight and bias gradients' column sums), 16-bit input: fitted on
GPT-2 (benchmarks/results/gpu_step_ops_gpt2.txt, H100, 2026-11-24 second session: 25 calls of 8 x 1024 x 768,
0.480 ms forward, 1.240 ms backward, at the h100x8 profile's 3.015 TB/s); BERT-base, held out, ran 8.9 and
26.7 (gpu_step_ops_bert-base.txt).  The roofline counts 4 forward (read, write) and 6 backward."""

STRIDED_BYTES_PER_ELEMENT = 9.8
"""Least bytes of achieved HBM bandwidth a non-vectorised (broadcast or strided operand) binary elementwise
kernel costs per output element.  Measured on an H100 80GB (benchmarks/results/gpu_step_ops_llama-1b.txt,
2026-11-24): ``elementwise_kernel<128, 4, ... BinaryFunctor<BFloat16 ...>>`` 7.56 ms over 194 calls (2453 M
output elements: rotary ``mul`` of q and k forward and backward, the norm weight's ``mul``) and
``elementwise_kernel<128, 2, ... BinaryFunctor<float ...>>`` 3.98 ms over 66 calls (1107 M elements: ``x *
rsqrt(var)`` forward and backward), 11.54 ms for 3560 M elements at the h100x8 profile's 3.015 TB/s = 9.8
bytes per element, where the roofline counts 4 (bf16) and 8 (fp32)."""

_BINARY = frozenset({"mul", "div", "add", "sub"})
_STRIDED_VIEWS = frozenset({"transpose", "permute", "t", "slice", "narrow", "select", "expand", "as_strided"})
_COPIES = frozenset({"contiguous", "clone"})
_LAYER_NORMS = frozenset({"layer_norm", "native_layer_norm"})
_BIASED = {"linear": 2, "addmm": 0}  # where the bias is among the inputs


def _numel(node: NodeInfo, which: int) -> int:
    meta = node.outputs[which] if which < len(node.outputs) else None
    return 0 if meta is None else math.prod(meta.shape)


def extra_seconds(
    info: NodeInfo, inputs: tuple[NodeInfo, ...], moved: float, local: float, cluster: Cluster, training: bool
) -> tuple[float, float]:
    """(forward, backward) seconds of the kernels listed in the module doc that ``info`` runs on one device;
    ``moved``: the bytes the node reads and writes, ``local``: its output's bytes (local shapes)."""
    out = info.outputs[0] if info.outputs else None
    if out is None or info.kind != "op" or local <= 0:
        return 0.0, 0.0
    backward = training and info.requires_grad
    fwd = bwd = 0.0
    if backward and info.grad_users > 1 and len(info.outputs) == 1:  # autograd sums the consumers' gradients
        bwd += (info.grad_users - 1) * cluster.compute_time(0.0, 3 * local, out.dtype)
    if info.op in _COPIES and inputs and (info.op == "clone" or inputs[0].op in _STRIDED_VIEWS):
        fwd += cluster.compute_time(0.0, 2 * local, out.dtype)
        bwd += fwd if backward else 0.0
    if backward and info.op in _BIASED and len(inputs) == 3 and inputs[_BIASED[info.op]].requires_grad:
        bwd += cluster.compute_time(0.0, local, out.dtype)  # the bias gradient's row sum
    if info.op in _LAYER_NORMS:  # the fused kernels' excess over the roofline (forward, and backward's)
        elements, base = local / out.itemsize, cluster.compute_time(0.0, moved, out.dtype)
        fwd += max(0.0, cluster.compute_time(0.0, elements * LAYER_NORM_BYTES[0], out.dtype) - base)
        if backward:
            bwd += max(0.0, cluster.compute_time(0.0, elements * LAYER_NORM_BYTES[1], out.dtype) - base)
    if info.op in _BINARY and len(inputs) >= 2:
        f, b = _strided(info, inputs, moved, local, cluster)
        fwd += f
        bwd += b if backward else 0.0
    return fwd, bwd


def _strided(
    info: NodeInfo, inputs: tuple[NodeInfo, ...], moved: float, local: float, cluster: Cluster
) -> tuple[float, float]:
    """A binary op with a broadcast or strided tensor operand: the non-vectorised loop's excess over the
    roofline (forward, and per full-size operand needing a gradient), plus the reduction of each broadcast
    operand's gradient."""
    out = info.outputs[0]
    assert out is not None
    total = math.prod(out.shape)
    sizes = [_numel(src, which) for src, which in zip(inputs, info.input_outputs, strict=True)]
    broadcast = [1 < n < total for n in sizes]
    strided = [src.op in _STRIDED_VIEWS and n == total for src, n in zip(inputs, sizes, strict=True)]
    if not any(broadcast) and not any(strided):
        return 0.0, 0.0
    elements = local / out.itemsize
    dtype = out.dtype
    excess = max(
        0.0,
        cluster.compute_time(0.0, elements * STRIDED_BYTES_PER_ELEMENT, dtype)
        - cluster.compute_time(0.0, moved, dtype),
    )
    full_grads = sum(1 for src, b in zip(inputs, broadcast, strict=True) if src.requires_grad and not b)
    reductions = sum(1 for src, b in zip(inputs, broadcast, strict=True) if src.requires_grad and b)
    bwd = excess * full_grads + reductions * cluster.compute_time(0.0, local, dtype)
    return excess, bwd


def master_cast_seconds(numel: float, itemsize: int, state_bytes: int, cluster: Cluster) -> float:
    """Seconds of the master-weight casts of ``numel`` parameter elements of ``itemsize`` bytes whose
    optimizer state is ``state_bytes`` per element: 0 unless the state holds an fp32 master (16-bit
    weights with at least 12 bytes of state: master + two moments).  Two kernels per parameter tensor (the
    up-cast and the down-cast), each at least the launch floor: GPT-2's 148 small tensors are launch-bound
    (gpu_step_ops_gpt2.txt: 2 x 149 cast kernels, 3.4 ms)."""
    if itemsize > 2 or state_bytes < 12 or numel <= 0:
        return 0.0
    return 2 * cluster.compute_time(0.0, numel * MASTER_CAST_BYTES / 2, "float32")  # two kernels each way


def autocast_update_seconds(numel: float, policy: PrecisionPolicy | None, cluster: Cluster) -> float:
    """Seconds per step of ``numel`` fp32 parameter elements under an autocast recipe (``policy.autocast``
    set, :data:`cost_models.memory.AMP_BF16`): the update (foreach AdamW, ``FOREACH_ADAMW_BYTES`` per
    element; fused: state, weight and gradient read and written) and the weight casts autocast runs, each
    weight down to ``policy.autocast`` once per forward (4 read, 2 written) and its gradient back up
    (``UPCAST_BYTES``).  Measured (gpu_step_ops_llama-1b_amp.txt): ``_foreach_*`` kernels 36.2 ms for 1.24 B
    parameters (88 bytes each at 3.015 TB/s).  A recomputed forward casts again; not priced."""
    if numel <= 0 or policy is None or policy.autocast is None:
        return 0.0
    low = itemsize(policy.autocast)
    state = 4 * policy.optimizer_states + 2 * itemsize(policy.param_dtype)
    update = (
        cluster.compute_time(numel * 10, 2 * numel * state, "float32")
        if policy.fused_optimizer
        else cluster.compute_time(numel * 10, numel * FOREACH_ADAMW_BYTES, "float32")
    )
    down = cluster.compute_time(0.0, numel * (4 + low), policy.autocast)
    return update + down + cluster.compute_time(0.0, numel * UPCAST_BYTES, "float32")


def recipe(name: str) -> PrecisionPolicy | None:
    """The precision policy of the planner's ``precision`` keyword (``cost_models.memory.RECIPES``)."""
    if name not in RECIPES:
        raise ProfileError(
            f"precision={name!r} is not a priced training recipe; use one of {', '.join(sorted(RECIPES))}"
        )
    return RECIPES[name]
