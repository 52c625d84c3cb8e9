"""Gradient sync overlapped with backward, as ``Plan.overlap`` prices it: data parallel's all-reduces
(:class:`GradSyncOverlap`, what DDP runs) and ZeRO-2's reduce-scatters (:class:`GradBuckets`) bucketed and
issued asynchronously; :func:`apply_overlap` applies the plan's whole policy to an emitted module (with the
FSDP all-gather prefetch of :mod:`autoshard.runtime.prefetch`).  Both run one bucketing mechanism
(``_Buckets``), parameterised by the collective: an ``all_reduce`` bucket is one row of whole gradients, a
``reduce_scatter`` bucket one row per rank; only when gradients are packed (at arrival for ZeRO-2, at issue
for data parallel, which reads the accumulated ``.grad``) and how sums are handed back differ.

**The buckets are the plan's** (``Plan.grad_buckets``, formed by ``cost_models.overlap.SyncStream`` over
the backward units of :mod:`autoshard.problem.ready`): each priced ``all_reduce`` bucket becomes one runtime
bucket with exactly its members, in its buffer order, on its axis, and the buckets are issued in the plan's
order -- each when its last member's gradient has arrived (post-accumulate-grad hook) and every bucket
before it is issued.  The plan issues a bucket when the backward of its last member's *unit* ends; a
gradient is complete inside that backward (its accumulation runs as soon as the unit's backward has made
it), so the runtime issues at or before the priced time: the communication stream runs buckets one after
another in issue order, so an earlier issue can only end it earlier, and the priced exposure is an upper
bound on what runs (equal where the unit's last member is its last op, as a linear layer's weight is).
Where the run cannot follow the plan it says so, once per reason (:class:`PlanMismatchWarning`):

- no buckets (a file from before them), or another size than theirs (``bucket_bytes=``, an edited
  ``Plan.overlap``): the runtime's own order -- reverse registration, a bucket closing once it holds
  ``bucket_bytes`` (DDP's rule);
- a member not reduced here by one collective on its bucket's axis (a sum over two axes: synchronous, after
  backward); a gradient outside the plan's buckets: its own buckets after them; buckets of other
  collectives (FSDP's reduce-scatters): run per parameter where the emitted graph makes the gradient.

**Data parallel** (:class:`GradSyncOverlap`): the one gradient-sync pass
(:func:`autoshard.runtime.grad_sync.defer_gradient_sync`) takes the parameters' all-reduces out of the
backward; each parameter's post-accumulate-grad hook counts its arrival, and a bucket's ``all_reduce`` is
issued with ``async_op=True`` (its members' ``.grad`` packed then) while backward goes on.  ``finish()`` (an
optimizer step pre-hook, or called by hand) waits for them, copies the sums back into ``.grad`` and runs any
other deferred sync.  With ``overlap_grad_sync=False`` the same buckets are reduced in ``finish()``, after
backward -- exposed, as priced.

**ZeRO-2** (:class:`GradBuckets`, fed by a :class:`~autoshard.runtime.zero.ZeroOptimizer` with ``stage=2,
overlap=True`` from each parameter's post-accumulate-grad hook): parameters whose gradient is Partial over
exactly one mesh axis (data parallel; the plan prices their all-reduce, ZeRO runs its bytes as a
reduce-scatter) fill the plan's buckets.  A bucket is one buffer laid out rank-major -- row ``r`` holds every
member's chunk ``r`` -- so one ``reduce_scatter_single`` leaves each rank exactly its members' chunks (its
bytes the plan's where each member's elements divide by the ranks; else padded to them).  ``finish()``
(called by ``step()``) waits for all and hands each member its reduced chunk.  Other parameters (Partial
over two axes, or gradients already whole) keep the synchronous path.

Every rank fills and issues buckets in the same order, so the collectives match across ranks.  With
``Plan.microbatches`` m > 1 the buckets are due in a step's m-th backward pass, as priced (one reduction per
step); a gradient reaching a bucket already reduced raises :class:`GradSyncError`, never left out of a sum.

Example::

    opt = ZeroOptimizer(module, torch.optim.AdamW, stage=2, lr=1e-3)    # ZeRO-2: buckets from the plan
    # or plain data parallel / FSDP with a torch optimizer:
    opt = torch.optim.AdamW(module.parameters()); apply_overlap(module, opt)
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from autoshard.codegen.assign import PlanMismatchWarning
from autoshard.codegen.collectives import CollectiveRecord, MeshComm, parse_steps, reduce_scatter_single
from autoshard.errors import AutoshardError
from cost_models.overlap import GradBucket

__all__ = ["BUCKET_BYTES", "GradBuckets", "GradSyncError", "GradSyncOverlap", "apply_overlap"]

BUCKET_BYTES = 25 * 2**20
"""Default bucket size: torch DDP's default ``bucket_cap_mb`` (25 MB)."""

Member = tuple[torch.Tensor, int, int, int, int]
"""What a bucket holds of one gradient: (member tensor, mesh axis, numel, ways, chunk)."""

_SAID: set[str] = set()


class GradSyncError(AutoshardError, RuntimeError):
    """A gradient reached a bucket already reduced this step (more backward passes than the plan's)."""


def _say(what: str) -> None:
    """Out loud, once per reason in a process (module doc)."""
    if what not in _SAID:
        _SAID.add(what)
        warnings.warn(f"gradient buckets: {what}", PlanMismatchWarning, stacklevel=4)


@dataclass(eq=False)
class _Bucket:
    """Gradients of one mesh axis in one buffer laid out rank-major: row ``r`` holds every member's chunk
    ``r`` (one row, the whole gradient, for an all-reduce)."""

    axis: int
    ways: int  # rows: the ranks a reduce-scatter splits over, 1 for an all-reduce
    members: list[torch.Tensor] = field(default_factory=list)  # ZeRO master chunks, or DP parameters
    index: dict[int, int] = field(default_factory=dict)  # id(member) -> its position
    spans: list[tuple[int, int, int]] = field(default_factory=list)  # (offset, chunk, numel) per member
    names: list[str] = field(default_factory=list)  # the members' parameter names
    width: int = 0  # sum of the members' chunks
    nbytes: int = 0  # the buffer's bytes
    arrived: int = 0
    buffer: torch.Tensor | None = None
    out: torch.Tensor | None = None
    work: Any = None


class _Buckets:
    """The one bucketing mechanism, parameterised by the collective: the plan's buckets (or, without them,
    members grouped in order into buckets of ``bucket_bytes`` per mesh axis), each bucket's ``all_reduce``
    (``ways`` 1: every rank keeps the sum) or ``reduce_scatter`` (``ways`` rows: rank ``r`` keeps row ``r``)
    issued with ``async_op=True``, in bucket order."""

    def __init__(self, kind: str, comm: MeshComm, bucket_bytes: int, rounds: int = 1) -> None:
        self.kind, self.comm, self.bucket_bytes = kind, comm, bucket_bytes
        self.rounds = max(1, rounds)  # backward passes per step (the plan's microbatches): due on the last
        self.buckets: list[_Bucket] = []
        self.where: dict[int, _Bucket] = {}
        self.next = 0  # the first bucket not issued in this step

    def lay_out(self, planned: Sequence[GradBucket], members: dict[str, Member]) -> None:
        """The plan's all-reduce buckets over ``members`` (name -> member, in the runtime's own order), then
        any member they do not hold; the runtime's own order where the plan's cannot be followed."""
        usable = [b for b in planned if b.kind == "all_reduce"]
        other = [b for b in planned if b.kind != "all_reduce"]
        if other:  # FSDP's reduce-scatters: the emitted graph runs them where the gradient is made
            kinds = ", ".join(sorted({b.kind for b in other}))
            _say(
                f"{len(other)} planned {kinds} bucket(s) (e.g. {other[0].params[0]}) run per parameter inside "
                "backward, where the emitted graph reduces them: not bucketed as priced"
            )
        sizes = {b.bucket_bytes for b in usable}
        if not usable or sizes != {self.bucket_bytes}:
            why = (
                "the plan records none (a file from before Plan.grad_buckets)"
                if not usable
                else f"buckets of {self.bucket_bytes} B asked (bucket_bytes=, or an edited Plan.overlap), the "
                f"plan's formed for {', '.join(map(str, sorted(sizes)))} B"
            )
            if members:
                _say(f"{why}: the runtime's own order (reverse registration, {self.bucket_bytes} B buckets)")
            for name, own in members.items():
                self.append(name, *own)
            return
        placed: set[str] = set()
        missing = []
        for b in usable:
            fresh = True
            for name in b.params:
                member = members.get(name)
                if member is None or member[1] != b.mesh_axis or name in placed:
                    missing.append(name)
                    continue
                self.append(name, *member, fresh=fresh, sized=False)
                placed.add(name)
                fresh = False
        rest = [name for name in members if name not in placed]
        if missing:  # a gradient summed over two axes is missing from each axis's bucket: counted once
            count = len(dict.fromkeys(missing))
            _say(
                f"{count} planned member(s) are not reduced here by one {self.kind} on the bucket's "
                f"axis (e.g. {missing[0]}): they keep the synchronous path, exposed beyond the plan's price"
            )
        if rest:
            _say(f"{len(rest)} gradient(s) outside the plan's buckets (e.g. {rest[0]}): own buckets after")
        for i, name in enumerate(rest):
            self.append(name, *members[name], fresh=i == 0)

    def append(
        self,
        name: str,
        member: torch.Tensor,
        axis: int,
        numel: int,
        ways: int,
        chunk: int,
        *,
        fresh: bool = False,
        sized: bool = True,
    ) -> None:
        """Add a member to the last bucket; a new one when ``fresh``, on another axis, or (``sized``) once
        the last holds ``bucket_bytes`` (DDP's rule, and ``cost_models.overlap.SyncStream``'s)."""
        nbytes = chunk * ways * member.element_size()
        last = self.buckets[-1] if self.buckets else None
        fits = last is not None and (last.axis, last.ways) == (axis, ways)
        if last is None or fresh or not fits or (sized and last.nbytes >= self.bucket_bytes):
            last = _Bucket(axis, ways)
            self.buckets.append(last)
        last.index[id(member)] = len(last.members)
        last.members.append(member)
        last.names.append(name)
        last.spans.append((last.width, chunk, numel))
        last.width += chunk
        last.nbytes += nbytes
        self.where[id(member)] = last

    def check(self, member: torch.Tensor) -> _Bucket:
        """``member``'s bucket, refused once reduced this step: its gradient would be lost from the sum."""
        bucket = self.where[id(member)]
        if bucket.work is not None:
            raise GradSyncError(
                f"the gradient of {bucket.names[bucket.index[id(member)]]} arrived after its bucket was reduced: "
                f"the step ran more than the plan's {self.rounds} backward pass(es) (Plan.microbatches) before "
                "the optimizer step; step (or call finish()) after each step's microbatches"
            )
        return bucket

    def arrive(self, member: torch.Tensor) -> list[_Bucket]:
        """Count one member's gradient; the buckets now due, in order (every member's gradient arrived once per
        backward pass of the step, and every bucket before issued)."""
        bucket = self.check(member)
        bucket.arrived += 1
        due = []
        while self.next < len(self.buckets):
            head = self.buckets[self.next]
            if head.arrived < len(head.members) * self.rounds:
                break
            due.append(head)
            self.next += 1
        return due

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
            bucket.buffer, bucket.out, bucket.work = None, None, None
        for bucket in self.buckets:
            bucket.arrived = 0
        self.next = 0
        return done


class GradBuckets(_Buckets):
    """Bucketed asynchronous reduce-scatters of ZeRO-2 gradient chunks (module doc): ``planned`` is
    ``Plan.grad_buckets`` (``()``: the runtime's own order, said once)."""

    def __init__(
        self,
        entries: list[tuple[Any, Any]],
        comm: MeshComm,
        bucket_bytes: int = BUCKET_BYTES,
        planned: Sequence[GradBucket] = (),
        rounds: int = 1,
    ) -> None:
        super().__init__("reduce_scatter", comm, bucket_bytes, rounds)
        members = {
            flat.fqn: (master, flat.axes[0], flat.numel, flat.ways, flat.chunk)
            for flat, master in reversed(entries)
            if len(flat.axes) == 1 and flat.partial == flat.axes
        }
        self.lay_out(planned, members)

    def handles(self, master: torch.Tensor) -> bool:
        return id(master) in self.where

    def add(self, master: torch.Tensor, grad: torch.Tensor) -> None:
        """Copy one parameter's whole local gradient into its bucket; issue the buckets now due."""
        self.check(master)  # never into a buffer being reduced
        self.put(master, grad)
        for bucket in self.arrive(master):
            self.issue(bucket)

    def finish(self) -> None:
        """Issue, in order, any bucket backward left open (zeros for a missing gradient), wait for all, and
        give each chunk its gradient."""
        for bucket in self.buckets:
            if bucket.work is None and bucket.arrived:
                self.issue(bucket)
        for master, part in self.wait():
            master.grad = part.clone() if master.grad is None else master.grad.add_(part)


class GradSyncOverlap:
    """Data parallel's gradient all-reduces in the plan's buckets, issued during backward (module doc).
    ``bucket_bytes``: other buckets than the plan's, in the runtime's own order (said once)."""

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
        self._sums = _Buckets("all_reduce", info.comm, size, info.plan.microbatches)
        self.buckets = self._sums.buckets
        members: dict[str, Member] = {}
        for item in reversed(mine):  # the runtime's own order: roughly the order backward produces them
            steps = parse_steps(item.steps)
            param = module.get_parameter(item.param)
            if len(steps) != 1 or steps[0].kind != "all_reduce":
                self.others.append(item)
                continue
            members[item.param] = (param, steps[0].mesh_axis, param.numel(), 1, param.numel())
        self._sums.lay_out(info.plan.grad_buckets, members)
        self.events: list[tuple[int, int]] = []  # (bucket, gradients of the step still to come) at issue
        self._waiting = len(self._sums.where) * self._sums.rounds  # gradient arrivals still due this step
        arrived = weakref.WeakMethod(self._arrived)  # a hook on a parameter must not keep the groups alive

        def hook(param: torch.Tensor) -> None:
            method = arrived()
            if method is not None:
                method(param)

        self._hooks = [p.register_post_accumulate_grad_hook(hook) for b in self.buckets for p in b.members]

    def _arrived(self, param: torch.Tensor) -> None:
        self._waiting -= 1
        for bucket in self._sums.arrive(param):
            if self.overlap:
                self._issue(bucket)

    def _issue(self, bucket: _Bucket) -> None:
        for p in bucket.members:  # the gradients as backward left them (accumulated), zeros where none
            self._sums.put(p, p.grad if p.grad is not None else torch.zeros_like(p))
        self._sums.issue(bucket)
        self.events.append((self.buckets.index(bucket), self._waiting))

    @torch.no_grad()
    def finish(self, *_: Any) -> None:
        """Wait for every bucket (issuing, in order, those backward left open), hand back the sums, run
        other syncs."""
        from autoshard.runtime.grad_sync import sync_gradients

        for bucket in self.buckets:
            if bucket.work is None and (bucket.arrived or not self.overlap):
                self._issue(bucket)
        for p, part in self._sums.wait():
            p.grad = part.view_as(p).clone()
        self._waiting = len(self._sums.where) * self._sums.rounds
        sync_gradients(self.module, tuple(self.others), claimed=True)

    def remove_hooks(self) -> None:
        for handle in self._hooks:
            handle.remove()


def apply_overlap(
    module: Any,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    record: bool = False,
    bucket_bytes: int | None = None,
) -> Any:
    """Execute ``Plan.overlap`` on an emitted module: FSDP gathers prefetched ``prefetch`` layers ahead
    (:func:`~autoshard.runtime.prefetch.prefetch_gathers`) and data parallel's gradient all-reduces in the
    plan's buckets, overlapped (:class:`GradSyncOverlap`; its ``finish`` runs before ``optimizer.step``).

    Returns ``(GradSyncOverlap, Prefetcher or None)``.  ``bucket_bytes``: other buckets than the plan's (the
    runtime's own order, said once).  Use a ZeroOptimizer instead of ``optimizer`` for ZeRO: it claims the
    sums first and buckets its own reduce-scatters.
    """
    from autoshard.runtime.prefetch import prefetch_gathers

    prefetcher = prefetch_gathers(module, record=record)
    sync = GradSyncOverlap(module, bucket_bytes)
    if optimizer is not None:
        optimizer.register_step_pre_hook(sync.finish)
    return sync, prefetcher
