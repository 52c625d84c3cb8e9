"""Gradient synchronisation once per step, not once per microbatch, for a stage module run by a schedule.

Input: an emitted module (:func:`autoshard.parallelize`).  In its graph a parameter's gradient is
synchronised by the backward steps of the edge that reads it, ``redistribute(weight, comm, "<forward>",
"<backward>")``: data parallel's ``all_reduce`` runs in the backward of every microbatch a pipeline schedule
feeds through.  The planner prices it once per step (gradients accumulate locally, then one all-reduce), and
since every collective is linear the sum of per-microbatch all-reduces equals the all-reduce of the sum.

:func:`defer_gradient_sync` rewrites the graph so that such an edge runs no backward steps, and returns them;
:func:`sync_gradients` runs them once on each accumulated gradient after the schedule's step.  Only an edge
that is a parameter's *only* use and reads it in its own layout (no forward steps) is deferred: then its
backward steps map a gradient of the parameter's local shape to that shape (data parallel's all-reduce,
or reduce-scatter + all-reduce + all-gather over two axes).  A gathered weight (FSDP: all-gather forward,
reduce-scatter backward) gets a gradient of another shape from its consumer, so its steps stay in the
backward; a parameter read by two edges could have its other edge's gradient reduced too.  Deferred steps
still go through the module's collective log (phase ``backward``).

Example::

    deferred = defer_gradient_sync(module)        # before the first step
    schedule.step(...); sync_gradients(module, deferred)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import fx

from autoshard.codegen.collectives import parse_steps, redistribute, run_steps
from autoshard.codegen.parallelize import parallel_info

__all__ = ["DeferredSync", "defer_gradient_sync", "sync_gradients"]


@dataclass(frozen=True, slots=True)
class DeferredSync:
    """A parameter's gradient steps taken out of the backward: run them once per step."""

    param: str  # FQN in the emitted module
    steps: str  # in the step notation, e.g. "all_reduce(axis=0, 64.0 KiB)"

    def __str__(self) -> str:
        return f"{self.param}: {self.steps}"


def defer_gradient_sync(module: fx.GraphModule) -> tuple[DeferredSync, ...]:
    """Take every deferrable gradient all-reduce out of ``module``'s backward (module doc); the graph is
    rewritten and recompiled in place."""
    params = dict(module.named_parameters())
    deferred = []
    for node in module.graph.nodes:
        if node.op != "get_attr" or node.target not in params or len(node.users) != 1:
            continue
        (user,) = node.users
        if user.target is not redistribute or len(user.args) < 4 or user.args[0] is not node:
            continue
        backward = str(user.args[3])
        if str(user.args[2]).strip() or not any(s.is_collective for s in parse_steps(backward)):
            continue  # the weight is gathered (its gradient changes shape on the way back), or nothing to sync
        user.args = (*user.args[:3], "", *user.args[4:])
        deferred.append(DeferredSync(str(node.target), backward))
    if deferred:
        module.recompile()
    return tuple(deferred)


def sync_gradients(module: fx.GraphModule, deferred: tuple[DeferredSync, ...]) -> None:
    """Run the deferred steps on each parameter's accumulated gradient (a collective of the module's mesh:
    every rank of the stage calls it, in the same order)."""
    comm = parallel_info(module).comm
    for item in deferred:
        param = module.get_parameter(item.param)
        grad = param.grad if param.grad is not None else torch.zeros_like(param)
        with torch.no_grad():
            param.grad = run_steps(grad, parse_steps(item.steps), comm, "backward")
