"""``autoshard.verify``: run a plan on N gloo ranks and compare it with the model on one device.

Input: a model with real weights (or a zoo name / ``path/to/file.py:function`` spec), its global example
inputs, a plan (or a cluster to plan on; default the ``cpu`` profile with a one-axis mesh over ``nproc``).
Output: a :class:`VerifyReport` -- the largest difference of every output and every parameter gradient
against the single-device model, whether every rank issued the same collectives in the same order, and
whether the emitted collectives are the plan's (per kind, forward and backward).  ``report.ok`` says whether
all of it holds; ``str(report)`` prints the worst differences.

How: inputs are drawn at random (floats normal; integer ids below the smallest embedding table, else kept),
and so is the gradient of every output.  The parent runs forward and backward once without autoshard, then
forks ``nproc`` ranks (:func:`~autoshard.runtime.launch.launch`): each builds its module with
:func:`~autoshard.parallelize`, runs its pieces of the same inputs and output gradients, and the ranks gather
outputs and gradients back whole.  Every rank sees identical weights and inputs (forked from the parent).

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
from collections import Counter
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

__all__ = ["Difference", "VerifyReport", "cluster_for", "main", "run_verify", "verify"]

_TOLERANCE = {torch.float64: (1e-9, 1e-12), torch.float32: (2e-4, 1e-6)}  # (rtol, atol)
_LOW_PRECISION = (2e-2, 1e-3)


@dataclass(frozen=True, slots=True)
class Difference:
    """How far one tensor of the distributed run is from the single-device one."""

    name: str
    max_abs: float  # max |distributed - reference|
    scale: float  # max |reference|
    tolerance: float  # atol + rtol * scale

    @property
    def ok(self) -> bool:
        return self.max_abs <= self.tolerance

    def __str__(self) -> str:
        mark = "ok  " if self.ok else "FAIL"
        tol = f"tolerance {self.tolerance:.1e}, |ref| {self.scale:.2e}"
        return f"{mark} {self.name:<48} max |diff| {self.max_abs:.3e} ({tol})"


@dataclass(frozen=True)
class VerifyReport:
    """The verdict of :func:`verify` (module doc)."""

    model: str
    mesh_shape: tuple[int, ...]
    dtype: str
    outputs: tuple[Difference, ...]
    grads: tuple[Difference, ...]
    ranks_agree: bool  # every rank issued the same collectives (kind, axis, bytes) in the same order
    emitted: dict[str, int]  # collectives per step by "phase kind", as the ranks ran them
    planned: dict[str, int]  # the same, as the plan lists them
    seconds: float
    split: bool = False  # the plan splits some input or parameter over some axis
    exercised: tuple[str, ...] = ()  # mapped decisions that shard something ("module op: strategy")
    unmapped: tuple[str, ...] = ()  # decisions of the deployed plan that could not be carried over
    source: str = ""  # what plan this checks, e.g. "plan for llama3-70b on mesh (128, 8), mapped"
    allow_replicated: bool = False  # the user accepts a check in which nothing distributed ran

    @property
    def distributed(self) -> bool:
        """Whether anything distributed was checked: some collective ran or something was split."""
        return self.split or sum(self.emitted.values()) > 0

    @property
    def ok(self) -> bool:
        same = self.emitted == self.planned
        numbers = same and self.ranks_agree and all(d.ok for d in (*self.outputs, *self.grads))
        return numbers and (self.distributed or self.allow_replicated)

    @property
    def verdict(self) -> str:
        if not self.distributed and not self.allow_replicated:
            return "NOTHING DISTRIBUTED CHECKED"
        return "OK" if self.ok else "MISMATCH"

    def worst(self, k: int = 5) -> list[Difference]:
        """The ``k`` tensors furthest from the reference, relative to their tolerance."""
        every = [*self.outputs, *self.grads]
        return sorted(
            every, key=lambda d: d.max_abs / d.tolerance if d.tolerance else math.inf, reverse=True
        )[:k]

    def __str__(self) -> str:
        head = (
            f"verify {self.model} on mesh {self.mesh_shape} ({self.dtype}): {self.verdict} "
            f"in {self.seconds:.1f} s; {len(self.outputs)} outputs, {len(self.grads)} gradients compared"
        )
        lines = [head] + ([f"checks the {self.source}"] if self.source else [])
        lines += ["largest differences:", *(f"  {d}" for d in self.worst())]
        lines.append(f"collectives per step: {_counts(self.emitted)} (plan: {_counts(self.planned)})")
        if not self.ranks_agree:
            lines.append("FAIL ranks issued different collective sequences (see module.autoshard.comm.log)")
        if not self.distributed:
            lines.append(
                "no collective ran and nothing was split: this checks nothing distributed"
                + (
                    ""
                    if self.allow_replicated
                    else "; verify a plan that shards (--plan) or pass --allow-replicated"
                )
            )
        if self.source:
            lines.append(f"strategies exercised that split or reduce ({len(self.exercised)}):")
            lines += [f"  {e}" for e in self.exercised] or ["  none"]
            lines.append(f"not mapped ({len(self.unmapped)}):")
            lines += [f"  {u}" for u in self.unmapped] or ["  none"]
        return "\n".join(lines)


def _counts(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{k} x{v}" for k, v in sorted(counts.items())) or "none"


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
    reference, ref_grads, out_grads = _reference(model, args, kwargs, seed)
    values = graph_inputs(captured, model, args, kwargs)
    user = tuple(
        v for n, v in zip(captured.placeholders(), values, strict=True) if n.meta[META_KIND] == "user_input"
    )
    job = _Job(model, plan, cluster, captured, args, kwargs, user, out_grads, fault, rng_seed=seed + 2)
    results = launch(_rank_work, plan.num_devices, job, timeout=timeout)
    floor = _least_precise(captured)
    report = _report(name or type(model).__name__, model, plan, (reference, ref_grads), results, start, floor)
    return dataclasses.replace(report, allow_replicated=allow_replicated)


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


def _report(
    name: str,
    model: nn.Module,
    plan: Plan,
    reference: tuple[list[torch.Tensor], dict[str, torch.Tensor]],
    results: list[Any],
    start: float,
    floor: torch.dtype | None = None,
) -> VerifyReport:
    """Rank 0 returned the gathered outputs and gradients; every rank its log of collectives."""
    (outputs, grads, _), logs = results[0], [log for _, _, log in results]
    ref_outputs, ref_grads = reference
    dtype = next((p.dtype for p in model.parameters()), torch.float32)
    return VerifyReport(
        model=name,
        mesh_shape=tuple(plan.mesh_shape),
        dtype=str(dtype).removeprefix("torch."),
        outputs=tuple(
            _diff(f"output {i}", o, r, floor)
            for i, (o, r) in enumerate(zip(outputs, ref_outputs, strict=True))
        ),
        grads=tuple(_diff(f"grad {k}", grads.get(k), g, floor) for k, g in ref_grads.items()),
        ranks_agree=all(log == logs[0] for log in logs),
        emitted=dict(Counter(f"{r.phase} {r.kind}" for r in logs[0] if r.phase in ("forward", "backward"))),
        planned=dict(Counter(f"{c.phase} {c.kind}" for c in plan.collectives)),
        seconds=time.perf_counter() - start,
        split=any(
            p.startswith("S(")
            for ps in (*plan.param_placements.values(), *plan.input_placements.values())
            for p in ps
        ),
    )


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
    model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], seed: int
) -> tuple[list[torch.Tensor], dict[str, torch.Tensor], tuple[torch.Tensor, ...]]:
    """Outputs, parameter gradients and the random output gradients of one step on one device."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed + 2)  # the ranks start from the same state: dropout masks equal in training mode
    outs = [t for t in pytree.tree_leaves(model(*args, **kwargs)) if isinstance(t, torch.Tensor)]
    gen = torch.Generator().manual_seed(seed + 1)
    out_grads = tuple(torch.randn(o.shape, generator=gen, dtype=o.dtype) for o in outs)
    live = [(o, g) for o, g in zip(outs, out_grads, strict=True) if o.requires_grad]
    if live:
        torch.autograd.backward([o for o, _ in live], [g for _, g in live])
    grads = {k: p.grad.detach().clone() for k, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return [o.detach() for o in outs], grads, out_grads


def _break(kind: str) -> None:
    """In this (forked) rank only: ``kind`` collectives are logged but move nothing (the test hook)."""
    from autoshard.codegen import collectives

    collectives._RUNNERS[kind] = lambda x, step, comm: (x.clone(), x.numel() * x.element_size())  # type: ignore[index]


def _rank_work(job: _Job) -> tuple[Any, Any, list[Any]]:
    if job.fault is not None:
        _break(job.fault)
    module = parallelize(
        job.model, job.plan, job.args, job.kwargs, captured=job.captured, cluster=job.cluster, record=True
    )
    info = parallel_info(module)
    mesh, coord = info.comm.mesh_shape, info.comm.coord
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
    log = list(info.comm.log or [])
    gathered = gather_outputs(module, tuple(o.detach() for o in outs))
    grads = full_grads(module)
    if coord != (0,) * len(coord):
        return None, None, log
    return list(gathered), grads, log


def _diff(
    name: str, got: torch.Tensor | None, want: torch.Tensor, floor: torch.dtype | None = None
) -> Difference:
    rtol, atol = _TOLERANCE.get(want.dtype, _LOW_PRECISION)
    if (
        floor is not None
        and want.is_floating_point()
        and torch.finfo(floor).eps > torch.finfo(want.dtype).eps
    ):
        rtol, atol = _TOLERANCE.get(floor, _LOW_PRECISION)  # checked to the precision the graph computes in
    scale = float(want.abs().max()) if want.numel() and want.is_floating_point() else 0.0
    if got is None:
        return Difference(name + " (missing)", math.inf, scale, atol + rtol * scale)
    if got.shape != want.shape:
        return Difference(f"{name} (shape {tuple(got.shape)} != {tuple(want.shape)})", math.inf, scale, 0.0)
    err = float((got.double() - want.double()).abs().max()) if want.numel() else 0.0
    return Difference(name, err, scale, atol + rtol * scale)


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
    from autoshard.runtime.mapping import verify_plan

    flags: dict[str, Any] = {"allow_replicated": allow_replicated, "seed": seed, "fault": fault}
    if plan is not None:
        return verify_plan(
            plan if isinstance(plan, Plan) else load_plan(plan), spec, float64=float64, **flags
        )
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
        model = model.to(torch.float64)
        args = tuple(a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)
    return verify(model, args, kwargs, cluster=cluster, annotations=annotations, name=spec, **flags)


def main(argv: Sequence[str] | None = None) -> int:
    """``autoshard verify ARGV``: the command line of :mod:`autoshard.cli.verify`."""
    from autoshard.cli import main as cli_main

    return cli_main(["verify", *(sys.argv[1:] if argv is None else argv)])
