"""Gradient sync overlapped with backward: ZeRO-2 reduce-scatters bucketed and issued asynchronously.

Input: the parameters a :class:`~autoshard.runtime.zero.ZeroOptimizer` splits, each with its
:class:`~autoshard.runtime.zero.FlatShard` and flat chunk.  Output: :class:`GradBuckets`, which the optimizer
(``stage=2, overlap=True``) feeds from each parameter's post-accumulate-grad hook.  Parameters whose gradient
is Partial over exactly one mesh axis (data parallel; the common case) are grouped, in reverse registration
order (roughly the order backward produces them), into buckets of about ``bucket_bytes``.  A bucket is one
buffer laid out rank-major -- row ``r`` holds every member's chunk ``r`` -- so one ``reduce_scatter_tensor``
leaves each rank exactly its members' chunks.  When a bucket's last member arrives its reduce-scatter is
issued with ``async_op=True`` and backward goes on; ``finish()`` (called by ``step()``) waits for all and hands
each member its reduced chunk.  Other parameters (Partial over two axes, or gradients already whole) keep the
synchronous path.  Every rank fills buckets in the same order, so the collectives match across ranks.

This is the overlap DDP and ZeRO-2 implementations run; the FSDP all-gather prefetch is not implemented.
The cost model prices gradient sync without overlap today (``autoshard.problem.costs``): overlapping only
hides time it already counts.

Example::

    opt = ZeroOptimizer(module, torch.optim.AdamW, stage=2, overlap=True, lr=1e-3)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from autoshard.codegen.collectives import CollectiveRecord, MeshComm

__all__ = ["BUCKET_BYTES", "GradBuckets"]

BUCKET_BYTES = 25 * 2**20
"""Default bucket size: torch DDP's default ``bucket_cap_mb`` (25 MB)."""


@dataclass
class _Bucket:
    axis: int
    members: list[tuple[Any, Any]]  # (FlatShard, master chunk parameter)
    offsets: list[int]
    width: int  # sum of the members' chunk lengths
    buffer: torch.Tensor | None = None
    arrived: int = 0
    work: Any = None
    out: torch.Tensor | None = None
    index: dict[int, int] = field(default_factory=dict)  # id(master) -> member position


class GradBuckets:
    """Bucketed asynchronous reduce-scatters of ZeRO-2 gradient chunks (module doc)."""

    def __init__(
        self, entries: list[tuple[Any, Any]], comm: MeshComm, bucket_bytes: int = BUCKET_BYTES
    ) -> None:
        self.comm = comm
        self.buckets: list[_Bucket] = []
        self.where: dict[int, _Bucket] = {}
        for flat, master in reversed(entries):
            if len(flat.axes) != 1 or flat.partial != flat.axes:
                continue
            axis, size = flat.axes[0], flat.chunk * flat.ways * master.element_size()
            last = self.buckets[-1] if self.buckets else None
            if (
                last is None
                or last.axis != axis
                or last.width * flat.ways * master.element_size() + size > bucket_bytes
            ):
                last = _Bucket(axis, [], [], 0)
                self.buckets.append(last)
            last.index[id(master)] = len(last.members)
            last.members.append((flat, master))
            last.offsets.append(last.width)
            last.width += flat.chunk
            self.where[id(master)] = last

    def handles(self, master: torch.Tensor) -> bool:
        return id(master) in self.where

    def add(self, master: torch.Tensor, grad: torch.Tensor) -> None:
        """Copy one parameter's whole local gradient into its bucket; issue the bucket when it is full."""
        bucket = self.where[id(master)]
        k = bucket.index[id(master)]
        flat, _ = bucket.members[k]
        if bucket.buffer is None:
            bucket.buffer = grad.new_zeros(flat.ways, bucket.width)
        rows = bucket.buffer[:, bucket.offsets[k] : bucket.offsets[k] + flat.chunk]
        padded = grad.new_zeros(flat.ways * flat.chunk)
        padded[: flat.numel] = grad.reshape(-1)
        rows.add_(padded.view(flat.ways, flat.chunk))
        bucket.arrived += 1
        if bucket.arrived == len(bucket.members):
            self._issue(bucket)

    def _issue(self, bucket: _Bucket) -> None:
        assert bucket.buffer is not None
        bucket.out = bucket.buffer.new_empty(bucket.width)
        group = self.comm.group(bucket.axis)
        bucket.work = dist.reduce_scatter_tensor(
            bucket.out, bucket.buffer.view(-1), group=group, async_op=True
        )
        if self.comm.log is not None:
            nbytes = bucket.buffer.numel() * bucket.buffer.element_size()
            self.comm.log.append(CollectiveRecord("backward", "reduce_scatter", bucket.axis, nbytes))

    def finish(self) -> None:
        """Issue any bucket a missing gradient left open (zeros), wait for all, give each chunk its gradient."""
        for bucket in self.buckets:
            if bucket.work is None and bucket.arrived:
                self._issue(bucket)
        for bucket in self.buckets:
            if bucket.work is None:
                continue
            bucket.work.wait()
            assert bucket.out is not None
            for (flat, master), offset in zip(bucket.members, bucket.offsets, strict=True):
                part = bucket.out[offset : offset + flat.chunk]
                master.grad = part.clone() if master.grad is None else master.grad.add_(part)
            bucket.buffer, bucket.out, bucket.work, bucket.arrived = None, None, None, 0
