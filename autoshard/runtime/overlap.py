"""Gradient sync overlapped with backward, as ``Plan.overlap`` prices it: data parallel's all-reduces
(:class:`GradSyncOverlap`, what DDP runs) and ZeRO-2's reduce-scatters (:class:`GradBuckets`) bucketed and
issued asynchronously; :func:`apply_overlap` applies the plan's whole policy to an emitted module (with the
FSDP all-gather prefetch of :mod:`autoshard.runtime.prefetch`).  Both run one bucketing mechanism
(``_Buckets``), parameterised by the collective: an ``all_reduce`` bucket is one row of whole gradients, a
``reduce_scatter`` bucket one row per rank; only when gradients are packed (at arrival for ZeRO-2, at issue
for data parallel, which reads the accumulated ``.grad``) and how sums are handed back differ.

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

from autoshard.codegen.collectives import CollectiveRecord, MeshComm, parse_steps, reduce_scatter_single

__all__ = ["BUCKET_BYTES", "GradBuckets", "GradSyncOverlap", "apply_overlap"]

BUCKET_BYTES = 25 * 2**20
"""Default bucket size: torch DDP's default ``bucket_cap_mb`` (25 MB)."""


@dataclass(eq=False)
class _Bucket:
    """Gradients of one mesh axis in one buffer laid out rank-major: row ``r`` holds every member's chunk
    ``r`` (one row, the whole gradient, for an all-reduce)."""

    axis: int
    ways: int  # rows: the ranks a reduce-scatter splits over, 1 for an all-reduce
    members: list[torch.Tensor] = field(default_factory=list)  # ZeRO master chunks, or DP parameters
    index: dict[int, int] = field(default_factory=dict)  # id(member) -> its position
    spans: list[tuple[int, int, int]] = field(default_factory=list)  # (offset, chunk, numel) per member
    width: int = 0  # sum of the members' chunks
    nbytes: int = 0  # the buffer's bytes
    arrived: int = 0
    buffer: torch.Tensor | None = None
    out: torch.Tensor | None = None
    work: Any = None


class _Buckets:
    """The one bucketing mechanism, parameterised by the collective: members grouped in order into buckets
    of about ``bucket_bytes`` per mesh axis, each bucket's ``all_reduce`` (``ways`` 1: every rank keeps the
    sum) or ``reduce_scatter`` (``ways`` rows: rank ``r`` keeps row ``r``) issued with ``async_op=True``."""

    def __init__(self, kind: str, comm: MeshComm, bucket_bytes: int) -> None:
        self.kind, self.comm, self.bucket_bytes = kind, comm, bucket_bytes
        self.buckets: list[_Bucket] = []
        self.where: dict[int, _Bucket] = {}

    def append(self, member: torch.Tensor, axis: int, numel: int, ways: int, chunk: int) -> None:
        nbytes = chunk * ways * member.element_size()
        last = self.buckets[-1] if self.buckets else None
        fits = last is not None and (last.axis, last.ways) == (axis, ways)
        # a bucket closes once it holds bucket_bytes (DDP's rule, and cost_models.overlap.bucket_layers')
        if last is None or not fits or last.nbytes >= self.bucket_bytes:
            last = _Bucket(axis, ways)
            self.buckets.append(last)
        last.index[id(member)] = len(last.members)
        last.members.append(member)
        last.spans.append((last.width, chunk, numel))
        last.width += chunk
        last.nbytes += nbytes
        self.where[id(member)] = last

    def put(self, member: torch.Tensor, grad: torch.Tensor) -> _Bucket:
        """Add one member's whole local gradient into its bucket's rows."""
        bucket = self.where[id(member)]
        offset, chunk, numel = bucket.spans[bucket.index[id(member)]]
        ways = bucket.ways
        if bucket.buffer is None:
            bucket.buffer = grad.new_zeros(ways, bucket.width)
        padded = grad.new_zeros(ways * chunk)
        padded[:numel] = grad.reshape(-1)
        bucket.buffer[:, offset : offset + chunk].add_(padded.view(ways, chunk))
        return bucket

    def issue(self, bucket: _Bucket) -> None:
        assert bucket.buffer is not None
        group, flat = self.comm.group(bucket.axis), bucket.buffer.view(-1)
        if self.kind == "all_reduce":
            bucket.out, bucket.work = flat, dist.all_reduce(flat, group=group, async_op=True)
        else:
            bucket.out = flat.new_empty(bucket.width)
            bucket.work = reduce_scatter_single(bucket.out, flat, group=group, async_op=True)
        if self.comm.log is not None:
            nbytes = flat.numel() * flat.element_size()
            self.comm.log.append(CollectiveRecord("backward", self.kind, bucket.axis, nbytes))

    def wait(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Wait for every issued bucket: (member, its reduced piece) for each member; the buckets reset."""
        done = []
        for bucket in self.buckets:
            if bucket.work is None:
                continue
            bucket.work.wait()
            assert bucket.out is not None
            done += [
                (m, bucket.out[o : o + c]) for m, (o, c, _) in zip(bucket.members, bucket.spans, strict=True)
            ]
            bucket.buffer, bucket.out, bucket.work, bucket.arrived = None, None, None, 0
        return done


class GradBuckets(_Buckets):
    """Bucketed asynchronous reduce-scatters of ZeRO-2 gradient chunks (module doc)."""

    def __init__(
        self, entries: list[tuple[Any, Any]], comm: MeshComm, bucket_bytes: int = BUCKET_BYTES
    ) -> None:
        super().__init__("reduce_scatter", comm, bucket_bytes)
        for flat, master in reversed(entries):
            if len(flat.axes) == 1 and flat.partial == flat.axes:
                self.append(master, flat.axes[0], flat.numel, flat.ways, flat.chunk)

    def handles(self, master: torch.Tensor) -> bool:
        return id(master) in self.where

    def add(self, master: torch.Tensor, grad: torch.Tensor) -> None:
        """Copy one parameter's whole local gradient into its bucket; issue the bucket when it is full."""
        bucket = self.put(master, grad)
        bucket.arrived += 1
        if bucket.arrived == len(bucket.members):
            self.issue(bucket)

    def finish(self) -> None:
        """Issue any bucket a missing gradient left open (zeros), wait for all, give each chunk its gradient."""
        for bucket in self.buckets:
            if bucket.work is None and bucket.arrived:
                self.issue(bucket)
        for master, part in self.wait():
            master.grad = part.clone() if master.grad is None else master.grad.add_(part)


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
        self._sums = _Buckets("all_reduce", info.comm, size)
        self.buckets = self._sums.buckets
        for item in reversed(mine):  # roughly the order backward produces the gradients
            steps = parse_steps(item.steps)
            param = module.get_parameter(item.param)
            if len(steps) != 1 or steps[0].kind != "all_reduce":
                self.others.append(item)
                continue
            self._sums.append(param, steps[0].mesh_axis, param.numel(), 1, param.numel())
        self.events: list[tuple[int, int]] = []  # (bucket, gradients of the step still to come) at issue
        self._waiting = len(self._sums.where)
        arrived = weakref.WeakMethod(self._arrived)  # a hook on a parameter must not keep the groups alive

        def hook(param: torch.Tensor) -> None:
            method = arrived()
            if method is not None:
                method(param)

        self._hooks = [p.register_post_accumulate_grad_hook(hook) for b in self.buckets for p in b.members]

    def _arrived(self, param: torch.Tensor) -> None:
        bucket = self._sums.where[id(param)]
        bucket.arrived += 1
        self._waiting -= 1
        if self.overlap and bucket.arrived == len(bucket.members):
            self._issue(bucket)

    def _issue(self, bucket: _Bucket) -> None:
        for p in bucket.members:  # the gradients as backward left them (accumulated), zeros where none
            self._sums.put(p, p.grad if p.grad is not None else torch.zeros_like(p))
        self._sums.issue(bucket)
        self.events.append((self.buckets.index(bucket), self._waiting))

    @torch.no_grad()
    def finish(self, *_: Any) -> None:
        """Wait for every bucket (issuing those backward left open), hand back the sums, run other syncs."""
        from autoshard.runtime.grad_sync import sync_gradients

        for bucket in self.buckets:
            if bucket.work is None and (bucket.arrived or not self.overlap):
                self._issue(bucket)
        for p, part in self._sums.wait():
            p.grad = part.view_as(p).clone()
        self._waiting = len(self._sums.where)
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
