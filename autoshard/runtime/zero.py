"""ZeRO at run time: optimizer state (and gradients) of an emitted module sharded as the cost model prices them.

Input: a module from :func:`autoshard.parallelize` (its parameters are this rank's shards under the plan) and
a torch optimizer class (``torch.optim.AdamW``).  Output: :class:`ZeroOptimizer`, which steps like a torch
optimizer.  ``autoshard.problem.costs`` prices ``shard_optimizer`` (ZeRO-1, the default) as: every
parameter's Adam state split over *all* devices -- a parameter's local piece is split once more over the mesh
axes on which it is replicated -- its gradient reduce-scattered over those axes instead of all-reduced, and
the updated piece all-gathered: the same bytes as the all-reduce the plan's edge pays.  This module runs
exactly that:

- gradient sync is deferred (:func:`defer_grad_sync`): the ``all_reduce`` steps that the backward of a
  parameter's edges run on axes where the parameter is replicated are taken out of the graph, so the
  gradient stays ``Partial`` there; the optimizer reduce-scatters it over those axes (outer axis first), each
  rank keeping the flat chunk it owns.  Axes on which the gradient is already replicated (a norm weight
  under Megatron) are sliced, not reduced.  On an axis where a parameter's uses disagree (one all-reduces,
  another yields a replicated gradient) the all-reduce stays and the axis is sliced;
  :attr:`ZeroOptimizer.deferred` says which axes were deferred.  The updated chunks are all-gathered over
  every replicated axis; those of axes left sliced are ``Plan.optimizer_gathers`` (priced in the plan's step).
- ``stage=1`` (ZeRO-1): whole local gradients live until ``step()``, which reduce-scatters them, runs the
  inner optimizer on the flat chunks (``torch.optim.AdamW`` over chunk tensors: its state is 1/k of the
  parameter's) and all-gathers the updated chunks into the parameters.
- ``stage=2`` (ZeRO-2): the reduce-scatter runs in each parameter's post-accumulate-grad hook during backward
  and the whole gradient is freed at once; only chunks of gradients stay.
- ``overlap`` (with ``stage=2``; default ``Plan.overlap.overlap_grad_sync``): those reduce-scatters are
  bucketed as the plan's buckets (``Plan.grad_buckets``) and issued asynchronously while backward goes on
  (:mod:`autoshard.runtime.overlap`).
- ``stage=3`` (FSDP / ZeRO-3) is a *plan*: parameters placed ``S(d)`` over the data axes, which the emitted
  module all-gathers before use and whose gradients its backward reduce-scatters (the edges the cost model
  priced).  On such a module this optimizer has nothing left to split for sharded parameters and behaves as
  stage 2 for any replicated remainder (norms); ``stage=3`` checks that the large parameters are sharded.
  Freeing each gathered weight after use (FSDP's reshard-after-forward) is
  :func:`autoshard.runtime.reshard.reshard_after_forward`.

The flat chunk a rank owns: the local piece flattened, zero-padded to a multiple of ``k`` (the product of the
replicated axes' sizes), chunk ``sum_i coord[a_i] * prod_{j>i} k_j`` of ``k``.  Padding stays zero under
AdamW (zero gradient, decoupled decay of zero).  Every collective is logged (phase ``"optimizer"``) on the
module's :class:`~autoshard.codegen.collectives.MeshComm` when it records.

Example::

    module = autoshard.parallelize(model, plan, (ids,))
    opt = ZeroOptimizer(module, torch.optim.AdamW, stage=1, lr=1e-3)
    loss = module(*shard_inputs(plan, ids)).sum(); loss.backward(); opt.step(); opt.zero_grad()
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import fx, nn

from autoshard.codegen.collectives import MeshComm, run_steps
from autoshard.codegen.parallelize import parallel_info
from autoshard.errors import AutoshardError
from autoshard.placement import Replicate, ShardingSpec
from autoshard.redistribute import Step
from autoshard.runtime.grad_sync import claim, defer_gradient_sync
from autoshard.runtime.overlap import GradBuckets

__all__ = ["FlatShard", "ZeroError", "ZeroOptimizer", "defer_grad_sync"]

Stage = Literal[1, 2, 3]
STAGE3_MAX_REPLICATED = 1 << 20
"""Elements above which a replicated parameter is refused under ``stage=3`` (norm weights and biases are far
below; a replicated weight matrix means the plan is not FSDP)."""


class ZeroError(AutoshardError, ValueError):
    """ZeRO was asked of a module or plan that cannot run it."""


def defer_grad_sync(module: fx.GraphModule) -> dict[str, tuple[int, ...]]:
    """Take the gradient sums of replicated parameters out of ``module``'s graph and claim them (module doc).

    One pass rewrites gradient-sync edges (:func:`autoshard.runtime.grad_sync.defer_gradient_sync`); this
    claims, of what it took out (now or earlier, e.g. by a pipeline stage), the pure sums over replicated
    axes.  Returns ``{parameter FQN: mesh axes left Partial}``; a second call returns the same.
    """
    info = parallel_info(module)
    taken: dict[str, tuple[int, ...]] = {}
    for item in defer_gradient_sync(module):
        attr = next(a for a in info.attrs if a.fqn == item.param)
        axes = item.axes
        if axes and set(axes) <= set(_replicated_axes(attr.spec, info.comm.mesh_shape)):
            taken[item.param] = axes
    claim(module, set(taken))
    return taken


def _replicated_axes(spec: ShardingSpec, mesh_shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(a for a, p in enumerate(spec.placements) if isinstance(p, Replicate) and mesh_shape[a] > 1)


@dataclass(frozen=True, slots=True)
class FlatShard:
    """How one parameter's local piece is split over its replicated axes (module doc)."""

    fqn: str
    axes: tuple[int, ...]  # replicated mesh axes, outer first
    partial: tuple[int, ...]  # those on which the gradient arrives Partial (reduce-scattered, not sliced)
    numel: int  # of the local piece
    ways: int  # product of the axes' sizes
    index: int  # which chunk this rank owns

    @classmethod
    def of(
        cls, fqn: str, numel: int, axes: tuple[int, ...], partial: tuple[int, ...], comm: MeshComm
    ) -> FlatShard:
        index = 0
        for a in axes:
            index = index * comm.mesh_shape[a] + comm.coord[a]
        return cls(fqn, axes, partial, numel, math.prod(comm.mesh_shape[a] for a in axes), index)

    @property
    def chunk(self) -> int:
        return -(-self.numel // self.ways)

    def _padded(self, flat: torch.Tensor) -> torch.Tensor:
        if flat.numel() == self.chunk * self.ways:
            return flat.contiguous()
        out = flat.new_zeros(self.chunk * self.ways)
        out[: self.numel] = flat
        return out

    def take(self, flat: torch.Tensor) -> torch.Tensor:
        """This rank's chunk of a replicated flat tensor (a copy)."""
        return self._padded(flat)[self.index * self.chunk : (self.index + 1) * self.chunk].clone()

    def reduce(self, grad: torch.Tensor, comm: MeshComm) -> torch.Tensor:
        """This rank's chunk of the summed gradient: reduce-scatter the Partial axes, slice the others."""
        x = self._padded(grad.reshape(-1))
        for a in self.axes:
            if a in self.partial:
                nbytes = x.numel() * x.element_size()
                x = run_steps(x, (Step("reduce_scatter", a, None, 0, nbytes),), comm, "optimizer")
            else:
                x = x.chunk(comm.mesh_shape[a])[comm.coord[a]]
        return x if self.partial else x.clone()

    def gather(self, chunk: torch.Tensor, comm: MeshComm) -> torch.Tensor:
        """The whole local piece (flat) from every rank's updated chunk (all-gathers, inner axis first)."""
        x = chunk
        for a in reversed(self.axes):
            nbytes = x.numel() * x.element_size() * comm.mesh_shape[a]
            x = run_steps(x, (Step("all_gather", a, 0, None, nbytes),), comm, "optimizer")
        return x[: self.numel]


class ZeroOptimizer:
    """A torch optimizer over this rank's flat chunks of the module's parameters (module doc)."""

    def __init__(
        self,
        module: fx.GraphModule,
        optimizer_cls: Callable[..., torch.optim.Optimizer] = torch.optim.AdamW,
        *,
        stage: Stage = 1,
        overlap: bool | None = None,
        bucket_bytes: int | None = None,
        **optimizer_kwargs: Any,
    ) -> None:
        if stage not in (1, 2, 3):
            raise ZeroError(f"ZeRO stage must be 1, 2 or 3, got {stage!r}")
        info = parallel_info(module)
        self.module, self.stage, self.comm = module, stage, info.comm
        self.deferred = defer_grad_sync(module)
        self.params: list[tuple[nn.Parameter, FlatShard, nn.Parameter]] = []
        for attr in info.attrs:
            if attr.kind != "parameter":
                continue
            param = module.get_parameter(attr.fqn)
            if not param.requires_grad:
                continue
            axes = _replicated_axes(attr.spec, self.comm.mesh_shape)
            if stage == 3 and axes and param.numel() > STAGE3_MAX_REPLICATED:
                raise ZeroError(
                    f"ZeRO-3: {attr.fqn} ({tuple(attr.global_shape)}) is replicated on mesh axes {axes} under "
                    f"the plan ({attr.spec}): plan FSDP (annotate its weight S(0) over the data axes) or use stage 2"
                )
            flat = FlatShard.of(attr.fqn, param.numel(), axes, self.deferred.get(attr.fqn, ()), self.comm)
            # unsplit parameters are updated in place through a flat view; split ones own a chunk copy
            whole = param.detach().view(-1)
            master = nn.Parameter(flat.take(whole) if axes else whole)
            self.params.append((param, flat, master))
        self.inner = optimizer_cls([m for _, _, m in self.params], **optimizer_kwargs)
        split = [(flat, master) for _, flat, master in self.params if flat.axes]
        policy = info.plan.overlap  # the policy the plan priced, unless the caller overrides it
        overlap = policy.overlap_grad_sync if overlap is None else overlap
        size = policy.bucket_bytes if bucket_bytes is None else bucket_bytes
        planned = info.plan.grad_buckets  # followed unless bucket_bytes differs (runtime/overlap.py)
        rounds = info.plan.microbatches  # backward passes per step: the buckets are due in the last
        self.buckets = (
            GradBuckets(split, self.comm, size, planned, rounds) if overlap and stage >= 2 else None
        )
        self._hooks = [
            p.register_post_accumulate_grad_hook(self._hook(flat, master))
            for p, flat, master in self.params
            if stage >= 2 and flat.axes
        ]

    def _hook(self, flat: FlatShard, master: nn.Parameter) -> Callable[[torch.Tensor], None]:
        # weakly: a hook lives on the parameter, out of the garbage collector's sight, so a strong reference
        # would keep this optimizer -- and its process groups -- alive for good (examples/train.py)
        owner = weakref.ref(self)

        def reduce_now(param: torch.Tensor) -> None:
            self = owner()
            assert param.grad is not None and self is not None
            if self.buckets is not None and self.buckets.handles(master):
                self.buckets.add(master, param.grad)  # reduce-scattered asynchronously with its bucket
                param.grad = None
                return
            part = flat.reduce(param.grad, self.comm)
            master.grad = part if master.grad is None else master.grad.add_(part)
            param.grad = None  # ZeRO-2: the whole gradient is freed as soon as it is reduced

        return reduce_now

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.inner.param_groups

    def state_elements(self) -> int:
        """Elements of optimizer state this rank holds (every tensor in the inner optimizer's state)."""
        return sum(
            t.numel()
            for s in self.inner.state.values()
            for t in s.values()
            if isinstance(t, torch.Tensor) and t.dim()
        )

    @torch.no_grad()
    def step(self) -> None:
        """Reduce (stage 1), update the chunks, all-gather them into the module's parameters."""
        if self.buckets is not None:
            self.buckets.finish()
        for param, flat, master in self.params:
            if (self.stage == 1 or not flat.axes) and param.grad is not None:
                master.grad = flat.reduce(param.grad, self.comm) if flat.axes else param.grad.reshape(-1)
        self.inner.step()
        for param, flat, master in self.params:
            if flat.axes:
                param.copy_(flat.gather(master.detach(), self.comm).view_as(param))

    def zero_grad(self, set_to_none: bool = True) -> None:
        for param, _, master in self.params:
            param.grad = None
            master.grad = None

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state)

    def remove_hooks(self) -> None:
        for handle in self._hooks:
            handle.remove()

    def masters(self) -> Iterable[tuple[str, nn.Parameter]]:
        """``(FQN, this rank's flat chunk)`` of every parameter the optimizer steps."""
        return ((flat.fqn, master) for _, flat, master in self.params)
