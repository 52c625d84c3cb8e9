"""Export a plan to plain PyTorch: DTensor parallel styles and ``fully_shard`` on the user's own module.

Input: the user's model (real weights, the same on every rank), a :class:`~autoshard.plans.Plan` and optionally
a ``DeviceMesh`` of ``plan.mesh_shape``.  Output: the same module, parallelised in place by torch's own APIs --
``parallelize_module`` with ``ColwiseParallel`` / ``RowwiseParallel`` on the tensor-parallel axis and
``fully_shard`` (FSDP2) over the data axis -- so the user keeps their training loop, optimizer and
``torch.compile``.  :func:`dtensor_styles` is the pure half: which style each module gets, or why the plan
cannot be expressed that way.

How a plan maps (per mesh axis):

- the *data* axis is the one the plan splits the batch over (``plan.input_placements``: ``S(0)``); the
  *tensor-parallel* axis is the other one (at most one of each: a plan over more axes is not expressible);
- on the TP axis, a ``Linear`` weight ``S(0)`` is ``ColwiseParallel``, ``S(1)`` ``RowwiseParallel``; an
  ``Embedding`` weight ``S(0)`` (vocabulary) is ``RowwiseParallel``, ``S(1)`` ``ColwiseParallel`` with its output
  gathered (the unsplit norm after it reads whole hidden states: a local ``Shard(-1)`` piece failed); a sharded
  LM head (a ``Linear`` that no later linear reads) returns replicated logits; anything else sharded on the TP
  axis (a norm weight, a bias-only module, a conv) is not expressible, and is named in the error;
- on the data axis, every parameter is sharded by ``fully_shard`` (one unit per repeated layer, then the
  root): the plan's ``R`` (data parallel) and ``S(0)`` (FSDP) both become FSDP2 -- the same arithmetic
  (gradients averaged over the data axis), FSDP2's memory and collectives; ``S(d>0)`` on the data axis is not
  expressible.

What the styles cannot express is refused, not approximated: sequence or context parallelism (activations
split over the sequence on the TP axis), a split batch on the TP axis, expert parallelism.  The error names the
module, the parameter and its placement.

Example (every rank)::

    model = export_to_dtensor(model, plan)              # Megatron TP x FSDP2 through torch's own APIs
    loss = model(local_ids, labels=local_ids).loss      # this data rank's batch; gradients averaged
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from autoshard.errors import AutoshardError
from autoshard.placement import Replicate, Shard, ShardingSpec
from autoshard.plans import Plan

__all__ = ["ExportError", "ExportPlan", "dtensor_styles", "export_to_dtensor"]


class ExportError(AutoshardError, ValueError):
    """The plan cannot be written with DTensor parallel styles and ``fully_shard``."""


@dataclass(frozen=True, slots=True)
class ExportPlan:
    """Which torch API each part of the model gets (:func:`dtensor_styles`)."""

    data_axis: int | None
    tp_axis: int | None
    styles: tuple[tuple[str, str], ...]  # (module path, "colwise" | "rowwise" | "colwise-replicated-output")
    shard_units: tuple[str, ...]  # module paths wrapped by fully_shard, innermost first (the root last: "")


def _axes(plan: Plan) -> tuple[int | None, int | None]:
    ndim = len(plan.mesh_shape)
    data = {
        a
        for placements in plan.input_placements.values()
        for a, p in enumerate(placements)
        if p == "S(0)" and plan.mesh_shape[a] > 1
    }
    if len(data) > 1:
        raise ExportError(
            f"the plan splits the batch over mesh axes {sorted(data)}: fully_shard takes one data axis here; "
            "re-plan with one data axis"
        )
    others = [a for a in range(ndim) if a not in data and plan.mesh_shape[a] > 1]
    if len(others) > 1:
        raise ExportError(
            f"the plan uses mesh axes {others} besides the data axis: one tensor-parallel axis at most"
        )
    return (next(iter(data)) if data else None), (others[0] if others else None)


def dtensor_styles(model: nn.Module, plan: Plan) -> ExportPlan:
    """The styles that express ``plan`` on ``model`` (module doc); :class:`ExportError` names what cannot."""
    data_axis, tp_axis = _axes(plan)
    styles: dict[str, str] = {}
    refused: list[str] = []
    linears = [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    for fqn, placements in plan.param_placements.items():
        spec = ShardingSpec.parse(tuple(placements))
        path, _, leaf = fqn.rpartition(".")
        owner = model.get_submodule(path)
        if data_axis is not None:
            p = spec.placements[data_axis]
            if isinstance(p, Shard) and p.dim != 0:
                refused.append(
                    f"{fqn} is {spec} (split dim {p.dim} over the data axis; fully_shard splits dim 0)"
                )
        if tp_axis is None:
            continue
        p = spec.placements[tp_axis]
        if isinstance(p, Replicate):
            continue
        if not isinstance(p, Shard) or leaf != "weight":
            refused.append(f"{fqn} ({type(owner).__name__}) is {spec} on the tensor-parallel axis {tp_axis}")
        elif isinstance(owner, nn.Linear):
            last = linears and linears[-1] == path
            styles[path] = ("colwise-replicated-output" if last else "colwise") if p.dim == 0 else "rowwise"
        elif isinstance(owner, nn.Embedding):
            styles[path] = "rowwise" if p.dim == 0 else "colwise-replicated-output"  # layers read it whole
        else:
            refused.append(f"{fqn} ({type(owner).__name__}) is {spec}: no DTensor style splits this module")
    for name, placements in plan.input_placements.items():
        if tp_axis is not None and placements[tp_axis] != "R":
            refused.append(
                f"input {name} is {placements} (split on the tensor-parallel axis: sequence parallel)"
            )
    if refused:
        raise ExportError("not expressible with DTensor styles + fully_shard: " + "; ".join(refused[:4]))
    return ExportPlan(
        data_axis,
        tp_axis,
        tuple(sorted(styles.items())),
        _shard_units(model) if data_axis is not None else (),
    )


def _shard_units(model: nn.Module) -> tuple[str, ...]:
    """Every element of the model's largest ``nn.ModuleList`` (its repeated layers), then the root."""
    lists = [(len(m), name) for name, m in model.named_modules() if isinstance(m, nn.ModuleList)]
    if not lists:
        return ("",)
    count, name = max(lists)
    return (*(f"{name}.{i}" for i in range(count)), "")


def _style(kind: str) -> Any:
    from torch.distributed.tensor import Replicate as TorchReplicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    if kind == "colwise-replicated-output":
        return ColwiseParallel(output_layouts=TorchReplicate())
    return ColwiseParallel() if kind == "colwise" else RowwiseParallel()


def export_to_dtensor(model: nn.Module, plan: Plan, mesh: Any = None) -> nn.Module:
    """Apply ``plan`` to ``model`` in place with ``parallelize_module`` and ``fully_shard`` (module doc).

    Args:
        mesh: a ``DeviceMesh`` of ``plan.mesh_shape``; default one over every rank (row-major).
    """
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    from autoshard.runtime.launch import default_device

    export = dtensor_styles(model, plan)
    if any(p.device.type == "meta" for p in model.parameters()):
        raise ExportError("export_to_dtensor needs real weights (FSDP2 cannot shard meta parameters on CPU)")
    if mesh is None:
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(default_device().type, tuple(plan.mesh_shape))
    if export.tp_axis is not None and export.styles:
        tp_mesh = mesh if mesh.ndim == 1 else _sub(mesh, export.tp_axis)
        parallelize_module(model, tp_mesh, {path: _style(kind) for path, kind in export.styles})
    if export.data_axis is not None:
        dp_mesh = mesh if mesh.ndim == 1 else _sub(mesh, export.data_axis)
        for path in export.shard_units:
            fully_shard(model.get_submodule(path) if path else model, mesh=dp_mesh)
    return model


def _sub(mesh: Any, axis: int) -> Any:
    """The 1-D mesh of one axis (named meshes by name; unnamed ones get names first)."""
    names = mesh.mesh_dim_names
    if names is None:
        from torch.distributed.device_mesh import DeviceMesh

        mesh = DeviceMesh(
            mesh.device_type, mesh.mesh, mesh_dim_names=tuple(f"axis{a}" for a in range(mesh.ndim))
        )
        names = mesh.mesh_dim_names
    return mesh[names[axis]]
