"""What a module :func:`autoshard.parallelize` emitted knows about itself, and what it gives back.

Input: an emitted ``fx.GraphModule`` (its ``autoshard`` attribute, a :class:`ParallelInfo`: the plan, the mesh,
every tensor's spec) or a :class:`~autoshard.plans.Plan`.  Output: this rank's pieces of the global inputs
(:func:`shard_inputs`), the global outputs from every rank's pieces (:func:`gather_outputs`), the whole weights
and gradients (:func:`full_state_dict`, :func:`full_grads`) and a whole state loaded into the pieces
(:func:`load_full_state_dict`).  The gathering functions are collectives: every rank calls them.
:mod:`autoshard.codegen.parallelize` makes the module; this is the rest of its life (run, check, checkpoint).

Example (on every rank)::

    module = autoshard.parallelize(model, plan, (x,))
    y = gather_outputs(module, module(*shard_inputs(plan, x)))
    model.load_state_dict(full_state_dict(module))
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import fx, nn

from autoshard.codegen.assign import PlanMismatchError
from autoshard.codegen.collectives import MeshComm
from autoshard.codegen.lower import AttrSpec, EdgeRecord, collective_counts
from autoshard.codegen.shard import gather_full, local_piece, spec_of
from autoshard.placement import ShardingSpec
from autoshard.plans import Plan

__all__ = [
    "INFO_ATTR",
    "ParallelInfo",
    "full_grads",
    "full_state_dict",
    "gather_outputs",
    "load_full_state_dict",
    "parallel_info",
    "rank_coord",
    "shard_inputs",
]


INFO_ATTR = "autoshard"
"""Attribute of an emitted module holding its :class:`ParallelInfo` (read it with :func:`parallel_info`)."""


@dataclass(frozen=True)
class ParallelInfo:
    """What an emitted module knows about itself (``module.autoshard``)."""

    plan: Plan
    comm: MeshComm
    attrs: tuple[AttrSpec, ...]
    inputs: tuple[tuple[str, ShardingSpec, tuple[int, ...]], ...]  # (name, spec, global shape)
    outputs: tuple[tuple[ShardingSpec, tuple[int, ...]], ...]
    edges: tuple[EdgeRecord, ...]
    stateful: frozenset[str] = frozenset()  # FQNs in a state dict: no constants, no non-persistent buffers
    mesh: Any = None  # the DeviceMesh the module runs on (checkpoints build DTensors over it)
    config: Any = None  # the model's Hugging Face config (``model.config``), written by export_safetensors

    def in_state(self, attr: AttrSpec) -> bool:
        return attr.fqn in self.stateful

    def collective_counts(self, phase: str | None = None) -> dict[str, int]:
        """Collectives per kind that one step of this module runs (``phase`` forward/backward, or both)."""
        return collective_counts(self.edges, phase)


def parallel_info(module: nn.Module) -> ParallelInfo:
    """``module.autoshard``: what an emitted module knows about itself."""
    info = getattr(module, INFO_ATTR, None)
    if not isinstance(info, ParallelInfo):
        raise PlanMismatchError(f"{type(module).__name__} was not made by autoshard.parallelize")
    return info


def rank_coord(mesh_shape: Sequence[int], rank: int | None = None) -> tuple[int, ...]:
    """The mesh coordinate of ``rank`` (default: this rank): row-major, last axis fastest."""
    r = dist.get_rank() if rank is None else rank
    coord = []
    for n in reversed(tuple(mesh_shape)):
        coord.append(r % n)
        r //= n
    return tuple(reversed(coord))


def shard_inputs(
    plan: Plan, *args: torch.Tensor, coord: Sequence[int] | None = None, **kwargs: torch.Tensor
) -> tuple[torch.Tensor, ...]:
    """This rank's pieces of the global inputs, in the order the emitted module takes them.

    Keyword inputs go by name, positional ones fill the remaining inputs in order.
    """
    where = tuple(coord) if coord is not None else rank_coord(plan.mesh_shape)
    positional = iter(args)
    pieces: list[torch.Tensor] = []
    for name, placements in plan.input_placements.items():
        value = kwargs[name] if name in kwargs else next(positional, None)
        if value is None:
            raise PlanMismatchError(
                f"shard_inputs: no value for input {name!r} (inputs: {list(plan.input_placements)})"
            )
        pieces.append(local_piece(value, spec_of(placements), plan.mesh_shape, where, plan.zigzag_axis))
    return tuple(pieces)


def gather_outputs(module: fx.GraphModule, outputs: torch.Tensor | Sequence[torch.Tensor]) -> Any:
    """The global outputs from every rank's local ones (a collective: every rank calls it, every rank gets
    them)."""
    info = parallel_info(module)
    many = not isinstance(outputs, torch.Tensor)
    values = [outputs] if isinstance(outputs, torch.Tensor) else list(outputs)
    full = [
        gather_full(v, spec, shape, info.comm) for v, (spec, shape) in zip(values, info.outputs, strict=True)
    ]
    return tuple(full) if many else full[0]


def full_state_dict(module: fx.GraphModule) -> dict[str, torch.Tensor]:
    """Every parameter and persistent buffer whole, as ``model.state_dict()`` names them (tied weights under
    each name), on every rank.

    A collective; loads into the original model with ``model.load_state_dict``.
    """
    info = parallel_info(module)
    state: dict[str, torch.Tensor] = {}
    for attr in info.attrs:
        if not info.in_state(attr):
            continue
        whole = gather_full(_attr_tensor(module, attr), attr.spec, attr.global_shape, info.comm)
        for name in (attr.fqn, *attr.aliases):
            state[name] = whole.cpu()
    return state


def full_grads(module: fx.GraphModule) -> dict[str, torch.Tensor | None]:
    """Every parameter's whole gradient (a collective); ``None`` where no gradient was computed anywhere."""
    info = parallel_info(module)
    grads: dict[str, torch.Tensor | None] = {}
    for attr in info.attrs:
        if attr.kind != "parameter":
            continue
        param = module.get_parameter(attr.fqn)
        local = param.grad if param.grad is not None else torch.zeros_like(param)
        present = torch.tensor([float(param.grad is not None)], device=param.device)
        dist.all_reduce(present)
        grads[attr.fqn] = (
            gather_full(local, attr.spec, attr.global_shape, info.comm).cpu() if present.item() else None
        )
    return grads


def load_full_state_dict(module: fx.GraphModule, state: Mapping[str, torch.Tensor]) -> None:
    """Copy this rank's piece of every whole tensor in ``state`` into the module (checkpoint load)."""
    info = parallel_info(module)
    missing = [a.fqn for a in info.attrs if info.in_state(a) and a.fqn not in state]
    if missing:
        raise PlanMismatchError(
            f"load_full_state_dict: the state lacks {missing[:5]}{' ...' * (len(missing) > 5)}"
        )
    with torch.no_grad():
        for attr in info.attrs:
            if not info.in_state(attr):
                continue
            target = _attr_tensor(module, attr)
            whole = state[attr.fqn]
            if tuple(whole.shape) != attr.global_shape:
                raise PlanMismatchError(
                    f"load_full_state_dict: {attr.fqn} has shape {tuple(whole.shape)}, expected {attr.global_shape}"
                )
            target.copy_(
                local_piece(whole, attr.spec, info.comm.mesh_shape, info.comm.coord, info.comm.zigzag_axis)
            )


def _attr_tensor(module: fx.GraphModule, attr: AttrSpec) -> torch.Tensor:
    return module.get_parameter(attr.fqn) if attr.kind == "parameter" else module.get_buffer(attr.fqn)
