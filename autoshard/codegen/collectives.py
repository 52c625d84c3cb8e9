"""The collectives of an emitted module: planned redistribution steps run with ``torch.distributed``.

Input: a device's local tensor, the :class:`~autoshard.redistribute.Step` list that the planner priced for an
edge (:func:`autoshard.problem.costs.edge_steps`), and a :class:`MeshComm` (this rank's mesh coordinate and
the process group of every mesh axis).  Output: the local tensor after the steps -- exactly what
:func:`autoshard.redistribute_local.apply_steps_local` computes for this device (same dims, chunk order, and
outer-axis-first nesting), which the tests check step kind by step kind.

:func:`redistribute` is what the emitted graph calls, once per edge that moves data.  It is one
``autograd.Function`` whose forward runs the edge's *forward* steps and whose backward runs the edge's
*backward* steps, the ones the cost model priced (``consumer's input_grads spec -> dual(producer spec)``),
not the mechanical adjoint of the forward.  That is how the classic patterns come out of one rule:

==========================================  ==========================  ===========================
edge                                        forward                     backward
==========================================  ==========================  ===========================
Megatron ``f`` (R input of a column linear)  identity                    ``all_reduce``
Megatron ``g`` (P output of a row linear)    ``all_reduce``              identity
FSDP parameter ``S(0)`` into a batch split   ``all_gather``              ``reduce_scatter``
DP parameter ``R`` into a batch split        identity                    ``all_reduce``
==========================================  ==========================  ===========================

Steps travel through the graph as text in the same notation the planner prints (``str(Step)``, joined by
``"; "``), so ``print(module.code)`` shows every collective; the text is parsed once and cached.

Why plain ``torch.distributed`` calls inside a custom ``autograd.Function`` rather than DTensor's
``redistribute`` or the functional collectives: we must run *our* planned steps in both directions (DTensor
plans its own, and its backward of a redistribution is fixed), and on gloo the synchronous in-place c10d
calls measured 0.8-1.2 ms per small collective against 1.3-2.1 ms for ``_functional_collectives`` (which
add an async work object and a ``wait_tensor`` per call) on this machine.  On NCCL the same calls enqueue on
the communicator's stream.

Example (inside an initialised process group)::

    comm = MeshComm.from_device_mesh(init_device_mesh("cpu", (2,)))
    y = redistribute(x, comm, "all_gather(axis=0, dim=1, 64 B)", "local_slice(axis=0, dim=1, 64 B)")
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from autoshard.errors import ShardingError
from autoshard.redistribute import Step, StepKind
from autoshard.strategies.local import zigzag_chunks

__all__ = [
    "CollectiveRecord",
    "MeshComm",
    "RingHop",
    "format_steps",
    "gather_dtype",
    "join_unused",
    "parse_steps",
    "redistribute",
    "reduce_scatter_single",
    "run_steps",
]


class CollectiveRecord(NamedTuple):
    """One collective as it ran: the sequence of these must be identical on every rank."""

    phase: str  # "forward" | "backward"
    kind: str
    mesh_axis: int
    nbytes: int  # nccl-tests S: the buffer unsharded over the axis (as Step.nbytes)


class RingHop(NamedTuple):
    """One hop of context parallelism's K/V ring as this rank sent it (:mod:`autoshard.codegen.context`)."""

    phase: str  # "forward" | "backward"
    mesh_axis: int
    nbytes: int  # what this rank sent: its K and V (and, backward, their gradients)
    sends: int  # its point-to-point sends (one per tensor)
    elements: int = 0  # the elements of those tensors (nbytes in any dtype: verify runs no autocast)


class MeshComm:
    """This rank's view of the device mesh: its coordinate and one process group per mesh axis.

    ``log`` is ``None`` (not recording) or a list that every collective appends a :class:`CollectiveRecord`
    to; compare the lists of all ranks to check that they issue the same collectives in the same order.
    ``hops`` likewise records every ring hop this rank sends (:class:`RingHop`; ``Plan.ring_transfers``).
    ``zigzag_axis`` is the mesh axis whose splits use the load-balanced layout of context parallelism (member
    ``k`` of ``n`` holds chunks ``k`` and ``2n - 1 - k`` of ``2n``): its steps reorder chunks where they
    gather or split, so a gathered tensor is in global order again.
    """

    __slots__ = ("coord", "groups", "hops", "log", "low_gathers", "mesh_shape", "zigzag_axis")

    def __init__(
        self,
        mesh_shape: Sequence[int],
        coord: Sequence[int],
        groups: Sequence[dist.ProcessGroup | None],
        *,
        record: bool = False,
    ) -> None:
        self.mesh_shape = tuple(int(n) for n in mesh_shape)
        self.coord = tuple(int(c) for c in coord)
        self.groups = tuple(groups)
        self.log: list[CollectiveRecord] | None = [] if record else None
        self.hops: list[RingHop] | None = [] if record else None
        self.zigzag_axis: int | None = None
        self.low_gathers = False  # the plan's recipe gathers parameters in autocast's dtype (gather_dtype)
        if not (len(self.mesh_shape) == len(self.coord) == len(self.groups)):
            raise ValueError(
                f"MeshComm needs one coordinate and one group per mesh axis: mesh {self.mesh_shape}, "
                f"coord {self.coord}, {len(self.groups)} groups"
            )

    @classmethod
    def from_device_mesh(cls, mesh: Any, *, record: bool = False) -> MeshComm:
        """From a ``torch.distributed.device_mesh.DeviceMesh`` this rank belongs to."""
        shape = tuple(int(n) for n in mesh.shape)
        coord = mesh.get_coordinate()
        if coord is None:
            raise ShardingError(
                f"this rank is not part of the device mesh {mesh}: use a mesh over every rank"
            )
        groups = [mesh.get_group(a) if n > 1 else None for a, n in enumerate(shape)]
        return cls(shape, coord, groups, record=record)

    def group(self, axis: int) -> dist.ProcessGroup:
        g = self.groups[axis]
        assert g is not None, f"axis {axis} has size 1: no step runs on it"
        return g

    def __repr__(self) -> str:
        return f"MeshComm(mesh={self.mesh_shape}, coord={self.coord})"


# -- the step notation ------------------------------------------------------------------------------------------
_STEP = re.compile(r"^(\w+)\(axis=(\d+)(?:, dim=(\d+)(?:->(\d+))?)?(?:, [^)]*)?\)$")
_SRC_ONLY = frozenset({"all_gather", "local_pad"})


def format_steps(steps: Sequence[Step]) -> str:
    """``"all_gather(axis=0, dim=1, 64 B); local_slice(axis=1, dim=0, 32 B)"``; ``""`` for none."""
    return "; ".join(str(s) for s in steps)


@functools.lru_cache(maxsize=4096)
def parse_steps(text: str) -> tuple[Step, ...]:
    """Inverse of :func:`format_steps` (the byte count, for display only, is read back as 0)."""
    steps: list[Step] = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        m = _STEP.match(part)
        if m is None:
            raise ValueError(
                f"cannot parse redistribution step {part!r}: expected e.g. 'all_gather(axis=0, dim=1)'"
            )
        kind, axis, first, second = m.group(1), int(m.group(2)), m.group(3), m.group(4)
        src: int | None
        dst: int | None
        if second is not None:
            src, dst = int(first), int(second)
        elif first is None:
            src = dst = None
        else:
            src, dst = (int(first), None) if kind in _SRC_ONLY else (None, int(first))
        steps.append(Step(kind, axis, src, dst, 0))  # type: ignore[arg-type]
    return tuple(steps)


# -- one step on one device ---------------------------------------------------------------------------------------
_all_gather_base = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
# torch 2.13 renamed both; its ``reduce_scatter_tensor`` warns (FutureWarning) on every call
reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _dim(d: int | None) -> int:
    assert d is not None, "Step.__post_init__ guarantees the dims its kind needs"
    return d


def issue_all_gather(
    x: torch.Tensor, step: Step, comm: MeshComm, *, async_op: bool = False
) -> Callable[[], torch.Tensor]:
    """Start one ``all_gather`` step; the returned callable waits for it (when ``async_op``) and gives the
    gathered tensor.  The FSDP prefetch (:mod:`autoshard.runtime.prefetch`) issues it ahead of use."""
    n, d = comm.mesh_shape[step.mesh_axis], _dim(step.src_dim)
    flat = x.new_empty((n * x.shape[0], *x.shape[1:]) if x.dim() else (n,))  # c10d gathers along dim 0
    work = _all_gather_base(flat, x.contiguous(), group=comm.group(step.mesh_axis), async_op=async_op)
    shape = x.shape

    def done() -> torch.Tensor:
        if async_op:
            work.wait()
        # (n, ..., s_d, ...) -> (..., n * s_d, ...): member k's piece lands at [k * s_d, (k + 1) * s_d)
        full = flat.view(n, *shape).movedim(0, d).reshape(*shape[:d], n * shape[d], *shape[d + 1 :])
        if step.mesh_axis == comm.zigzag_axis:
            full = _reorder(full, d, _from_zigzag(n))
        return full

    return done


def _all_gather(x: torch.Tensor, step: Step, comm: MeshComm) -> tuple[torch.Tensor, int]:
    full = issue_all_gather(x, step, comm)()
    return full, full.numel() * full.element_size()


def _reduce_scatter(x: torch.Tensor, step: Step, comm: MeshComm) -> tuple[torch.Tensor, int]:
    n, d = comm.mesh_shape[step.mesh_axis], _dim(step.dst_dim)
    if step.mesh_axis == comm.zigzag_axis:
        x = _reorder(x, d, _to_zigzag(n))
    chunks = torch.stack(x.chunk(n, dim=d))  # (n, ...chunk): chunk k goes to member k
    out = x.new_empty(chunks.shape[1:])
    flat = chunks.view(-1, *chunks.shape[2:]) if out.dim() else chunks  # c10d scatters along dim 0
    reduce_scatter_single(out, flat, group=comm.group(step.mesh_axis))
    return out, x.numel() * x.element_size()


def _all_reduce(x: torch.Tensor, step: Step, comm: MeshComm) -> tuple[torch.Tensor, int]:
    out = x.clone(memory_format=torch.contiguous_format)  # x may be saved for backward elsewhere
    dist.all_reduce(out, group=comm.group(step.mesh_axis))
    return out, out.numel() * out.element_size()


def _all_to_all(x: torch.Tensor, step: Step, comm: MeshComm) -> tuple[torch.Tensor, int]:
    n = comm.mesh_shape[step.mesh_axis]
    src, dst = _dim(step.src_dim), _dim(step.dst_dim)
    zigzag = step.mesh_axis == comm.zigzag_axis
    sent = torch.stack(
        (_reorder(x, dst, _to_zigzag(n)) if zigzag else x).chunk(n, dim=dst)
    )  # [k] to member k
    received = torch.empty_like(sent)  # received[m] came from member m
    dist.all_to_all_single(received, sent, group=comm.group(step.mesh_axis))
    out = torch.cat(received.unbind(0), dim=src)
    return (_reorder(out, src, _from_zigzag(n)) if zigzag else out), x.numel() * x.element_size()


def _local_slice(x: torch.Tensor, step: Step, comm: MeshComm) -> tuple[torch.Tensor, int]:
    n, k = comm.mesh_shape[step.mesh_axis], comm.coord[step.mesh_axis]
    if step.mesh_axis == comm.zigzag_axis:  # cat copies
        chunks = x.chunk(2 * n, dim=_dim(step.dst_dim))
        return torch.cat([chunks[c] for c in zigzag_chunks(k, n)], dim=_dim(step.dst_dim)), 0
    # a copy, not a view: a view would keep the whole tensor alive (a sliced gradient as .grad holds the full one)
    return x.chunk(n, dim=_dim(step.dst_dim))[k].clone(memory_format=torch.contiguous_format), 0


def _local_zero(x: torch.Tensor, step: Step, comm: MeshComm) -> tuple[torch.Tensor, int]:
    return (x if comm.coord[step.mesh_axis] == 0 else torch.zeros_like(x)), 0


def _local_pad(x: torch.Tensor, step: Step, comm: MeshComm) -> tuple[torch.Tensor, int]:
    n, k, d = comm.mesh_shape[step.mesh_axis], comm.coord[step.mesh_axis], _dim(step.src_dim)
    shape = list(x.shape)
    shape[d] *= n
    out = x.new_zeros(shape)
    if step.mesh_axis == comm.zigzag_axis:
        half = x.shape[d] // 2
        for i, c in enumerate(zigzag_chunks(k, n)):
            out.narrow(d, c * half, half).copy_(x.narrow(d, i * half, half))
        return out, 0
    out.narrow(d, k * x.shape[d], x.shape[d]).copy_(x)
    return out, 0


def _to_zigzag(n: int) -> tuple[int, ...]:
    """Chunk order (of ``2n``) that puts member ``k``'s two chunks at positions ``2k, 2k + 1``."""
    return tuple(c for k in range(n) for c in zigzag_chunks(k, n))


def _from_zigzag(n: int) -> tuple[int, ...]:
    """The inverse of :func:`_to_zigzag`: chunk order that restores global order after a gather."""
    order = _to_zigzag(n)
    return tuple(order.index(c) for c in range(2 * n))


def _reorder(x: torch.Tensor, dim: int, order: Sequence[int]) -> torch.Tensor:
    """``x`` cut in ``len(order)`` chunks along ``dim``, concatenated in ``order`` (a copy)."""
    chunks = x.chunk(len(order), dim=dim)
    return torch.cat([chunks[i] for i in order], dim=dim)


_RUNNERS: dict[StepKind, Callable[[torch.Tensor, Step, MeshComm], tuple[torch.Tensor, int]]] = {
    "all_gather": _all_gather,
    "reduce_scatter": _reduce_scatter,
    "all_reduce": _all_reduce,
    "all_to_all": _all_to_all,
    "local_slice": _local_slice,
    "local_zero": _local_zero,
    "local_pad": _local_pad,
}


def run_steps(x: torch.Tensor, steps: Sequence[Step], comm: MeshComm, phase: str = "forward") -> torch.Tensor:
    """Apply ``steps`` to this rank's piece ``x`` (no autograd): :func:`apply_steps_local`'s semantics."""
    for step in steps:
        x, nbytes = _RUNNERS[step.kind](x, step, comm)
        if comm.log is not None and step.is_collective:
            comm.log.append(CollectiveRecord(phase, step.kind, step.mesh_axis, nbytes))
    return x


# -- autograd ----------------------------------------------------------------------------------------------------
class _Redistribute(torch.autograd.Function):
    """Forward: the edge's forward steps (on ``x`` cast to ``low`` first, when given).  Backward: the edge's
    planned backward steps on the gradient, in ``x``'s own dtype."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        comm: MeshComm,
        forward: tuple[Step, ...],
        backward: tuple[Step, ...],
        low: torch.dtype | None = None,
    ) -> torch.Tensor:
        ctx.comm, ctx.steps, ctx.dtype = comm, backward, x.dtype
        return run_steps(x if low is None else x.to(low), forward, comm, "forward")

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None, None]:
        return run_steps(grad.to(ctx.dtype), ctx.steps, ctx.comm, "backward"), None, None, None, None


def gather_dtype(x: torch.Tensor, comm: MeshComm) -> torch.dtype | None:
    """The dtype the forward collectives of ``x`` run in: autocast's for a parameter of a module whose plan
    gathers parameters in the 16-bit dtype (``comm.low_gathers``: the amp recipe, FSDP2's
    ``MixedPrecisionPolicy.param_dtype``, :func:`autoshard.problem.autocast.recast_parameter`) while autocast
    is on and narrower than ``x``, else None (its own)."""
    device = x.device.type
    if not (comm.low_gathers and isinstance(x, torch.nn.Parameter) and torch.is_autocast_enabled(device)):
        return None
    low = torch.get_autocast_dtype(device)
    return low if low.itemsize < x.element_size() else None


def redistribute(x: torch.Tensor, comm: MeshComm, forward: str, backward: str = "") -> torch.Tensor:
    """What the emitted graph calls on an edge: run ``forward`` now and ``backward`` on the gradient.

    ``forward``/``backward`` are step lists in :func:`format_steps` notation.  A parameter gathered under
    the amp recipe (:func:`gather_dtype`) is cast to autocast's dtype before the forward steps and its
    gradient back to its own before the backward ones: gathered in bf16, reduced in fp32, as priced.
    """
    fwd, bwd = parse_steps(forward), parse_steps(backward)
    cast = gather_dtype(x, comm) if any(s.is_collective for s in fwd) else None
    if not (torch.is_grad_enabled() and x.requires_grad):
        return run_steps(x if cast is None else x.to(cast), fwd, comm, "forward")
    return _Redistribute.apply(x, comm, fwd, bwd, cast)


class _Join(torch.autograd.Function):
    """``out`` unchanged; in backward, zero gradients for ``unused`` (so their edges' backward still runs)."""

    @staticmethod
    def forward(ctx: Any, out: torch.Tensor, *unused: torch.Tensor) -> torch.Tensor:
        ctx.like = [(u.shape, u.dtype, u.device) for u in unused]
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        return (grad, *(torch.zeros(s, dtype=d, device=v) for s, d, v in ctx.like))


def join_unused(out: torch.Tensor, *unused: torch.Tensor) -> torch.Tensor:
    """Tie tensors this rank's op does not read (a bias only the first device of a Partial axis adds) to its
    output, so that backward reaches their edges on every rank and the collectives stay in step."""
    if not (torch.is_grad_enabled() and any(u.requires_grad for u in unused)):
        return out
    return _Join.apply(out, *unused)
