"""The verdict of a verify run: how far each output and gradient is from the single-device model, and
whether the ranks ran the plan's collectives.

Input: the gathered results of the ranks and the reference run (:func:`report_of`).  Output: a
:class:`VerifyReport`; ``report.ok`` says whether all of it holds, ``str(report)`` prints the worst
differences.  :mod:`autoshard.runtime.verify` runs the ranks; this module only judges what they returned.

Tolerances are per dtype (float64 to 1e-9 relative, float32 to 2e-4, lower precisions to 2e-2), or those of
the least precise dtype the graph computes in when that is coarser.

Top-k routing (a mixture of experts' router): a split plan computes the router's scores in another order, and
where two experts' scores are nearly tied the distributed run could choose another expert for a token, which
moves that expert's gradients by O(|ref|), not by rounding (the h100x8 2-node Mixtral plan's scaled copy did
so in bfloat16 on every seed tried, 8-14x tolerance in layer 1).  So verify runs every rank on the reference's
choices (:mod:`autoshard.runtime.verify_routes`) and reports how many would have flipped (:class:`RoutePins`,
a line of ``str(report)``); the tolerances stay those above.  (That plan's ring attention then still missed
them by 1.04-1.27x on half the seeds: its bfloat16 log-sum-exp, now float32 in ``codegen/context.py``.)

Example::

    report = report_of("mlp", model, plan, (ref_outputs, ref_grads), results, start)
    print(report.verdict)        # "OK", "MISMATCH" or "NOTHING DISTRIBUTED CHECKED"
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from autoshard.plans import Plan
from autoshard.runtime.verify_routes import RoutePins

__all__ = ["Difference", "VerifyReport", "difference", "report_of"]

_TOLERANCE = {torch.float64: (1e-9, 1e-12), torch.float32: (2e-4, 1e-6)}  # (rtol, atol)
_LOW_PRECISION = (2e-2, 1e-3)
_PHASES = ("forward", "backward", "regather")  # of a step; FSDP's backward re-gathers: runtime/reshard.py


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
    # context parallelism's K/V hops per device and step, checked against the plan (runtime/ring_check.py)
    ring_hops: dict[str, int] = dataclasses.field(default_factory=dict)
    # top-k (routing) choices pinned to the reference's, and how many would have flipped (runtime/verify_routes.py)
    routes: RoutePins | None = None
    plan_line: str = ""  # the headline of the plan the ranks ran (runtime/verify_scope.py)
    warnings: tuple[str, ...] = ()  # mesh axes on which most of the compute ran replicated
    not_run: tuple[str, ...] = ()  # what the deployed plan does that this check did not run
    also_ran: tuple[
        str, ...
    ] = ()  # recomputation, FSDP re-gathers: run beyond one plain forward and backward

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
        lines += [f"plan run: {self.plan_line}"] if self.plan_line else []
        lines += list(self.warnings)
        if (
            self.warnings and not self.source
        ):  # --model: planned here for this small mesh, not what you deploy
            lines.append(
                "  to check the splits you deploy: verify --plan PLAN.json (from autoshard search --out)"
            )
        lines += ["largest differences:", *(f"  {d}" for d in self.worst())]
        lines.append(f"collectives per step: {_counts(self.emitted)} (plan: {_counts(self.planned)})")
        lines += [f"  of which {a}" for a in self.also_ran]
        if self.ring_hops:  # had any rank sent other hops than the plan lists, ring_check would have raised
            lines.append(f"ring K/V hops per device and step: {_counts(self.ring_hops)} (as the plan lists)")
        if self.routes is not None:
            lines.append(f"note: {self.routes}")
        if not self.ranks_agree:
            lines.append("FAIL ranks issued different collective sequences (see module.autoshard.comm.log)")
        if not self.distributed:
            advice = "; verify a plan that shards (--plan) or pass --allow-replicated"
            if self.source:  # --plan was given: it is that plan that splits nothing here
                advice = "; this plan splits nothing here: verify one that shards, or pass --allow-replicated"
            lines.append(
                "no collective ran and nothing was split: this checks nothing distributed"
                + ("" if self.allow_replicated else advice)
            )
        if self.not_run:
            lines.append(f"not run by this check ({len(self.not_run)}):")
            lines += [f"  {n}" for n in self.not_run]
        if self.source or self.exercised:
            lines.append(f"strategies exercised that split or reduce ({len(self.exercised)}):")
            lines += [f"  {e}" for e in self.exercised] or ["  none"]
        if self.source:
            lines.append(f"not mapped ({len(self.unmapped)}):")
            lines += [f"  {u}" for u in self.unmapped] or ["  none"]
        return "\n".join(lines)


def _counts(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{k} x{v}" for k, v in sorted(counts.items())) or "none"


def report_of(
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
            difference(f"output {i}", o, r, floor)
            for i, (o, r) in enumerate(zip(outputs, ref_outputs, strict=True))
        ),
        grads=tuple(difference(f"grad {k}", grads.get(k), g, floor) for k, g in ref_grads.items()),
        ranks_agree=all(log == logs[0] for log in logs),
        emitted=dict(Counter(f"{r.phase} {r.kind}" for r in logs[0] if r.phase in _PHASES)),
        planned=dict(Counter(f"{c.phase} {c.kind}" for c in plan.collectives if c.phase in _PHASES)),
        seconds=time.perf_counter() - start,
        split=any(
            p.startswith("S(")
            for ps in (*plan.param_placements.values(), *plan.input_placements.values())
            for p in ps
        ),
    )


def difference(
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
