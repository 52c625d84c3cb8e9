"""FSDP all-gather prefetch: the next layers' parameters are gathered while the current layer computes, in
forward and (with reshard-after-forward) in backward -- ``Plan.overlap.prefetch`` layers ahead, as priced.

Input: a module from :func:`autoshard.parallelize` whose plan stores parameters sharded and all-gathers them
before use (FSDP / ZeRO-3).  :func:`prefetch_gathers` groups the parameter edges whose forward is one
``all_gather`` into *layers* -- by module path up to the first numbered component (``model.layers.3``), as
FSDP2 wraps each transformer block; a parameter outside numbered blocks is a layer of its own -- in graph
order, and routes them through a :class:`Prefetcher` (a submodule of the emitted module, ``call_module``).

Forward: the first use of layer ``i`` waits for its gathers (issuing them now if nobody did) and issues the
gathers of layers ``i + 1 .. i + depth`` asynchronously (``async_op=True``); they run on the process group's
worker while layer ``i`` computes.  Backward, when the module also frees gathered weights after use
(:func:`autoshard.runtime.reshard.reshard_after_forward`): the first re-gather of layer ``i`` issues those of
layers ``i - 1 .. i - depth``; each re-gathered weight serves every saved view of it and is dropped after
the last.  Outside the module's forward (a recomputed block) gathers run synchronously.

Every gather is logged at issue as the synchronous path logs it (phase ``forward`` / ``regather``), so the
collectives a step runs are the same with or without prefetch.  With ``record=True`` the prefetcher also
keeps :attr:`Prefetcher.events`, ``(action, phase, layer)`` with action ``issue`` or ``use``, which the tests
read to check that a layer's gather was in flight before the previous layer's last use.

Example::

    module = autoshard.parallelize(model, fsdp_plan, (ids,))
    reshard_after_forward(module); prefetch_gathers(module)   # depth from plan.overlap.prefetch
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
from torch import fx, nn

from autoshard.codegen.collectives import (
    MeshComm,
    gather_dtype,
    issue_all_gather,
    parse_steps,
    redistribute,
    run_steps,
)
from autoshard.codegen.parallelize import parallel_info

__all__ = ["PREFETCH_ATTR", "Prefetcher", "layer_key", "prefetch_gathers"]

PREFETCH_ATTR = "_autoshard_prefetch"
_NUMBERED = re.compile(r"^\d+$")


def layer_key(fqn: str) -> str:
    """The layer a parameter is gathered with: its path up to the first numbered component."""
    parts = fqn.split(".")
    for i, part in enumerate(parts):
        if _NUMBERED.match(part):
            return ".".join(parts[: i + 1])
    return fqn


class _Gathered(torch.autograd.Function):
    """Forward: the already gathered weight.  Backward: the edge's planned backward steps (as redistribute)."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, held: list[torch.Tensor], comm: MeshComm, backward: str
    ) -> torch.Tensor:
        ctx.comm, ctx.steps, ctx.dtype = comm, parse_steps(backward), x.dtype
        return held.pop()  # not an input: autograd makes it this node's output

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        # a weight gathered in bf16 under amp (gather_dtype): its gradient reduced in the weight's dtype
        return run_steps(grad.to(ctx.dtype), ctx.steps, ctx.comm, "backward"), None, None, None


class Prefetcher(nn.Module):
    """Issues each layer's parameter all-gathers ``depth`` layers ahead (module doc)."""

    def __init__(self, comm: MeshComm, keys: list[tuple[str, str]], depth: int, record: bool = False) -> None:
        super().__init__()
        self.comm, self.depth = comm, depth
        self.layers: list[str] = []
        self.members: dict[str, list[str]] = defaultdict(list)  # layer -> parameter FQNs in graph order
        for fqn, layer in keys:
            if layer not in self.members:
                self.layers.append(layer)
            self.members[layer].append(fqn)
        self.index = {layer: i for i, layer in enumerate(self.layers)}
        self.layer_of = {fqn: layer for fqn, layer in keys}
        self.forward_steps: dict[str, str] = {}
        self.events: list[tuple[str, str, str]] | None = [] if record else None
        self.active = False  # inside the module's forward: prefetch; outside (recompute): synchronous
        self._pending: dict[tuple[str, str], Callable[[], torch.Tensor]] = {}  # (phase, fqn) -> wait
        self._held: dict[str, torch.Tensor] = {}  # re-gathered weights still to be unpacked
        self._packs: dict[str, int] = defaultdict(int)
        self._served: dict[str, int] = defaultdict(int)
        self._local: dict[str, torch.Tensor] = {}
        self._done: set[str] = set()  # gathered (and used) in this forward
        self._dtypes: dict[str, torch.dtype] = {}  # the dtype each parameter was last gathered in

    # -- forward -------------------------------------------------------------------------------------------
    def begin(self) -> None:
        """A new forward: drop what the last step left (every rank drops the same)."""
        for wait in self._pending.values():
            wait()
        self._pending.clear()
        self._held.clear()
        self._packs.clear()
        self._served.clear()
        self._done.clear()
        self.active = True

    def forward(self, x: torch.Tensor, comm: MeshComm, forward: str, backward: str, fqn: str) -> torch.Tensor:
        self._local[fqn] = x
        layer = self.layer_of[fqn]
        if self.active:
            self._issue_layer("forward", layer)
            for ahead in self.layers[self.index[layer] + 1 : self.index[layer] + 1 + self.depth]:
                self._issue_layer("forward", ahead)
        wait = self._pending.pop(("forward", fqn), None)
        if wait is None:  # a recomputed block, or a layer gathered again in one forward
            wait = self._issue(x, "forward", fqn)
        whole = wait()
        self._done.add(fqn)
        self._note("use", "forward", layer)
        if not (torch.is_grad_enabled() and x.requires_grad):
            return whole
        out: torch.Tensor = _Gathered.apply(x, [whole], comm, backward)
        from autoshard.runtime.reshard import remember_gathered

        if getattr(self, "reshard", False):
            remember_gathered(out, x, comm, forward, (self, fqn))
        return out

    # -- backward (re-gathers, with reshard after forward) ---------------------------------------------------
    def packed(self, fqn: str) -> None:
        self._packs[fqn] += 1

    def regather(self, fqn: str) -> torch.Tensor:
        """The whole weight again for a saved view of it, prefetching the layers backward visits next."""
        layer = self.layer_of[fqn]
        if fqn not in self._held:
            self._issue_layer("regather", layer)
            behind = self.layers[max(0, self.index[layer] - self.depth) : self.index[layer]]
            for earlier in reversed(behind):
                self._issue_layer("regather", earlier)
            self._held[fqn] = self._pending.pop(("regather", fqn))()
            self._note("use", "regather", layer)
        whole = self._held[fqn]
        self._served[fqn] += 1
        if self._served[fqn] >= self._packs[fqn]:
            del self._held[fqn]  # the last saved view of it: free the gathered weight
        return whole

    # -- issuing -----------------------------------------------------------------------------------------------
    def _issue_layer(self, phase: str, layer: str) -> None:
        fresh = False
        for fqn in self.members[layer]:
            if (phase, fqn) in self._pending or fqn not in self._local:
                continue
            if phase == "regather" and (fqn in self._held or self._served[fqn] >= self._packs[fqn]):
                continue
            if phase == "forward" and fqn in self._done:
                continue
            self._pending[(phase, fqn)] = self._issue(self._local[fqn], phase, fqn)
            fresh = True
        if fresh:
            self._note("issue", phase, layer)

    def _issue(self, x: torch.Tensor, phase: str, fqn: str) -> Callable[[], torch.Tensor]:
        (step,) = parse_steps(self.forward_steps[fqn])
        # under amp in autocast's dtype; a re-gather in the same one (backward runs without autocast)
        if phase == "forward":
            self._dtypes[fqn] = gather_dtype(x, self.comm) or x.dtype
        x = x.detach().to(self._dtypes.get(fqn, x.dtype))
        wait = issue_all_gather(x, step, self.comm, async_op=True)
        if self.comm.log is not None:
            from autoshard.codegen.collectives import CollectiveRecord

            nbytes = x.numel() * x.element_size() * self.comm.mesh_shape[step.mesh_axis]
            self.comm.log.append(CollectiveRecord(phase, "all_gather", step.mesh_axis, nbytes))
        return wait

    def _note(self, action: str, phase: str, layer: str) -> None:
        if self.events is not None:
            self.events.append((action, phase, layer))


def prefetch_gathers(
    module: fx.GraphModule, depth: int | None = None, *, record: bool = False
) -> Prefetcher | None:
    """Route the module's single-all-gather parameter edges through a :class:`Prefetcher` (module doc).

    ``depth`` defaults to ``plan.overlap.prefetch``; 0, or no gathered parameter, changes nothing (None).
    """
    from autoshard.runtime.reshard import gather_param

    info = parallel_info(module)
    depth = info.plan.overlap.prefetch if depth is None else depth
    params = {a.fqn for a in info.attrs if a.kind == "parameter"}
    edges = []
    for node in module.graph.nodes:
        if node.op != "get_attr" or node.target not in params or len(node.users) != 1:
            continue
        (user,) = node.users
        if user.target not in (redistribute, gather_param) or user.args[0] is not node:
            continue
        steps = parse_steps(str(user.args[2]))
        if len(steps) == 1 and steps[0].kind == "all_gather":
            edges.append((str(node.target), user))
    if depth < 1 or not edges:
        return None
    prefetcher = Prefetcher(info.comm, [(fqn, layer_key(fqn)) for fqn, _ in edges], depth, record)
    prefetcher.reshard = bool(getattr(module, "_autoshard_reshard", False)) or any(  # type: ignore[assignment]
        u.target is gather_param for _, u in edges
    )
    module.add_submodule(PREFETCH_ATTR, prefetcher)
    for fqn, user in edges:
        prefetcher.forward_steps[fqn] = str(user.args[2])
        user.op, user.target = "call_module", PREFETCH_ATTR
        user.args = (*user.args[:4], fqn) if len(user.args) >= 4 else (*user.args, "", fqn)
    module.recompile()
    module.register_forward_pre_hook(lambda *_: prefetcher.begin())
    module.register_forward_hook(lambda *_: setattr(prefetcher, "active", False), always_call=True)
    return prefetcher
