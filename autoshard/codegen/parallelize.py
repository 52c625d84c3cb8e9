"""``autoshard.parallelize``: a plan and the model's real weights -> the module this rank runs.

Input: the model (real weights, on the CPU, the same on every rank), its :class:`~autoshard.plans.Plan`, and
the *global* example inputs the plan was made with (shapes and dtypes are baked into the graph), called on
every rank of an initialised default process group whose size is ``plan.num_devices``.
Output: an ``fx.GraphModule`` whose

- ``forward`` takes this rank's *local* inputs (``plan.input_placements``; :func:`shard_inputs` cuts them)
  and returns its local outputs (``plan.output_placements``: a tensor, or a tuple when the model returns
  several; :func:`gather_outputs` reassembles them);
- parameters and buffers are this rank's shards, under the model's own names (tied weights once), so any
  ``torch.optim`` optimizer steps them; after ``backward`` each holds the gradient of its shard, replicated
  parameters synchronised as the plan says (the backward steps of their edges);
- ``code`` shows every collective (``redistribute(x, comm, "<forward steps>", "<backward steps>")``);
- ``autoshard`` attribute (:class:`ParallelInfo`) keeps the plan, the mesh and what each tensor's spec is,
  for :func:`full_state_dict` / :func:`load_full_state_dict` (checkpoints) and :func:`full_grads` (these
  live in :mod:`autoshard.codegen.emitted`, re-exported here).

Steps: capture with every layer (``blocks="full"``), read the plan's decision for every node
(:func:`~autoshard.codegen.assign.assign_strategies`), lower the graph for this rank's coordinate
(:func:`~autoshard.codegen.lower.lower_graph`) with the cluster the plan was priced on, make dropout draw the
single-device masks (:mod:`autoshard.runtime.rng`), cut each weight's piece -- from the model's own tensors,
or, for a model on ``meta``, from a ``weights`` source (:mod:`autoshard.runtime.materialize`: only this
rank's shards are ever allocated).

Example (on every rank, e.g. under ``torchrun``)::

    init_from_env()
    module = autoshard.parallelize(model, plan, (ids,))
    out = module(*shard_inputs(plan, ids))
    out.sum().backward(); optimizer.step()
"""

from __future__ import annotations

import dataclasses
import warnings
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import fx, nn

from autoshard.capture import Captured, capture
from autoshard.capture.experts import plan_fuses_experts
from autoshard.cluster import Cluster
from autoshard.codegen.assign import PlanMismatchError, PlanMismatchWarning, assign_strategies
from autoshard.codegen.collectives import MeshComm
from autoshard.codegen.emitted import (
    INFO_ATTR,
    ParallelInfo,
    full_grads,
    full_state_dict,
    gather_outputs,
    load_full_state_dict,
    parallel_info,
    rank_coord,
    shard_inputs,
)
from autoshard.codegen.lower import COMM_ATTR, AttrSpec, EdgeRecord, lower_graph
from autoshard.codegen.recompute import checkpoint_blocks
from autoshard.codegen.shard import contiguous_only, local_piece
from autoshard.errors import MeshError, ProfileError
from autoshard.plans import Plan
from autoshard.problem.costs import CostOptions
from autoshard.problem.elementwise import recipe

__all__ = [
    "INFO_ATTR",
    "ParallelInfo",
    "WeightSource",
    "full_grads",
    "full_state_dict",
    "gather_outputs",
    "load_full_state_dict",
    "parallel_info",
    "parallelize",
    "plan_cluster",
    "rank_coord",
    "shard_inputs",
]


class WeightSource(Protocol):
    """Where a model planned on ``meta`` gets this rank's pieces (:mod:`autoshard.runtime.materialize`)."""

    def local(self, attr: AttrSpec, mesh_shape: Sequence[int], coord: Sequence[int]) -> torch.Tensor:
        """The piece of ``attr``'s global tensor that device ``coord`` holds, on the CPU."""
        ...


def parallelize(
    model: nn.Module,
    plan: Plan,
    example_args: tuple[Any, ...] | Any = (),
    example_kwargs: Mapping[str, Any] | None = None,
    *,
    mesh: Any = None,
    cluster: Cluster | None = None,
    captured: Captured | None = None,
    device: torch.device | str | None = None,
    record: bool = False,
    weights: WeightSource | None = None,
) -> fx.GraphModule:
    """This rank's module under ``plan`` (module doc).

    Args:
        mesh: a ``DeviceMesh`` of ``plan.mesh_shape``; default one over every rank, row-major.
        cluster: the cluster the plan was priced on; default rebuilt from ``plan.cluster``.
        captured: a capture of ``model`` with every layer (``capture(..., blocks="full")``) to reuse.
        device: where this rank computes; default ``cuda`` under NCCL, else ``cpu``.
        record: log every collective (``module.autoshard.comm.log``) to compare ranks.
        weights: where each piece comes from for a model on ``meta`` (shard-only materialisation:
            :class:`~autoshard.runtime.materialize.InitWeights` or ``SafetensorsWeights``); default the
            model's own tensors, sliced.

    Raises:
        MeshError: no process group, or one of the wrong size.  PlanMismatchError: the model is not the one
        planned.  UnsupportedOpError: a graph codegen cannot lower.
    """
    mesh = mesh if mesh is not None else _mesh(plan)
    comm = MeshComm.from_device_mesh(mesh, record=record)
    comm.zigzag_axis = plan.zigzag_axis  # context parallelism's load-balanced sequence layout
    if comm.mesh_shape != tuple(plan.mesh_shape):
        raise MeshError(f"mesh {comm.mesh_shape} does not match the plan's mesh {plan.mesh_shape}")
    args = example_args if isinstance(example_args, tuple) else (example_args,)
    if captured is None and not args and not example_kwargs and plan.input_placements:
        raise PlanMismatchError(
            f"parallelize needs the global example inputs the plan was made with ({', '.join(plan.input_placements)}"
            "): shapes are baked into the graph; call parallelize(model, plan, example_args, example_kwargs)"
        )
    if captured is None:
        fuse = plan_fuses_experts(plan.nodes)  # the graph the plan was made on
        captured = capture(model, args, dict(example_kwargs or {}), blocks="full", fuse_experts=fuse)
    strategies = assign_strategies(captured, plan)
    where = torch.device(device) if device is not None else _default_device()
    cluster, zigzag = cluster or plan_cluster(plan), plan.zigzag_axis
    opts = CostOptions(training=plan.training, precision=recipe(plan.precision))  # amp: bytes as priced
    comm.low_gathers = opts.precision is not None and opts.precision.gather_dtype is not None  # amp: bf16
    lowered = lower_graph(
        captured, strategies, cluster, comm.coord, training=plan.training, device=where, zigzag_axis=zigzag,
        opts=opts,
    )  # fmt: skip
    _reproducible_randomness(lowered.graph, strategies, comm)
    root: dict[str, Any] = {COMM_ATTR: comm}
    for attr in lowered.attrs:
        root[attr.fqn] = _local_tensor(model, captured, attr, comm, where, weights)
    module = fx.GraphModule(root, lowered.graph, class_name=f"Parallel{plan.model}")
    rerun = checkpoint_blocks(module, plan.recompute, plan.recompute_blocks)  # Plan.recompute: blocks re-run
    _check_collectives((*lowered.edges, *rerun), plan)
    stateful = frozenset(a.fqn for a in lowered.attrs if _in_state_dict(model, a))
    info = ParallelInfo(
        plan, comm, lowered.attrs, lowered.input_specs, lowered.output_specs, lowered.edges, stateful, mesh,
        _hf_config(model),
    )  # fmt: skip
    setattr(module, INFO_ATTR, info)
    return module


def _hf_config(model: nn.Module) -> Any:
    """The model's Hugging Face config (what ``from_pretrained`` needs beside the weights), or None."""
    config = getattr(model, "config", None)
    return config if callable(getattr(config, "save_pretrained", None)) else None


def _check_collectives(edges: Sequence[EdgeRecord], plan: Plan) -> None:
    """Warn when the emitted collectives are not the plan's (a graph that differs from the planned one in its
    edges only, e.g. two inputs that were one aliased tensor when planning): results stay right, the plan's
    time and memory figures do not describe this run."""
    emitted = Counter((p, str(s.kind), s.mesh_axis, s.nbytes) for e in edges for p, s in e.collectives())
    # backward re-gathers run once reshard_after_forward rewires the module (autoshard.runtime.reshard)
    planned = Counter(
        (c.phase, c.kind, c.mesh_axis, c.nbytes) for c in plan.collectives if c.phase != "regather"
    )
    if emitted != planned:
        extra, missing = emitted - planned, planned - emitted
        warnings.warn(
            f"the emitted collectives differ from the plan's (emitted but not planned: {dict(extra)}; planned "
            f"but not emitted: {dict(missing)}): the captured graph differs from the planned one; re-plan with "
            "the same example inputs (distinct tensors, same shapes)",
            PlanMismatchWarning,
            stacklevel=3,
        )


def _mesh(plan: Plan) -> Any:
    from autoshard.runtime.launch import device_mesh

    if not dist.is_initialized():
        raise MeshError(
            "parallelize needs an initialised default process group: call it on every rank after "
            "torch.distributed.init_process_group (or autoshard.runtime.init_from_env under torchrun)"
        )
    if dist.get_world_size() != plan.num_devices:
        raise MeshError(
            f"the plan is for {plan.num_devices} devices (mesh {plan.mesh_shape}), the process group has "
            f"{dist.get_world_size()} ranks: launch {plan.num_devices} ranks or re-plan for this many"
        )
    return device_mesh(plan.mesh_shape)


def _reproducible_randomness(graph: fx.Graph, strategies: Mapping[str, Any], comm: MeshComm) -> None:
    """Dropout draws the single-device model's masks (:mod:`autoshard.runtime.rng`)."""
    from autoshard.runtime.rng import reproducible_randomness

    reproducible_randomness(graph, strategies, comm.mesh_shape, comm.coord, comm.zigzag_axis)


def _default_device() -> torch.device:
    from autoshard.runtime.launch import default_device

    return default_device()


def _local_tensor(
    model: nn.Module,
    captured: Captured,
    attr: AttrSpec,
    comm: MeshComm,
    device: torch.device,
    weights: WeightSource | None = None,
) -> torch.Tensor:
    requires_grad = attr.kind == "parameter" and model.get_parameter(attr.fqn).requires_grad
    if weights is not None:
        contiguous_only(attr.fqn, attr.spec, comm.zigzag_axis)  # weight sources cut contiguous pieces
        piece = weights.local(attr, comm.mesh_shape, comm.coord).to(device)
        want = spec_of_local(attr, comm)
        if tuple(piece.shape) != want:
            raise PlanMismatchError(
                f"{attr.kind} {attr.fqn}: the weight source gave a piece of shape {tuple(piece.shape)}, this "
                f"rank holds {want} under {attr.spec}"
            )
        return nn.Parameter(piece, requires_grad=requires_grad) if attr.kind == "parameter" else piece
    if attr.kind == "parameter":
        whole: torch.Tensor = model.get_parameter(attr.fqn)
    elif attr.kind == "buffer":
        whole = model.get_buffer(attr.fqn)
    else:
        whole = captured.constants[attr.fqn]
    if whole.device.type == "meta":
        raise PlanMismatchError(
            f"{attr.kind} {attr.fqn} is on the meta device: pass parallelize(..., weights=InitWeights(model) or "
            "SafetensorsWeights(directory, model)) from autoshard.runtime.materialize, or build the model on the CPU"
        )
    piece = local_piece(whole, attr.spec, comm.mesh_shape, comm.coord, comm.zigzag_axis).to(device)
    if attr.kind == "parameter":
        return nn.Parameter(piece, requires_grad=whole.requires_grad)
    return piece


def spec_of_local(attr: AttrSpec, comm: MeshComm) -> tuple[int, ...]:
    """The shape of this rank's piece of ``attr``."""
    return tuple(attr.spec.local_shape(attr.global_shape, comm.mesh_shape))


def _in_state_dict(model: nn.Module, attr: AttrSpec) -> bool:
    if attr.kind == "parameter":
        return True
    if attr.kind != "buffer":
        return False
    path, _, name = attr.fqn.rpartition(".")
    return name not in model.get_submodule(path)._non_persistent_buffers_set


def plan_cluster(plan: Plan) -> Cluster:
    """The cluster ``plan`` was priced on, rebuilt from ``plan.cluster`` (profile name, nodes, mesh).

    A plan for fewer devices than one node of its profile holds (2 gloo ranks on the 4-device ``cpu``
    profile) was priced on a node of that many devices: rebuilt the same way.
    """
    from autoshard.cluster import load_cluster
    from cost_models.profile import load_profile

    info = plan.cluster
    try:
        profile = load_profile(str(info["profile"]))
    except (KeyError, ProfileError) as e:
        raise PlanMismatchError(
            f"cannot rebuild the cluster of the plan from {info.get('profile')!r} ({e}); pass "
            "parallelize(..., cluster=the cluster you planned with)"
        ) from e
    nodes, devices = int(info.get("nodes", 1)), int(info.get("devices", plan.num_devices))
    if profile.devices_per_node * nodes != devices:
        profile = dataclasses.replace(profile, devices_per_node=devices // nodes)
    return load_cluster(profile, nodes=nodes, mesh=plan.mesh_shape, axis_names=info.get("axis_names"))
