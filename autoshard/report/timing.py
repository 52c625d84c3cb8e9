"""Where the planning time went: the footer's timing line, each phase measured where it ran.

Input: the plan's own stage timings (``Plan.timings``: capture, strategies, solve, ...) or, from
``autoshard search``, the :class:`Phase` list it measured: building the model, capturing it, each mesh
candidate (with its strategies and solve), the data-parallel baseline, writing the report.
Output: the text after ``planned in``; what no phase measured is named ``other``, never folded into another
phase's name.

Example::

    timing_text(plan, [Phase("model", 3.1), Phase("capture", 1.1), Phase("mesh 8", 1.4, (("solve", 0.04),))])
    # "planned in 5.6 s: model 3.10 s, capture 1.10 s, mesh 8 1.40 s (solve 40.00 ms)"
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from autoshard.plans import Plan
from autoshard.report.labels import fmt_seconds

T = TypeVar("T")

__all__ = ["Phase", "plan_parts", "timed", "timing_text", "with_parts"]

# Plan.timings keys that are parts of one planning call, in the order they run, and how the line names them
_PARTS = {
    "capture": "capture",
    "strategies_and_costs": "strategies",
    "solve": "solve",
    "recompute_blocks": "recompute search",
    "experts_alternative": "unfused experts",
    "rank": "rank by step",  # autoshard.planner_rerank
}


@dataclass(frozen=True, slots=True)
class Phase:
    """One measured phase of a command: its wall time and, optionally, named parts of it."""

    name: str
    seconds: float
    parts: tuple[tuple[str, float], ...] = ()

    def __str__(self) -> str:
        text = f"{self.name} {fmt_seconds(self.seconds)}"
        return text + (
            f" ({', '.join(f'{k} {fmt_seconds(v)}' for k, v in self.parts)})" if self.parts else ""
        )


def plan_parts(timings: Mapping[str, float], *, capture: bool = False) -> tuple[tuple[str, float], ...]:
    """The named parts of one planning call (``capture`` too when it ran inside the call)."""
    return tuple(
        (name, timings[key])
        for key, name in _PARTS.items()
        if key in timings and (capture or key != "capture") and timings[key] >= 5e-4
    )


def timing_text(plan: Plan, phases: Sequence[Phase] | None, planned_seconds: float | None) -> str:
    """``planned in 11.6 s: model 3.1 s, capture 1.1 s, mesh 8 1.4 s (strategies ..), ..., other 0.1 s``;
    without phases, the plan's own stages (``autoshard show``)."""
    if phases is None:
        stages = ", ".join(f"{name} {fmt_seconds(v)}" for name, v in plan_parts(plan.timings, capture=True))
        head = f"planned in {planned_seconds:.1f} s" if planned_seconds is not None else ""
        return f"{head} ({stages})" if head and stages else head or (f"stages: {stages}" if stages else "")
    measured = sum(p.seconds for p in phases)
    total = max(planned_seconds if planned_seconds is not None else measured, measured)
    rest = total - measured
    listed = [str(p) for p in phases] + ([f"other {fmt_seconds(rest)}"] if rest >= 5e-3 else [])
    return f"planned in {total:.1f} s: {', '.join(listed)}"


def timed(phases: list[Phase], name: str, step: Callable[[], T]) -> T:
    t0 = time.perf_counter()
    out = step()
    phases.append(Phase(name, time.perf_counter() - t0))
    return out


def with_parts(phase: Phase, timings: Mapping[str, float], capture: bool) -> Phase:
    """A planning call's phase with its stages and, named as such, what they leave out."""
    parts = plan_parts(timings, capture=capture)
    rest = phase.seconds - sum(v for _, v in parts)
    if parts and rest >= 5e-3:
        parts += (("other", rest),)
    return dataclasses.replace(phase, parts=parts)
