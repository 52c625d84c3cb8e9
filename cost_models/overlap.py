"""Step time as the critical path of one training step: which communication compute hides, and which it waits for.

Input: per-layer compute and communication times (seconds, from :mod:`cost_models.compute` and
:mod:`cost_models.collectives`) and an :class:`OverlapPolicy`.
Output: the seconds of communication left *exposed* on the critical path.

The model, as the runtime (DDP / FSDP2 / Megatron) executes a step — compute on one stream, collectives on
another, each stream in issue order:

1. **Tensor- and sequence-parallel collectives are exposed.**  The next op needs their result; unless the plan
   asks for async TP (``OverlapPolicy.async_tp``: collective matmul, torch's ``_micro_pipeline_tp``), they add
   to the step in full.
2. **Gradient synchronisation overlaps the rest of backward.**  Backward visits the step's units -- the
   repeated layers L … 1 and every op outside them (an MLP's fc2, then fc1; a transformer's head, the layers,
   then the embedding) -- in reverse forward order, and a parameter's gradient is ready when the backward of
   its first consumer ends (``autoshard.problem.ready``).  Gradients are grouped, in that order, into buckets
   of at least ``bucket_bytes`` (DDP's ``bucket_cap_mb``; FSDP2 buckets per module, i.e. per layer).  A
   bucket's reduction (all-reduce or reduce-scatter) is issued when the backward of its last unit ends and
   runs on the communication stream after the previous bucket's.  The communication stream's finish time
   minus the compute stream's is exposed.  The plan records these buckets (:class:`GradBucket`, one per
   mesh axis of a bucket: members, bytes, the unit after which it is issued) and the runtime issues
   exactly them, in that order (``autoshard.runtime.overlap``).  For L identical layers, each with
   backward compute c and reduction s, that is ``s + (L − 1) · max(0, s − c)`` minus any backward compute
   after the last layer (the embedding's, which ``autoshard.problem.step`` does not count:
   ``autoshard.problem.ready`` says why): the last bucket always shows, the others only where they are
   slower than the compute that hides them (:func:`exposed_sync_repeated`).  A two-layer MLP under data
   parallelism exposes fc1's sync and whatever of fc2's outlasts fc1's backward; a one-layer model exposes
   its whole sync (nothing is left to hide it).
3. **FSDP all-gathers are prefetched** (``prefetch`` layers ahead, FSDP2's default 1): the gather of layer i + 1
   runs under the compute of layer i, so the first is exposed and each other one only beyond that compute:
   ``g_1 + Σ_{i≥2} max(0, g_i − c_{i−1})`` (:func:`exposed_prefetched_gathers`).  Without prefetch every
   gather is exposed.
   With ``reshard_after_forward`` (FSDP2's default) each gathered weight is freed after use and gathered
   again in backward: those re-gathers are priced as the forward ones, in backward order under the
   backward compute of the layer after (the same function).
4. **Pipeline point-to-point** transfers are priced by the pipeline schedule (``autoshard.pipeline``), not here.

Step time = compute + exposed TP collectives + exposed gathers + exposed gradient sync (+ pipeline bubble).

The intra-op solver adds per-node and per-edge costs, and ``max(0, s − c)`` couples a layer's communication to
its compute, so the solver linearises item 2 for repeated layers: the gradient sync of one copy (the last
layer's) is priced in full and the other L − 1 copies as hidden.  That is exact while a layer's sync is
shorter than a layer's backward (the usual regime for large models), and optimistic beyond it; syncs outside
the repeated layers and FSDP gathers are priced in full (the lower bound the planner proves its step
against takes out what may hide: ``autoshard.problem.unpaid``).  The plan's predicted step time is this critical
path (``Plan.predicted_step_time``), so where the linearisation is optimistic the plan says by how much;
``Plan.communication_time`` stays the sum of all collectives.

Example::

    >>> exposed_sync_repeated(compute=2.0, sync=1.0, layers=10)   # syncs hide under the next layer's backward
    1.0
    >>> exposed_sync_repeated(compute=1.0, sync=2.0, layers=10)   # communication-bound: 2 + 9 · 1
    11.0
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DDP_BUCKET_BYTES",
    "GradBucket",
    "OverlapPolicy",
    "SyncExposure",
    "SyncStream",
    "bucket_layers",
    "exposed_gradient_sync",
    "exposed_prefetched_gathers",
    "exposed_sync_repeated",
    "sync_buckets",
    "sync_schedule",
]

DDP_BUCKET_BYTES = 25 * 2**20
"""torch DistributedDataParallel's default gradient bucket, ``bucket_cap_mb=25`` (torch.nn.parallel docs)."""


@dataclass(frozen=True, slots=True)
class OverlapPolicy:
    """How a step overlaps communication with compute: priced by :mod:`cost_models.overlap`, executed by the runtime.

    Attributes:
        overlap_grad_sync: reduce gradients bucket by bucket during backward (DDP, FSDP2, Megatron's
            ``--overlap-grad-reduce``); False: all after backward, fully exposed.
        bucket_bytes: the smallest gradient bucket, bytes (DDP default 25 MiB).
        prefetch: FSDP all-gathers issued this many layers ahead (FSDP2 default 1; 0: no prefetch).
        async_tp: tensor-parallel collectives overlapped with their matmuls (collective matmul); False:
            exposed, the default of DTensor TP and Megatron without ``--tp-comm-overlap``.
        reshard_after_forward: gathered (FSDP) weights are freed after their forward use and gathered again
            in backward (FSDP2's default; ``autoshard.runtime.reshard``), which the memory model assumes and
            the step prices (``Plan.collectives`` phase ``"regather"``); False: kept until backward.
    """

    overlap_grad_sync: bool = True
    bucket_bytes: int = DDP_BUCKET_BYTES
    prefetch: int = 1
    async_tp: bool = False
    reshard_after_forward: bool = True

    def __post_init__(self) -> None:
        if self.bucket_bytes < 1:
            raise ValueError(f"OverlapPolicy.bucket_bytes must be >= 1, got {self.bucket_bytes}")
        if self.prefetch < 0:
            raise ValueError(f"OverlapPolicy.prefetch must be >= 0 (0: no prefetch), got {self.prefetch}")

    def describe(self) -> str:
        """One line for the report."""
        sync = "grad sync after backward"
        if self.overlap_grad_sync:
            sync = f"grad sync in {self.bucket_bytes / 2**20:.0f} MiB buckets"
        gathers = f"prefetch {self.prefetch}" if self.prefetch else "no prefetch"
        return f"{sync}, {gathers}, TP {'async' if self.async_tp else 'exposed'}"

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> OverlapPolicy:
        return cls() if data is None else cls(**data)


@dataclass(frozen=True, slots=True)
class SyncExposure:
    """A step's gradient sync and what of it the step pays (model item 2), as the report states it.

    Attributes:
        seconds: every gradient reduction of the step.
        exposed: what backward compute does not hide (part of the predicted step time).
        last: the parameters of the last bucket, ready only as backward ends (what always shows).
        last_seconds: that bucket's reduction.
    """

    seconds: float
    exposed: float
    last: tuple[str, ...] = ()
    last_seconds: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.exposed <= self.seconds * (1 + 1e-9) + 1e-12:
            raise ValueError(
                f"SyncExposure.exposed must lie in [0, seconds], got {self.exposed} of {self.seconds}"
            )

    def describe(self, seconds: Callable[[float], str], overlapped: bool = True, buckets: int = 0) -> str:
        """One line for the report: what is exposed and why; ``seconds`` formats a duration, ``buckets``
        counts the plan's buckets (``Plan.grad_buckets``; 0: not said)."""
        count = f" in {buckets} bucket{'s' if buckets > 1 else ''}" if buckets else ""
        head = f"grad sync {seconds(self.seconds)}{count}, {seconds(self.exposed)} exposed"
        if not overlapped:
            return f"{head}: reduced after backward (overlap off)"
        if self.exposed <= 1e-12:
            return f"grad sync {seconds(self.seconds)}{count}, none exposed: all of it hides under backward"
        names = ", ".join(self.last[:3]) + (f" +{len(self.last) - 3} more" if len(self.last) > 3 else "")
        last = f"the last bucket ({names}: {seconds(self.last_seconds)}) is ready only as backward ends"
        if self.last_seconds >= self.seconds * (1 - 1e-9):
            return f"{head}: {last}, and nothing is left to hide it"
        if self.exposed <= self.last_seconds * (1 + 1e-9):
            return f"{head}: {last}; the rest hides under backward"
        return f"{head}: {last}; the rest outlasts the backward that hides it"

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> SyncExposure | None:
        if data is None:
            return None
        return cls(float(data["seconds"]), float(data["exposed"]), tuple(data.get("last", ())),
                   float(data.get("last_seconds", 0.0)))  # fmt: skip


_SYNC_KINDS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all")


@dataclass(frozen=True, slots=True)
class GradBucket:
    """One gradient bucket of a step as priced (model item 2) and as the runtime issues it
    (``autoshard.runtime.overlap``): the reductions of one mesh axis that one :class:`SyncStream` bucket holds.

    Attributes:
        mesh_axis: the axis the bucket's one collective runs on.
        kind: the collective priced: ``all_reduce`` (data parallel; ZeRO-2 runs its bytes as a
            reduce-scatter), ``reduce_scatter`` (FSDP), or what else moves a gradient between layouts.
        params: the members' parameter names as the runtime's module names them, in buffer order (the
            order backward makes them ready; within a unit the plan's order, bias first).
        nbytes: bytes of the collective, the sum of the members' priced reductions (nccl-tests convention).
        unit: the backward unit after whose backward the bucket is issued (a repeated layer ``layer 3``, or
            an op node's name): the unit of its stream bucket's last member.
        index: the stream bucket, in issue order; a stream bucket holding reductions on several axes is one
            record per axis, all with its index.
        bucket_bytes: the ``OverlapPolicy.bucket_bytes`` the buckets were formed under.
    """

    mesh_axis: int
    kind: str
    params: tuple[str, ...]
    nbytes: int
    unit: str
    index: int
    bucket_bytes: int

    def __post_init__(self) -> None:
        if self.kind not in _SYNC_KINDS:
            raise ValueError(f"GradBucket.kind must be one of {', '.join(_SYNC_KINDS)}, got {self.kind!r}")
        if not self.params or self.nbytes < 0 or self.index < 0 or self.mesh_axis < 0:
            raise ValueError(
                f"GradBucket needs members, bytes >= 0, index >= 0 and an axis >= 0, got {len(self.params)} "
                f"members, {self.nbytes} B, index {self.index}, axis {self.mesh_axis}"
            )

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GradBucket:
        return cls(int(data["mesh_axis"]), str(data["kind"]), tuple(str(p) for p in data["params"]),
                   int(data["nbytes"]), str(data["unit"]), int(data["index"]), int(data["bucket_bytes"]))  # fmt: skip


def sync_buckets(sync: Sequence[float], grad_bytes: Sequence[float], bucket_bytes: float) -> list[list[int]]:
    """The units (indices, backward order) of each bucket :class:`SyncStream` issues, in issue order: the
    stream's own rule, replayed without times (``sync[j] > 0``: unit j reduces ``grad_bytes[j]``)."""
    stream, buckets = SyncStream(bucket_bytes), []
    for j, (seconds, nbytes) in enumerate(zip(sync, grad_bytes, strict=True)):
        stream.add(0.0, seconds, nbytes, j)
        if seconds > 0 and stream.closed:
            buckets.append(stream.last())
    if not stream.closed:
        buckets.append(stream.last())
    return buckets


def bucket_layers(grad_bytes: Sequence[float], bucket_bytes: float) -> list[list[int]]:
    """Group layers (in backward order) into buckets: add layers until a bucket holds ``bucket_bytes``."""
    buckets: list[list[int]] = []
    current: list[int] = []
    held = 0.0
    for i, nbytes in enumerate(grad_bytes):
        current.append(i)
        held += nbytes
        if held >= bucket_bytes:
            buckets.append(current)
            current, held = [], 0.0
    if current:
        buckets.append(current)
    return buckets


def exposed_gradient_sync(
    backward: Sequence[float],
    sync: Sequence[float],
    policy: OverlapPolicy,
    grad_bytes: Sequence[float] | None = None,
    tail_compute: float = 0.0,
) -> float:
    """Exposed seconds of gradient reduction (model item 2).

    ``backward[j]`` and ``sync[j]`` are the backward compute and the gradient reduction of the j-th unit (a
    layer, or an op outside the layers) *in backward order*; ``sync[j]`` becomes ready when ``backward[j]``
    ends.  ``grad_bytes[j]`` its gradient bytes (for bucketing; None: one bucket per unit);
    ``tail_compute`` is backward compute that follows the last unit and hides its reduction too.
    """
    return sync_schedule(backward, sync, policy, grad_bytes, tail_compute)[0]


def sync_schedule(
    backward: Sequence[float],
    sync: Sequence[float],
    policy: OverlapPolicy,
    grad_bytes: Sequence[float] | None = None,
    tail_compute: float = 0.0,
) -> tuple[float, list[int]]:
    """(exposed seconds, the units of the last bucket with a reduction) of :func:`exposed_gradient_sync`.

    The last bucket is what the report names: it is issued only once backward has (almost) ended.  Without
    overlap every unit with a reduction is listed (all run after backward)."""
    if len(backward) != len(sync):
        raise ValueError(f"need one backward time per sync time, got {len(backward)} and {len(sync)}")
    if not policy.overlap_grad_sync:
        return float(sum(sync)), [j for j, s in enumerate(sync) if s > 0]
    stream = SyncStream(policy.bucket_bytes if grad_bytes is not None else 0.0)
    for j, (b, s) in enumerate(zip(backward, sync, strict=True)):
        stream.add(b, s, grad_bytes[j] if grad_bytes is not None else 0.0, j)
    return stream.exposed(tail_compute), stream.last()


class SyncStream:
    """The gradient-sync stream of model item 2, fed unit by unit in backward order (one rule for the
    intra-op step and the pipeline's stages, which extend a stream layer by layer and copy it).

    ``add(backward, seconds, nbytes)``: a unit whose backward takes ``backward`` and then makes gradients
    that reduce in ``seconds`` (``nbytes`` of them; 0 s: nothing to reduce).  Reducing gradients join the
    open bucket, which is issued once it holds ``bucket_bytes`` (0: every unit its own bucket) after the
    bucket before it; the last, partly filled bucket is issued when its last member is ready."""

    def __init__(self, bucket_bytes: float) -> None:
        self.bucket_bytes = bucket_bytes
        self.clock = self.comm_end = 0.0  # backward so far; when the issued buckets finish
        self.held = self.pending = self.ready = (
            0.0  # the open bucket: bytes, seconds, its last member's ready
        )
        self.members: list[int] = []  # the open bucket's units (or the last issued one's)
        self.closed = True  # whether ``members`` is an issued bucket's

    def copy(self) -> SyncStream:
        twin = SyncStream(self.bucket_bytes)
        twin.clock, twin.comm_end, twin.held, twin.pending = (
            self.clock,
            self.comm_end,
            self.held,
            self.pending,
        )
        twin.ready, twin.members, twin.closed = self.ready, list(self.members), self.closed
        return twin

    def add(self, backward: float, seconds: float, nbytes: float, unit: int = -1) -> None:
        self.clock += backward
        if seconds <= 0:
            return
        if self.closed:
            self.members, self.closed = [], False
        self.members.append(unit)
        self.held, self.pending, self.ready = self.held + nbytes, self.pending + seconds, self.clock
        if self.held >= self.bucket_bytes:
            self._issue()

    def _issue(self) -> None:
        self.comm_end = max(self.comm_end, self.ready) + self.pending
        self.held = self.pending = 0.0
        self.closed = True

    def exposed(self, tail_compute: float = 0.0) -> float:
        """Seconds the stream finishes after the backward (plus ``tail_compute``), the open bucket issued."""
        end = max(self.comm_end, self.ready) + self.pending if self.pending > 0 else self.comm_end
        return max(0.0, end - (self.clock + tail_compute))

    def last(self) -> list[int]:
        """The units of the last bucket (open or issued)."""
        return list(self.members)


def exposed_sync_repeated(compute: float, sync: float, layers: int, tail_compute: float = 0.0) -> float:
    """Closed form of :func:`exposed_gradient_sync` for ``layers`` identical layers: s + (L−1)·max(0, s−c)."""
    if layers < 1:
        return 0.0
    return max(0.0, sync + (layers - 1) * max(0.0, sync - compute) - tail_compute)


def exposed_prefetched_gathers(gathers: Sequence[float], compute: Sequence[float], prefetch: int) -> float:
    """Exposed seconds of per-layer all-gathers prefetched under the previous layer's compute (model item 3).

    ``gathers[i]`` and ``compute[i]`` are layer i's gather and compute, in execution order.
    """
    if len(gathers) != len(compute):
        raise ValueError(f"need one compute time per gather, got {len(gathers)} and {len(compute)}")
    if prefetch < 1 or not gathers:
        return float(sum(gathers))
    exposed = gathers[0]
    for i in range(1, len(gathers)):
        exposed += max(0.0, gathers[i] - compute[i - 1])
    return exposed
