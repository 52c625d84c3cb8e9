"""Device time the captured graph's FLOPs do not show: dtype casts, and the loss after the returned logits.

Input: one node's :class:`~autoshard.problem.graph.NodeInfo`, its input nodes, the bytes the node moves on one
device (local shapes), the cluster and whether the step trains.
Output: (forward seconds, backward seconds) to add to the node's compute, memory-bound at the profile's
achieved bandwidth (:meth:`Cluster.compute_time` with no FLOPs).

* **casts**: ``_to_copy`` / ``to`` / ``type_as`` that change the dtype are labelled views for memory (backward
  keeps nothing of theirs), but each runs a copy kernel that reads one dtype and writes the other, and its
  backward casts the gradient back (HF's RMSNorm upcasts to fp32 and back twice per layer).  A narrowing
  cast runs at the roofline (its bytes); a widening one runs torch's unvectorised conversion loop,
  ``UPCAST_BYTES`` per output element;
* **the loss**: the planner's graph ends at the logits; training computes cross-entropy on their fp32 upcast
  (the memory model already holds those fp32 logits and their gradient, :func:`costs.node_memory`).  Per
  logit: the cast (widening: ``UPCAST_BYTES``) and ``log_softmax`` forward; backward, the zero fill of the
  logits' gradient (``nll_loss`` backward, ``GRAD_FILL_BYTES``), ``log_softmax``'s backward and the cast of
  the gradient back.  ``LOG_SOFTMAX_BYTES``, the bytes per fp32 element each of the two softmax kernels
  costs, is measured.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # graph.py reads problem/autocast.py, which reads this module
    from autoshard.cluster import Cluster
    from autoshard.problem.graph import NodeInfo

__all__ = ["GRAD_FILL_BYTES", "LOG_SOFTMAX_BYTES", "UPCAST_BYTES", "hidden_seconds"]

LOG_SOFTMAX_BYTES = 16.0
"""Bytes per fp32 logit that torch's ``log_softmax`` forward, and again its backward, costs at the achieved
HBM bandwidth: measured on an H100 80GB (benchmarks/results/gpu_step_ops_llama-1b.txt, 2026-11-24):
``cunn_SoftMaxForward`` 5.55 ms and ``cunn_SoftMaxBackward`` 5.70 ms over 4 x 2048 x 128256 logits at the
h100x8 profile's 3.015 TB/s are 15.9 and 16.4 bytes per element (GPT-2's 8 x 1024 x 50257: 15.1 and 16.7);
forward reads its input twice (max, then sum of exponentials) and writes once, backward reads two and writes
one."""

UPCAST_BYTES = 9.7
"""Bytes of achieved HBM bandwidth per output element of a widening cast (bf16 -> fp32: 2 read, 4 written,
6 at the roofline): torch runs it through the unvectorised ``unrolled_elementwise_kernel<direct_copy_kernel>``.
Measured on an H100 80GB (benchmarks/results/gpu_kernels.json, 2026-11-24 second session): ``x.float()`` of
16 M and 64 M bf16 elements, 10.08 and 9.37 bytes per element at the copy's 2.994 TB/s; the narrowing cast
ran 6.62 and 6.06 (the roofline's 6).  In a training step (gpu_step_ops_llama-1b.txt): the norms' and the
master copy's casts, ``copy_`` of [4, 2048, 2048] 44.9 us on average over 165 calls, up and down alike."""

GRAD_FILL_BYTES = 4.0
"""Bytes per logit of the zero fill of the fp32 logits' gradient before ``nll_loss`` backward scatters into
it: measured ``fill_`` of [8192, 128256] fp32, 1.27 ms on an H100 (gpu_step_ops_llama-1b.txt, 2026-11-24)
= 4.0 bytes per element at the h100x8 profile's 3.015 TB/s (one fp32 write)."""

_CASTS = frozenset({"_to_copy", "to", "type_as"})


def hidden_seconds(
    info: NodeInfo, inputs: tuple[NodeInfo, ...], moved: float, local: float, cluster: Cluster, training: bool
) -> tuple[float, float]:
    """(forward, backward) seconds of a cast (``moved``: the bytes it reads and writes) or of the loss on a
    returned float tensor of ``local`` bytes on this device; (0, 0) for any other node."""
    out = info.outputs[0] if info.outputs else None
    if out is None:
        return 0.0, 0.0
    backward = training and info.requires_grad
    if info.op in _CASTS and inputs:
        src = (
            inputs[0].outputs[info.input_outputs[0]]
            if info.input_outputs[0] < len(inputs[0].outputs)
            else None
        )
        if src is None or src.dtype == out.dtype:
            return 0.0, 0.0
        elements = local / out.itemsize
        up = cluster.compute_time(0.0, max(moved, elements * UPCAST_BYTES), out.dtype)
        down = cluster.compute_time(0.0, moved, out.dtype)
        fwd, bwd = (up, down) if out.itemsize > src.itemsize else (down, up)  # backward casts the other way
        return fwd, bwd if backward else 0.0
    if backward and info.is_output and out.dtype.startswith(("float", "bfloat")):
        elements = local / out.itemsize
        up = elements * (UPCAST_BYTES if out.itemsize < 4 else out.itemsize + 4)
        fwd = cluster.compute_time(0.0, up + elements * LOG_SOFTMAX_BYTES, "float32")
        down = elements * (out.itemsize + 4 + GRAD_FILL_BYTES)
        return fwd, cluster.compute_time(0.0, down + elements * LOG_SOFTMAX_BYTES, "float32")
    return 0.0, 0.0
