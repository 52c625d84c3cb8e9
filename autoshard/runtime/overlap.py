"""Gradient sync overlapped with backward, as ``Plan.overlap`` prices it: data parallel's all-reduces
(:class:`GradSyncOverlap`, what DDP runs) and ZeRO-2's reduce-scatters (:class:`GradBuckets`) bucketed and
issued asynchronously; :func:`apply_overlap` applies the plan's whole policy to an emitted module (with the
FSDP all-gather prefetch of :mod:`autoshard.runtime.prefetch`).

**Data parallel** (:class:`GradSyncOverlap`): the one gradient-sync pass
(:func:`autoshard.runtime.grad_sync.defer_gradient_sync`) takes the parameters' all-reduces out of the
backward; parameters whose sync is one ``all_reduce`` are grouped, in reverse registration order, into
buckets of ``Plan.overlap.bucket_bytes``; each parameter's post-accumulate-grad hook copies its gradient into
its bucket, and the bucket's ``all_reduce`` is issued with ``async_op=True`` when its last member arrives,
while backward goes on.  ``finish()`` (an optimizer step pre-hook, or called by hand) waits for them, copies
the sums back into ``.grad`` and runs any other deferred sync.  With ``overlap_grad_sync=False`` the same
buckets are reduced in ``finish()``, after backward -- exposed, as priced.

**ZeRO-2**:

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

This is the overlap DDP and ZeRO-2 implementations run, and what ``cost_models.overlap`` prices.

Example::

    opt = ZeroOptimizer(module, torch.optim.AdamW, stage=2, lr=1e-3)    # ZeRO-2: buckets from the plan
    # or plain data parallel / FSDP with a torch optimizer:
    opt = torch.optim.AdamW(module.parameters()); apply_overlap(module, opt)
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from autoshard.codegen.collectives import CollectiveRecord, MeshComm, parse_steps

__all__ = ["BUCKET_BYTES", "GradBuckets", "GradSyncOverlap", "apply_overlap"]

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


@dataclass(eq=False)
class _SumBucket:
    axis: int
    params: list[torch.Tensor]
    arrived: int = 0
    flat: torch.Tensor | None = None
    work: Any = None


class GradSyncOverlap:
    """Data parallel's gradient all-reduces bucketed and issued during backward (module doc)."""

    def __init__(self, module: Any, bucket_bytes: int | None = None, *, overlap: bool | None = None) -> None:
        from autoshard.codegen.parallelize import parallel_info
        from autoshard.runtime.grad_sync import claim, defer_gradient_sync, unclaimed

        info = parallel_info(module)
        policy = info.plan.overlap
        self.overlap = policy.overlap_grad_sync if overlap is None else overlap
        size = policy.bucket_bytes if bucket_bytes is None else bucket_bytes
        self.module, self.comm = module, info.comm
        mine = unclaimed(module, defer_gradient_sync(module))
        claim(module, {d.param for d in mine})
        self.others = []  # syncs of several steps: run whole in finish()
        self.buckets: list[_SumBucket] = []
        self.where: dict[int, _SumBucket] = {}
        held = 0
        for item in reversed(mine):  # roughly the order backward produces the gradients
            steps = parse_steps(item.steps)
            param = module.get_parameter(item.param)
            if len(steps) != 1 or steps[0].kind != "all_reduce":
                self.others.append(item)
                continue
            last = self.buckets[-1] if self.buckets else None
            nbytes = param.numel() * param.element_size()
            if last is None or last.axis != steps[0].mesh_axis or (held + nbytes > size and last.params):
                last, held = _SumBucket(steps[0].mesh_axis, []), 0
                self.buckets.append(last)
            last.params.append(param)
            held += nbytes
            self.where[id(param)] = last
        self.events: list[tuple[int, int]] = []  # (bucket, gradients of the step still to come) at issue
        self._waiting = len(self.where)
        arrived = weakref.WeakMethod(self._arrived)  # a hook on a parameter must not keep the groups alive

        def hook(param: torch.Tensor) -> None:
            method = arrived()
            if method is not None:
                method(param)

        self._hooks = [p.register_post_accumulate_grad_hook(hook) for b in self.buckets for p in b.params]

    def _arrived(self, param: torch.Tensor) -> None:
        bucket = self.where[id(param)]
        bucket.arrived += 1
        self._waiting -= 1
        if self.overlap and bucket.arrived == len(bucket.params):
            self._issue(bucket)

    def _issue(self, bucket: _SumBucket) -> None:
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in bucket.params]
        bucket.flat = torch.cat([g.reshape(-1) for g in grads])
        bucket.work = dist.all_reduce(bucket.flat, group=self.comm.group(bucket.axis), async_op=True)
        self.events.append((self.buckets.index(bucket), self._waiting))
        if self.comm.log is not None:
            nbytes = bucket.flat.numel() * bucket.flat.element_size()
            self.comm.log.append(CollectiveRecord("backward", "all_reduce", bucket.axis, nbytes))

    @torch.no_grad()
    def finish(self, *_: Any) -> None:
        """Wait for every bucket (issuing those backward left open), hand back the sums, run other syncs."""
        from autoshard.runtime.grad_sync import sync_gradients

        for bucket in self.buckets:
            if bucket.work is None and (bucket.arrived or not self.overlap):
                self._issue(bucket)
        for bucket in self.buckets:
            if bucket.work is None:
                continue
            bucket.work.wait()
            assert bucket.flat is not None
            offset = 0
            for p in bucket.params:
                part = bucket.flat[offset : offset + p.numel()].view_as(p)
                p.grad = part.clone()
                offset += p.numel()
            bucket.flat, bucket.work, bucket.arrived = None, None, 0
        self._waiting = len(self.where)
        sync_gradients(self.module, tuple(self.others), claimed=True)

    def remove_hooks(self) -> None:
        for handle in self._hooks:
            handle.remove()


def apply_overlap(
    module: Any, optimizer: torch.optim.Optimizer | None = None, *, record: bool = False
) -> Any:
    """Execute ``Plan.overlap`` on an emitted module: FSDP gathers prefetched ``prefetch`` layers ahead
    (:func:`~autoshard.runtime.prefetch.prefetch_gathers`) and data parallel's gradient all-reduces bucketed
    and overlapped (:class:`GradSyncOverlap`; its ``finish`` runs before ``optimizer.step``).

    Returns ``(GradSyncOverlap, Prefetcher or None)``.  Use a ZeroOptimizer instead of ``optimizer`` for
    ZeRO: it claims the sums first and buckets its own reduce-scatters.
    """
    from autoshard.runtime.prefetch import prefetch_gathers

    prefetcher = prefetch_gathers(module, record=record)
    sync = GradSyncOverlap(module)
    if optimizer is not None:
        optimizer.register_step_pre_hook(sync.finish)
    return sync, prefetcher
