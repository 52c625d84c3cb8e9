"""Device time the captured graph's FLOPs do not show: dtype casts, and the loss after the returned logits.

Input: one node's :class:`~autoshard.problem.graph.NodeInfo`, its input nodes, the bytes the node moves on one
device (local shapes), the cluster and whether the step trains.
Output: (forward seconds, backward seconds) to add to the node's compute, memory-bound at the profile's
achieved bandwidth (:meth:`Cluster.compute_time` with no FLOPs).

* **casts**: ``_to_copy`` / ``to`` / ``type_as`` that change the dtype are labelled views for memory (backward
  keeps nothing of theirs), but each runs a copy kernel that reads one dtype and writes the other, and its
  backward casts the gradient back (HF's RMSNorm upcasts to fp32 and back twice per layer);
* **the loss**: the planner's graph ends at the logits; training computes cross-entropy on their fp32 upcast
  (the memory model already holds those fp32 logits and their gradient, :func:`costs.node_memory`).  Per
  logit: the cast (itemsize read, 4 bytes written) and ``log_softmax`` forward; backward, ``log_softmax``'s
  backward and the cast of the gradient back.  ``LOG_SOFTMAX_BYTES``, the bytes per fp32 element each of the
  two softmax kernels costs, is measured.
"""

from __future__ import annotations

from autoshard.cluster import Cluster
from autoshard.problem.graph import NodeInfo

__all__ = ["LOG_SOFTMAX_BYTES", "hidden_seconds"]

LOG_SOFTMAX_BYTES = 16.0
"""Bytes per fp32 logit that torch's ``log_softmax`` forward, and again its backward, costs at the achieved
HBM bandwidth: measured on an H100 80GB (benchmarks/results/gpu_step_ops_llama-1b.txt, 2026-11-24):
``cunn_SoftMaxForward`` 5.55 ms and ``cunn_SoftMaxBackward`` 5.70 ms over 4 x 2048 x 128256 logits at the
h100x8 profile's 3.015 TB/s are 15.9 and 16.4 bytes per element (GPT-2's 8 x 1024 x 50257: 15.1 and 16.7);
forward reads its input twice (max, then sum of exponentials) and writes once, backward reads two and writes
one."""

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
        fwd = cluster.compute_time(0.0, moved, out.dtype)
        return fwd, fwd if backward else 0.0
    if backward and info.is_output and out.dtype.startswith(("float", "bfloat")):
        elements = local / out.itemsize
        cast = elements * (out.itemsize + 4)
        fwd = cluster.compute_time(0.0, cast + elements * LOG_SOFTMAX_BYTES, "float32")
        return fwd, cluster.compute_time(0.0, cast + elements * LOG_SOFTMAX_BYTES, "float32")
    return 0.0, 0.0
