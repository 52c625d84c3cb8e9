"""What pipeline stages would do when ``search`` finds no plan that fits the memory budget.

Input: the planner's refusal (an :class:`~autoshard.errors.InfeasibleError` from the budget,
:func:`autoshard.steering.budget_refusal`'s text), the command's options, the device count, and a function that
plans the same model with ``pipeline=d``.  Output: the same refusal with the pipeline option tried: the
fewest stages ``d`` whose plan fits become the first fix (``--pp d``), or, when no degree fits, what each
degree needs at the least, so that "pp" is never only listed as left.

``search --pp auto`` on one node tries no stages at all (stages cut across nodes: ``pipeline/search.py``), so
the degrees here are the divisors of the device count from 2 up, each planned as ``--pp d`` would be, the
fewest first; at most :data:`MAX_TRIES` of them (each is a whole plan: a few seconds at 8B).

Example::

    raise with_stage_hint(error, args, 8, lambda d: plan_staged(d)) from error
    # ... tp forbidden (left: dp, fsdp, sp, cp, ep, pp); pipeline stages tried: --pp 2 needs at least
    # 27.21 GiB, --pp 4 ..., --pp 8 ...: no degree fits. Fix: ...
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from typing import TYPE_CHECKING

from autoshard.errors import AutoshardError, InfeasibleError

if TYPE_CHECKING:
    from autoshard.plans import Plan

__all__ = ["MAX_TRIES", "stage_degrees", "with_stage_hint"]

MAX_TRIES = 3  # pipeline degrees planned after a refusal: each costs a whole plan (8B: ~7 s CPU)
_BUDGET = "no plan fits the memory budget"
_NEEDS = re.compile(r"needs at least ([0-9.]+ [KMGT]?i?B)")


def stage_degrees(devices: int) -> list[int]:
    """Stage counts to try on ``devices`` devices: divisors from 2 up, the fewest first."""
    return [d for d in range(2, devices + 1) if devices % d == 0][:MAX_TRIES]


def with_stage_hint(
    error: InfeasibleError,
    args: argparse.Namespace,
    devices: int,
    plan_staged: Callable[[int], Plan],
) -> InfeasibleError:
    """``error`` with pipeline stages tried (module docstring); ``error`` itself when stages do not apply:
    ``--pp`` given, pp forbidden, or a refusal other than the memory budget's."""
    from autoshard.report.labels import fmt_bytes, fmt_seconds
    from autoshard.steering import forbidden_kinds

    text = " ".join(str(error).split())
    if args.pp is not None or _BUDGET not in text or "pp" in forbidden_kinds(args.allow, args.forbid):
        return error
    what, sep, fix = text.partition(" Fix: ")
    tried: list[str] = []
    for d in stage_degrees(devices):
        try:
            plan = plan_staged(d)
        except InfeasibleError as e:
            needs = _NEEDS.search(str(e))
            tried.append(f"--pp {d} needs at least {needs.group(1)}" if needs else f"--pp {d}: {_clause(e)}")
            continue
        except AutoshardError as e:  # a degree the model cannot take (layers, batch): nor can a larger one
            tried.append(f"--pp {d} or more: {_clause(e).removeprefix(f'pipeline={d}: ')}")
            break
        fits = (
            f"--pp {d} (a plan with {d} pipeline stages fits: {fmt_bytes(plan.memory_per_device)} per device, "
            f"step {fmt_seconds(plan.predicted_step_time)})"
        )
        said = f"; pipeline stages tried: {', '.join(tried)}" if tried else ""
        return InfeasibleError(f"{what.rstrip('.')}{said}. Fix: {fits}{', ' + fix if sep else ''}")
    if not tried:
        return error
    why = f"pipeline stages tried: {', '.join(tried)}: no degree fits"
    return InfeasibleError(f"{what.rstrip('.')}; {why}{'. Fix: ' + fix if sep else '.'}")


def _clause(error: AutoshardError) -> str:
    """An error's first clause: what went wrong, without its own fix."""
    return " ".join(str(error).split()).partition(" Fix: ")[0].split("; ")[0].rstrip(".")
