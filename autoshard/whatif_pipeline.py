"""What-if on a pipelined plan: its step re-priced on a changed cluster, the stage cut and strategies kept.

Input: a :class:`~autoshard.plans.Plan` with ``plan.pipeline`` and settings ``{name: value}`` from
:data:`SETTINGS`.  Output: a :class:`PipelineWhatIf` -- the plan as planned and as re-priced, stage by stage.

A pipelined step is a schedule over stages (bubble, hand-offs, the first gather of each chunk), not the node
sum :mod:`autoshard.whatif` scales, so it is re-priced, not scaled: :func:`autoshard.pipeline_replay.replay`
rebuilds the stage problem on the changed cluster and prices the plan's own cut, schedule, microbatches and
per-stage strategies with the pipeline search's functions.  What can be changed honestly:

===================  ==========================================================================================
setting              changes
===================  ==========================================================================================
``bandwidth``        every link's bandwidth, as a multiple of the profile's (in node and between nodes)
``inter_bandwidth``  the network between nodes (NIC bandwidth), a multiple of the profile's
``intra_bandwidth``  the links inside a node (bus bandwidth of every collective), a multiple of the profile's
``memory``           GiB per device: the budget each stage's peak is held to (the peaks themselves are
                     the plan's; the search would cut or recompute otherwise)
===================  ==========================================================================================

``bandwidth`` and one of the others multiply (``bandwidth=2, inter_bandwidth=2``: the network 4x).
Refused (:data:`REFUSED`), each in one line: ``batch`` and ``seq`` change the microbatch the stage problem
was solved at, and ``devices`` the stage sub-mesh; the plan's strategies are not a plan there -- re-plan.

Example::

    w = pipeline_whatif(load_plan("pp.json"), {"inter_bandwidth": 2.0})
    print(render(w))   # step 2.24 ms -> 2.10 ms (-6.3 %), bubble 33.4 % -> 33.9 %, per stage ...
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from autoshard.cluster import Cluster
from autoshard.errors import AutoshardError
from autoshard.plans import Plan
from autoshard.report.labels import fmt_bytes, fmt_seconds

__all__ = ["REFUSED", "SETTINGS", "PipelineWhatIf", "pipeline_whatif", "render", "varied_cluster"]

GIB = 2**30
SETTINGS: dict[str, str] = {
    "bandwidth": "every link's bandwidth (x the profile's)",
    "inter_bandwidth": "the network between nodes (x the profile's)",
    "intra_bandwidth": "the links inside a node (x the profile's)",
    "memory": "GiB per device the stages must fit",
}
REFUSED: dict[str, str] = {
    "batch": "it changes the microbatch the stage problem was solved at",
    "seq": "it changes the microbatch the stage problem was solved at",
    "devices": "it changes the stage sub-mesh the stage problem was solved on",
}


class WhatIfPipelineError(AutoshardError):
    """A setting a pipelined plan cannot be re-priced under (the message says why)."""


@dataclass(frozen=True)
class PipelineWhatIf:
    """A pipelined plan as planned (``before``) and re-priced under ``settings`` (``after``)."""

    settings: tuple[tuple[str, float], ...]
    before: Plan
    after: Plan
    budget_before: float | None  # bytes per device each stage is held to
    budget_after: float | None
    hand_off: tuple[float, float] = (0.0, 0.0)  # seconds of one send between stages, before and after


def check_setting(name: str, value: float) -> None:
    """One line for a setting a pipelined plan cannot be re-priced under (module docstring)."""
    if name in REFUSED:
        raise WhatIfPipelineError(
            f"cannot set {name} for a pipelined plan: {REFUSED[name]}, and the plan's per-stage strategies are "
            f"not a plan there; re-plan with autoshard search at the new {name} and compare the two files"
        )
    if name not in SETTINGS:
        raise WhatIfPipelineError(
            f"--set {name}={value:g}: a pipelined plan can be re-priced under {', '.join(SETTINGS)}"
        )
    if not value > 0:
        raise WhatIfPipelineError(f"--set {name}={value:g}: give a positive value")


def varied_cluster(cluster: Cluster, settings: Mapping[str, float]) -> Cluster:
    """``cluster`` with its profile's links scaled (``memory`` does not change the cluster: see
    :func:`pipeline_whatif`)."""
    profile = cluster.profile
    intra = settings.get("bandwidth", 1.0) * settings.get("intra_bandwidth", 1.0)
    inter = settings.get("bandwidth", 1.0) * settings.get("inter_bandwidth", 1.0)
    bus = profile.intra_node.bus_bandwidth
    scaled_bus = dataclasses.replace(bus, **{k: getattr(bus, k) * intra for k in type(bus).__slots__})
    profile = dataclasses.replace(
        profile,
        intra_node=dataclasses.replace(profile.intra_node, bus_bandwidth=scaled_bus),
        inter_node=dataclasses.replace(
            profile.inter_node, nic_bandwidth=profile.inter_node.nic_bandwidth * inter
        ),
    )
    return dataclasses.replace(cluster, profile=profile)


def pipeline_whatif(plan: Plan, settings: Mapping[str, float], spec: str | None = None) -> PipelineWhatIf:
    """The plan re-priced under ``settings`` (module docstring); the unchanged replay must match the plan."""
    from autoshard.codegen.parallelize import plan_cluster
    from autoshard.pipeline_replay import model_case, replay

    for name, value in settings.items():
        check_setting(name, value)
    case = model_case(plan, spec)
    before = replay(plan, spec, case=case)  # checks that the rebuilt stage problem prices the plan's step
    links = set(settings) - {"memory"}  # memory moves only the budget: the priced plan is the same
    after = replay(plan, spec, varied_cluster(plan_cluster(plan), settings), case) if links else before
    budget = plan.memory_limit
    return PipelineWhatIf(
        tuple(settings.items()),
        before.plan,
        after.plan,
        budget,
        settings["memory"] * GIB if "memory" in settings else budget,
        (before.hand_off, after.hand_off),
    )


def render(w: PipelineWhatIf) -> str:
    """Before and after: the step and its parts, the bubble, then each stage's time and memory."""
    a, b = w.before, w.after
    assert a.pipeline is not None and b.pipeline is not None
    said = ", ".join(f"{k}={v:g}" + (" GiB" if k == "memory" else "x") for k, v in w.settings)
    lines = [f"what if {said} (stage cut, schedule, microbatches and strategies kept):"]
    rows = (
        ("step", a.predicted_step_time, b.predicted_step_time),
        ("compute (bubble included)", a.compute_time, b.compute_time),
        ("communication waited for", a.communication_time, b.communication_time),
    )
    lines.append(f"  {'':<28}{'planned':>12}{'what if':>12}{'change':>11}")
    for name, x, y in rows:
        lines.append(f"  {name:<28}{fmt_seconds(x):>12}{fmt_seconds(y):>12}{_change(x, y):>11}")
    bubble = (a.pipeline.bubble_fraction, b.pipeline.bubble_fraction)
    lines.append(f"  {'bubble share':<28}{bubble[0]:>12.1%}{bubble[1]:>12.1%}{_points(*bubble):>11}")
    hop = w.hand_off
    lines.append(
        f"  {'one hand-off between stages':<28}{_seconds(hop[0]):>12}{_seconds(hop[1]):>12}{_change(*hop):>11}"
    )
    budgets = [("none" if x is None else fmt_bytes(x)) for x in (w.budget_before, w.budget_after)]
    lines.append(f"  {'memory budget per device':<28}{budgets[0]:>12}{budgets[1]:>12}")
    ranks = [_span(s.ranks[0], s.ranks[-1] + 1) if s.ranks else "-" for s in a.pipeline.stages]
    layers = [_span(*s.layers) if s.layers else "-" for s in a.pipeline.stages]
    # every left-aligned column as wide as its header or widest value, then two spaces (new-user trial:
    # "stage ranks" ran together above values that seemed to sit under the wrong header)
    sw = len(str(len(ranks) - 1)) + 2
    sw, rw, lw = max(5 + 2, sw), max(5, *map(len, ranks)) + 2, max(6, *map(len, layers)) + 2
    lines.append(
        f"  {'stage':<{sw}}{'ranks':<{rw}}{'layers':<{lw}}{'time/microbatch':>15}{'what if':>12}"
        f"{'peak memory':>13}  fits"
    )
    for s, t, r, k in zip(a.pipeline.stages, b.pipeline.stages, ranks, layers, strict=True):
        fits = _fits(t.memory_bytes, w.budget_after)
        lines.append(
            f"  {s.index:<{sw}}{r:<{rw}}{k:<{lw}}{fmt_seconds(s.compute_seconds):>15}"
            f"{fmt_seconds(t.compute_seconds):>12}{fmt_bytes(t.memory_bytes):>13}  {fits}"
        )
    changed = _changed(a, b)
    if w.budget_after != w.budget_before:
        fit = sum(_fits(t.memory_bytes, w.budget_after) == "yes" for t in b.pipeline.stages)
        budget = f"the memory budget ({fit} of {len(b.pipeline.stages)} stages fit)"
        changed = budget if changed.startswith("nothing") else f"{changed}; {budget}"
    lines.append(f"  what changed: {changed}")
    return "\n".join(lines)


def _span(first: int, end: int) -> str:
    """``3`` or ``0..7`` for the half-open range ``[first, end)``."""
    return f"{first}" if end - first == 1 else f"{first}..{end - 1}"


def _change(x: float, y: float) -> str:
    if abs(y - x) <= 1e-9 * max(abs(x), abs(y), 1e-30):
        return "="
    return f"{(y - x) / x * 100:+.3g}%" if x else "new"


def _points(x: float, y: float) -> str:
    return "=" if abs(y - x) < 5e-5 else f"{(y - x) * 100:+.1f} pt"


def _fits(peak: float, budget: float | None) -> str:
    if budget is None:
        return "no budget"
    return (
        "yes" if peak <= budget * (1 + 1e-9) else f"no: {fmt_bytes(peak - budget)} over {fmt_bytes(budget)}"
    )


def _changed(a: Plan, b: Plan) -> str:
    """The terms that moved, largest first: the step's parts, then the collectives listed per mesh axis."""
    tiny = 1e-9 * max(a.predicted_step_time, 1e-30)
    moved = [
        ("communication waited for", b.communication_time - a.communication_time),
        ("compute and bubble", b.compute_time - a.compute_time),
    ]
    names = a.cluster.get("axis_names") or [f"axis{i}" for i in range(len(a.mesh_shape))]
    for axis, name in enumerate(names):
        listed = [sum(c.seconds for c in p.collectives if c.mesh_axis == axis) for p in (a, b)]
        moved.append((f"collectives listed on axis {axis} ({name})", listed[1] - listed[0]))
    parts = [(k, v) for k, v in moved if abs(v) > tiny]
    parts.sort(key=lambda kv: -abs(kv[1]))
    said = [f"{k} {'+' if v > 0 else '-'}{_seconds(abs(v))}" for k, v in parts]
    return "; ".join(said) if said else "nothing: the changed links carry none of this plan's work"


def _seconds(s: float) -> str:
    """:func:`fmt_seconds`, and nanoseconds below a microsecond (a small change must not print as 0.0 us)."""
    return fmt_seconds(s) if s >= 1e-6 else f"{s * 1e9:.3g} ns"
