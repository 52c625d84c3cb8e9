"""``autoshard.verify``: run a plan on N gloo ranks and compare it with the model on one device.

Input: a model with real weights (or a zoo name / ``path/to/file.py:function`` spec), its global example
inputs, a plan (or a cluster to plan on; default the ``cpu`` profile with a one-axis mesh over ``nproc``).
Output: a :class:`VerifyReport` -- the largest difference of every output and every parameter gradient
against the single-device model, whether every rank issued the same collectives in the same order, and
whether the emitted collectives are the plan's (per kind, forward and backward).  Context parallelism's K/V
hops are counted per rank and step against ``Plan.ring_transfers`` (:mod:`autoshard.runtime.ring_check`): a
difference raises :class:`~autoshard.errors.VerifyError`.  ``report.ok`` says whether
all of it holds; ``str(report)`` prints the worst differences.

How: inputs are drawn at random (floats normal; integer ids below the smallest embedding table, else kept),
and so is the gradient of every output.  The parent runs forward and backward once without autoshard, then
forks ``nproc`` ranks (:func:`~autoshard.runtime.launch.launch`): each builds its module with
:func:`~autoshard.parallelize`, runs its pieces of the same inputs and output gradients, and the ranks gather
outputs and gradients back whole.  Every rank sees identical weights and inputs (forked from the parent).

The verdict (tolerances, :class:`VerifyReport`) is :mod:`autoshard.runtime.verdict`'s.

CLI: ``autoshard verify`` (:mod:`autoshard.cli.verify`) calls :func:`run_verify`.

Example::

    report = run_verify("llama-tiny", nproc=4, mesh=(2, 2))
    print(report)            # "verify llama-tiny on mesh (2, 2): OK ..." and the largest differences
    assert report.ok
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from autoshard.capture import Captured, capture, graph_inputs
from autoshard.capture.experts import plan_fuses_experts
from autoshard.capture.meta import META_KIND
from autoshard.cluster import Cluster, load_cluster
from autoshard.codegen.parallelize import full_grads, gather_outputs, parallel_info, parallelize
from autoshard.codegen.shard import local_piece
from autoshard.errors import AutoshardError, MeshError
from autoshard.plans import Plan
from autoshard.runtime.launch import launch
from autoshard.runtime.ring_check import check_ring_hops
from autoshard.runtime.verdict import Difference, VerifyReport, report_of
from autoshard.runtime.verify_routes import ReferenceRoute, RoutePins, pin_routes, record_routes, route_note
from autoshard.runtime.verify_scope import also_ran, exercised, not_run, plan_line, replicated_warnings
from autoshard.strategies import OpStrategy

__all__ = ["Difference", "VerifyReport", "cluster_for", "main", "run_verify", "verify"]


@dataclass(frozen=True)
class _Job:
    """Everything a rank needs; inherited through fork, never pickled."""

    model: nn.Module
    plan: Plan
    cluster: Cluster
    captured: Captured
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    user_inputs: tuple[torch.Tensor, ...]  # the graph's user inputs, in placeholder order
    out_grads: tuple[torch.Tensor, ...]
    fault: str | None = None  # a collective kind to break on purpose (tests of the verdict)
    rng_seed: int = 0  # the global RNG state every forward starts from (dropout draws the same masks)
    routes: tuple[ReferenceRoute, ...] = ()  # the reference's top-k choices, pinned on every rank


def verify(
    model: nn.Module,
    example_args: tuple[Any, ...] | Any = (),
    example_kwargs: Mapping[str, Any] | None = None,
    *,
    plan: Plan | None = None,
    cluster: Cluster | None = None,
    nproc: int | None = None,
    annotations: Mapping[str, Any] | None = None,
    name: str | None = None,
    captured: Captured | None = None,
    seed: int = 0,
    timeout: float = 300.0,
    fault: str | None = None,
    allow_replicated: bool = False,
) -> VerifyReport:
    """Check a plan numerically on ``plan.num_devices`` gloo ranks (module doc).

    Without ``plan``, plans on ``cluster`` (default :func:`cluster_for` ``("cpu", nproc)``) with
    ``annotations``.  ``captured``: a ``blocks="full"`` capture of ``model`` with inputs of these shapes, to
    reuse.  ``fault``: a collective kind ("all_reduce", ...) every rank skips while still logging it, to
    show that a broken collective is caught.  ``allow_replicated``: accept a check in which nothing distributed
    ran (otherwise ``report.ok`` is ``False``).  Raises :class:`AutoshardError` when the model cannot be
    planned or lowered; a wrong result is not an exception but ``report.ok == False``.
    """
    import autoshard

    start = time.perf_counter()
    args = example_args if isinstance(example_args, tuple) else (example_args,)
    args, kwargs = _random_inputs(model, args, dict(example_kwargs or {}), seed)
    if plan is None:
        cluster = cluster or cluster_for("cpu", nproc or 4)
        plan = autoshard.plan(model, cluster, args, kwargs, annotations=annotations)
    elif cluster is None:
        from autoshard.codegen.parallelize import plan_cluster

        cluster = plan_cluster(plan)
    captured = captured or capture(
        model, args, kwargs, blocks="full", fuse_experts=plan_fuses_experts(plan.nodes)
    )
    strategies = _refuse_unreproduced(captured, plan, name or type(model).__name__)
    (reference, ref_grads, out_grads), routes, unpinned = _reference(
        model, args, kwargs, seed, captured, strategies
    )
    values = graph_inputs(captured, model, args, kwargs)
    user = tuple(
        v for n, v in zip(captured.placeholders(), values, strict=True) if n.meta[META_KIND] == "user_input"
    )
    job = _Job(model, plan, cluster, captured, args, kwargs, user, out_grads, fault, seed + 2, routes)
    results = launch(_rank_work, plan.num_devices, job, timeout=timeout)
    ring = check_ring_hops(plan, [r[3] for r in results])  # the K/V hops each rank sent, or VerifyError
    floor = _least_precise(captured)
    ran = [r[:3] for r in results]  # outputs, gradients, collectives
    report = report_of(name or type(model).__name__, model, plan, (reference, ref_grads), ran, start, floor)
    pins = route_note(routes, [r[4] for r in results]) or unpinned  # top-k choices that would have flipped
    return dataclasses.replace(  # what ran, and what of the plan did not (runtime/verify_scope.py)
        report, allow_replicated=allow_replicated, ring_hops=ring, routes=pins, plan_line=plan_line(plan),
        warnings=replicated_warnings(plan), not_run=not_run(plan, plan, report.dtype), exercised=exercised(plan),
        also_ran=also_ran(plan),
    )  # fmt: skip


def _refuse_unreproduced(captured: Captured, plan: Plan, name: str) -> dict[str, OpStrategy]:
    """A random op the plan splits, other than dropout, cannot draw the single-device values: say so, not a
    MISMATCH (:func:`~autoshard.runtime.rng.unreproduced`).  Returns the plan's strategy of every node."""
    from autoshard.codegen.assign import assign_strategies
    from autoshard.runtime.rng import unreproduced

    strategies = assign_strategies(captured, plan)
    odd = unreproduced(captured.graph_module.graph, strategies)
    if odd:
        raise AutoshardError(
            f"verify cannot compare {name}'s training step exactly: {', '.join(odd)} draws random numbers and the "
            "plan splits it, so each rank draws its own piece (only dropout and attention dropout draw the "
            "single-device values); verify in eval mode (model.eval()) or with that randomness off"
        )
    return strategies


def _least_precise(captured: Captured) -> torch.dtype | None:
    """The least precise floating dtype the graph computes in: a float64 model with a float32 island (HF's
    RMSNorm upcasts to float32) is exact only to float32, since reassociated sums (one all-reduce of summed
    gradients instead of one per consumer) round differently there."""
    dtypes = {
        v.dtype
        for n in captured.graph_module.graph.nodes
        if isinstance(v := n.meta.get("val"), torch.Tensor) and v.is_floating_point()
    }
    return max(dtypes, key=lambda d: torch.finfo(d).eps) if dtypes else None


def _random_inputs(
    model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], seed: int
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Same shapes and dtypes, random values: floats normal, integers below the smallest embedding table."""
    gen = torch.Generator().manual_seed(seed)
    tables = [m.num_embeddings for m in model.modules() if isinstance(m, nn.Embedding)]
    high = min(tables) if tables else None

    def draw(v: Any) -> Any:
        if not isinstance(v, torch.Tensor):
            return v
        if v.is_floating_point():
            return torch.randn(v.shape, generator=gen, dtype=v.dtype)
        if v.dtype in (torch.int32, torch.int64) and high is not None:
            return torch.randint(0, high, v.shape, generator=gen, dtype=v.dtype)
        return v

    return tuple(draw(a) for a in args), {k: draw(v) for k, v in kwargs.items()}


def _reference(
    model: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    seed: int,
    captured: Captured,
    strategies: Mapping[str, OpStrategy],
) -> tuple[
    tuple[list[torch.Tensor], dict[str, torch.Tensor], tuple[torch.Tensor, ...]],
    tuple[ReferenceRoute, ...],
    RoutePins | None,
]:
    """Outputs, parameter gradients and the random output gradients of one step on one device, and the
    top-k (routing) choices its forward made (:func:`~autoshard.runtime.verify_routes.record_routes`)."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed + 2)  # the ranks start from the same state: dropout masks equal in training mode
    result, routes, unpinned = record_routes(captured, strategies, lambda: model(*args, **kwargs))
    outs = [t for t in pytree.tree_leaves(result) if isinstance(t, torch.Tensor)]
    gen = torch.Generator().manual_seed(seed + 1)
    out_grads = tuple(torch.randn(o.shape, generator=gen, dtype=o.dtype) for o in outs)
    live = [(o, g) for o, g in zip(outs, out_grads, strict=True) if o.requires_grad]
    if live:
        torch.autograd.backward([o for o, _ in live], [g for _, g in live])
    grads = {k: p.grad.detach().clone() for k, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return ([o.detach() for o in outs], grads, out_grads), routes, unpinned


def _break(kind: str) -> None:
    """In this (forked) rank only: ``kind`` collectives are logged but move nothing (the test hook)."""
    from autoshard.codegen import collectives

    collectives._RUNNERS[kind] = lambda x, step, comm: (x.clone(), x.numel() * x.element_size())  # type: ignore[index]


def _rank_work(job: _Job) -> tuple[Any, Any, list[Any], list[Any], dict[str, set[int]]]:
    if job.fault is not None:
        _break(job.fault)
    module = parallelize(
        job.model, job.plan, job.args, job.kwargs, captured=job.captured, cluster=job.cluster, record=True
    )
    if any(c.phase == "regather" for c in job.plan.collectives):  # FSDP frees gathered weights, as priced
        from autoshard.runtime.reshard import reshard_after_forward

        reshard_after_forward(module)
    info = parallel_info(module)
    mesh, coord = info.comm.mesh_shape, info.comm.coord
    flipped = pin_routes(module, job.routes, mesh, coord, info.comm.zigzag_axis)  # the reference's routing
    local = [
        local_piece(v, spec, mesh, coord, info.comm.zigzag_axis)
        for v, (_, spec, _) in zip(job.user_inputs, info.inputs, strict=True)
    ]
    torch.manual_seed(job.rng_seed)  # as the reference forward did
    result = module(*local)
    outs = [result] if isinstance(result, torch.Tensor) else list(result)
    if len(outs) != len(job.out_grads):
        raise AutoshardError(
            f"the emitted module returns {len(outs)} tensors, the model {len(job.out_grads)}: outputs that are not "
            "tensors, or nested outputs, are not compared yet"
        )
    pairs = [
        (o, local_piece(g, spec, mesh, coord, info.comm.zigzag_axis))
        for o, g, (spec, _) in zip(outs, job.out_grads, info.outputs, strict=True)
        if o.requires_grad
    ]
    if pairs:
        torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
    log, hops = list(info.comm.log or []), list(info.comm.hops or [])
    gathered = gather_outputs(module, tuple(o.detach() for o in outs))
    grads = full_grads(module)
    if coord != (0,) * len(coord):
        return None, None, log, hops, flipped
    return list(gathered), grads, log, hops, flipped


# -- the CLI ------------------------------------------------------------------------------------------------------
def cluster_for(profile: str, nproc: int, mesh: Sequence[int] | None = None) -> Cluster:
    """A cluster of ``nproc`` devices of ``profile``: whole nodes when ``nproc`` is a multiple of the profile's
    devices per node, else one node of ``nproc`` devices (2 gloo ranks on the 4-device ``cpu`` profile)."""
    from cost_models.profile import load_profile

    record = load_profile(profile)
    per_node = record.devices_per_node
    if nproc % per_node == 0:
        return load_cluster(record, nodes=nproc // per_node, mesh=mesh)
    if nproc < per_node:
        return load_cluster(dataclasses.replace(record, devices_per_node=nproc), mesh=mesh)
    raise MeshError(
        f"--nproc {nproc} is neither below nor a multiple of {per_node}, the devices per node of {profile}"
    )


def run_verify(
    spec: str | None,
    nproc: int | None = None,
    mesh: Sequence[int] | None = None,
    profile: str = "cpu",
    *,
    plan: Plan | str | None = None,
    nodes: int | None = None,
    annotations: Mapping[str, Any] | None = None,
    float64: bool = False,
    allow_replicated: bool = False,
    seed: int = 0,
    fault: str | None = None,
) -> VerifyReport:
    """``autoshard verify``: ``plan`` (or its file) goes to :func:`~autoshard.runtime.mapping.verify_plan`;
    else ``spec`` is planned at real size (``nodes`` whole nodes of ``profile``, else ``nproc`` devices) and that
    plan verified, mapped onto a scaled-down copy past 8 devices or for a model built on meta."""
    from autoshard import zoo
    from autoshard.plans import load_plan
    from autoshard.report.figures import recipe_note
    from autoshard.runtime.mapping import verify_plan

    flags: dict[str, Any] = {"allow_replicated": allow_replicated, "seed": seed, "fault": fault}
    if plan is not None:
        loaded = plan if isinstance(plan, Plan) else load_plan(plan)
        runs = "the model in its own dtype (float64 with --float64) without autocast"
        print(recipe_note(loaded, "verify", runs), end="")  # an amp plan: its splits checked, not its recipe
        return verify_plan(loaded, spec, float64=float64, **flags)
    if spec is None:
        raise AutoshardError("verify needs a plan or a model: --plan PLAN.json or --model SPEC")
    case = zoo.load_spec(spec)
    if nodes is not None:
        cluster = load_cluster(profile, nodes=nodes, mesh=mesh)
    else:
        cluster = cluster_for(profile, nproc or (math.prod(mesh) if mesh else 4), mesh)
    if cluster.num_devices > 8 or any(p.device.type == "meta" for p in case.model.parameters()):
        import autoshard

        deployed = autoshard.plan(case.model, cluster, case.args, case.kwargs, annotations=annotations)
        return verify_plan(
            dataclasses.replace(deployed, source={"spec": spec}), spec, float64=float64, **flags
        )
    model, args, kwargs = case.model, case.args, dict(case.kwargs)
    if float64:
        from autoshard.runtime.scaled import refuse_float64_experts

        refuse_float64_experts(spec, model)
        model = model.to(torch.float64)
        args = tuple(a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)
    return verify(model, args, kwargs, cluster=cluster, annotations=annotations, name=spec, **flags)


def main(argv: Sequence[str] | None = None) -> int:
    """``autoshard verify ARGV``: the command line of :mod:`autoshard.cli.verify`."""
    from autoshard.cli import main as cli_main

    return cli_main(["verify", *(sys.argv[1:] if argv is None else argv)])
