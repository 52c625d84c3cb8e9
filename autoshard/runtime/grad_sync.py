"""The one pass that rewrites gradient-sync edges: take a parameter's gradient reduction out of the backward,
and run it later -- once per step (pipelines), as a reduce-scatter (ZeRO), or bucketed and asynchronous (DDP).

Input: an emitted module (:func:`autoshard.parallelize`).  In its graph a parameter's gradient is
synchronised by the backward steps of the edges that read it, ``redistribute(weight, comm, "<forward>",
"<backward>")``: data parallel's ``all_reduce`` runs in the backward of every microbatch a pipeline schedule
feeds through.  The planner prices it once per step (gradients accumulate locally, then one reduction), and
since every collective is linear the sum of per-microbatch reductions equals the reduction of the sum.

:func:`defer_gradient_sync` is the only code that rewrites those edges.  It takes out, per parameter:

1. a *sole* use that reads the parameter in its own layout (no forward steps): all its backward steps (data
   parallel's all-reduce, or reduce-scatter + all-reduce + all-gather over two axes);
2. otherwise, when every use is an edge, the ``all_reduce`` steps on the mesh axes where the parameter is
   replicated and *every* use all-reduces (a weight read by two edges; an edge that also slices); an axis
   some use does not reduce keeps the others' all-reduces (the gradient is replicated there, and ZeRO-1
   gathers it: :mod:`autoshard.problem.zero_gathers` prices the same rule);
3. with ``gathered=True`` (pipelines), a sole use that *gathers* the parameter (FSDP: all-gather forward,
   reduce-scatter backward): its backward then adds the gathered gradient into a buffer on the parameter
   and the reduce-scatter runs once per step on the sum (as FSDP2 does with gradient sync off between
   microbatches: the unsharded gradient is held until the last one).

What was taken out is recorded on the module (:class:`DeferredSync` per parameter), so a second call -- a
ZeRO optimizer over a pipeline stage -- sees the same record; the consumers then claim parts of it:

- :class:`~autoshard.runtime.zero.ZeroOptimizer` claims the pure sums (:attr:`DeferredSync.axes`) and
  reduce-scatters them (:func:`claim`);
- :func:`sync_gradients` runs whatever nobody claimed, once, after a pipeline step;
- :class:`~autoshard.runtime.overlap.GradSyncOverlap` runs them bucketed and asynchronously during backward.

Deferred steps still go through the module's collective log (phase ``backward``).

Example::

    deferred = defer_gradient_sync(module)        # before the first step
    schedule.step(...); sync_gradients(module, deferred)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from autoshard.codegen.collectives import MeshComm, format_steps, parse_steps, redistribute, run_steps
from autoshard.codegen.parallelize import INFO_ATTR
from autoshard.placement import Replicate
from autoshard.redistribute import Step

__all__ = [
    "DeferredSync",
    "claim",
    "defer_gradient_sync",
    "gather_later",
    "gather_later_resharded",
    "sum_axes",
    "sync_gradients",
]

RECORD_ATTR = "_autoshard_grad_sync"  # {fqn: DeferredSync} on the module
CLAIMED_ATTR = "_autoshard_grad_sync_claimed"  # fqns whose sync another component runs
PENDING_ATTR = "_autoshard_pending_grad"  # the accumulated gathered gradient on a parameter (rule 3)


@dataclass(frozen=True, slots=True)
class DeferredSync:
    """A parameter's gradient steps taken out of the backward: run them once per step."""

    param: str  # FQN in the emitted module
    steps: str  # in the step notation, e.g. "all_reduce(axis=0, 64.0 KiB)"
    gathered: bool = False  # rule 3: the gradient waits whole in a buffer, the steps reduce-scatter it

    def __str__(self) -> str:
        return f"{self.param}: {self.steps}"

    @property
    def axes(self) -> tuple[int, ...] | None:
        """The mesh axes the steps sum the gradient over, when that is all they do (else None)."""
        return None if self.gathered else sum_axes(parse_steps(self.steps))


def sum_axes(steps: tuple[Step, ...]) -> tuple[int, ...] | None:
    """Axes a step list sums over when it is a pure sum (all-reduces, reduce-scatters undone by all-gathers
    on the same axis and dim, in stack order); None for anything else."""
    axes: set[int] = set()
    open_rs: list[tuple[int, int | None]] = []
    for s in steps:
        if s.kind == "all_reduce":
            axes.add(s.mesh_axis)
        elif s.kind == "reduce_scatter":
            open_rs.append((s.mesh_axis, s.dst_dim))
            axes.add(s.mesh_axis)
        elif s.kind == "all_gather" and open_rs and open_rs[-1] == (s.mesh_axis, s.src_dim):
            open_rs.pop()
        else:
            return None
    return tuple(sorted(axes)) if not open_rs else None


def defer_gradient_sync(module: fx.GraphModule, *, gathered: bool = False) -> tuple[DeferredSync, ...]:
    """Take every deferrable gradient sync out of ``module``'s backward (module doc); the graph is rewritten
    and recompiled in place.  Returns the module's whole record (what earlier calls took out too)."""
    from autoshard.runtime.reshard import gather_param

    record: dict[str, DeferredSync] = dict(getattr(module, RECORD_ATTR, {}))
    params = dict(module.named_parameters())
    replicated = _replicated(module)
    edge_kinds = (redistribute, gather_param)
    changed: set[fx.GraphModule] = set()
    # the root graph and the recomputed blocks' (codegen.recompute: their get_attr names are the root's FQNs)
    graphs = [module, *(m for m in module.modules() if isinstance(m, fx.GraphModule) and m is not module)]
    for graph, node in ((g, n) for g in graphs for n in g.graph.nodes):
        if node.op != "get_attr" or node.target not in params or node.target in record:
            continue
        users = list(node.users)
        if not users or any(u.target not in edge_kinds or u.args[0] is not node for u in users):
            continue
        fqn = str(node.target)
        forward = str(users[0].args[2]).strip()
        if not any(s.is_collective for u in users for s in parse_steps(str(u.args[3]))):
            continue
        if len(users) == 1 and not forward:  # rule 1
            record[fqn] = DeferredSync(fqn, str(users[0].args[3]))
            users[0].args = (*users[0].args[:3], "")
        elif len(users) == 1 and gathered and any(s.kind == "all_gather" for s in parse_steps(forward)):
            resharded = users[0].target is gather_param  # freed after use, re-gathered in backward
            users[0].target = gather_later_resharded if resharded else gather_later  # rule 3
            record[fqn] = DeferredSync(fqn, str(users[0].args[3]), gathered=True)
        else:  # rule 2
            per_use = [
                {s.mesh_axis for s in parse_steps(str(u.args[3])) if s.kind == "all_reduce"} for u in users
            ]
            axes = set.intersection(*per_use) & replicated.get(fqn, set())
            if not axes:
                continue
            for u in users:
                kept = [
                    s
                    for s in parse_steps(str(u.args[3]))
                    if not (s.kind == "all_reduce" and s.mesh_axis in axes)
                ]
                u.args = (*u.args[:3], format_steps(kept))
            record[fqn] = DeferredSync(
                fqn, format_steps(tuple(Step("all_reduce", a, None, None, 0) for a in sorted(axes)))
            )
        changed.add(graph)
    for graph in changed:
        graph.recompile()
    setattr(module, RECORD_ATTR, record)
    return tuple(record.values())


def _replicated(module: fx.GraphModule) -> dict[str, set[int]]:
    info = getattr(module, INFO_ATTR, None)
    if info is None:
        return {}
    shape = info.comm.mesh_shape
    return {
        a.fqn: {i for i, p in enumerate(a.spec.placements) if isinstance(p, Replicate) and shape[i] > 1}
        for a in info.attrs
        if a.kind == "parameter"
    }


def claim(module: fx.GraphModule, fqns: set[str]) -> None:
    """Another component (ZeRO) runs these parameters' deferred syncs: :func:`sync_gradients` skips them."""
    setattr(module, CLAIMED_ATTR, set(getattr(module, CLAIMED_ATTR, set())) | fqns)


def unclaimed(module: fx.GraphModule, deferred: tuple[DeferredSync, ...]) -> tuple[DeferredSync, ...]:
    taken: set[str] = getattr(module, CLAIMED_ATTR, set())
    return tuple(d for d in deferred if d.param not in taken)


def sync_gradients(
    module: fx.GraphModule,
    deferred: tuple[DeferredSync, ...],
    *,
    claimed: bool = False,
    scale: int = 1,
) -> None:
    """Run the deferred steps nobody claimed on each parameter's accumulated gradient (a collective of the
    module's mesh: every rank of the stage calls it, in the same order).  ``claimed``: run ``deferred`` as
    given (the component that claimed them calls).  ``scale``: divide held gathered gradients by it first (a
    pipeline schedule divides ``.grad`` by the microbatch count, which the held buffer missed)."""
    comm: MeshComm = getattr(module, INFO_ATTR).comm
    for item in deferred if claimed else unclaimed(module, deferred):
        param = module.get_parameter(item.param)
        with torch.no_grad():
            if item.gathered:
                pending = getattr(param, PENDING_ATTR, None)
                if pending is None:
                    continue
                setattr(param, PENDING_ATTR, None)
                if scale != 1:
                    pending.div_(scale)
                part = run_steps(pending, parse_steps(item.steps), comm, "backward")
                param.grad = part if param.grad is None else param.grad.add_(part)
                continue
            grad = param.grad if param.grad is not None else torch.zeros_like(param)
            param.grad = run_steps(grad, parse_steps(item.steps), comm, "backward")


class _GatherLater(torch.autograd.Function):
    """Forward: the edge's forward steps.  Backward: add the (gathered-layout) gradient to the parameter's
    pending buffer; the parameter gets no gradient until :func:`sync_gradients` reduces the sum."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, comm: MeshComm, forward: str) -> torch.Tensor:
        ctx.param = x
        return run_steps(x.detach(), parse_steps(forward), comm, "forward")

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, None, None]:
        pending = getattr(ctx.param, PENDING_ATTR, None)
        setattr(ctx.param, PENDING_ATTR, grad.clone() if pending is None else pending.add_(grad))
        return None, None, None


def gather_later(x: torch.Tensor, comm: MeshComm, forward: str, backward: str = "") -> torch.Tensor:
    """A gathered parameter's edge whose gradient reduction waits for :func:`sync_gradients` (rule 3)."""
    if not (torch.is_grad_enabled() and x.requires_grad):
        return run_steps(x, parse_steps(forward), comm, "forward")
    out: torch.Tensor = _GatherLater.apply(x, comm, forward)
    return out


def gather_later_resharded(x: torch.Tensor, comm: MeshComm, forward: str, backward: str = "") -> torch.Tensor:
    """:func:`gather_later` of a module that frees gathered weights after use (:mod:`autoshard.runtime.reshard`)."""
    from autoshard.runtime.reshard import remember_gathered

    out = gather_later(x, comm, forward, backward)
    remember_gathered(out, x, comm, forward)
    return out
