"""Which schedules a candidate refused by its stage surrogate may still run, and a bound on their steps.

Input: one (degree, microbatches, recomputation) candidate's :class:`~autoshard.problem.build.BuiltProblem`,
the (schedule, chunks per device) shapes the stage DP prices for it, and the per-device budget.
Output: :func:`live_shapes`, the shapes whose proven memory floor fits the budget (each with the floor's
search problem), and the least floor over all shapes; :func:`refit_bound`, a lower bound on the step of every
plan :mod:`autoshard.pipeline.refit` can return.  The pipeline search refuses the candidate without a refit
when no shape lives, and skips the refit when the bound reaches the best step so far.

Per-shape floors.  :func:`~autoshard.pipeline.refit.floor_problem` bounds the busiest device under every shape
at once, with the fewest microbatches any device of any shape holds (1 under 1F1B, its last device).  Under
one shape, device ``d`` holds ``f_d`` microbatches (:func:`~autoshard.pipeline.schedules.in_flight`), so
each shape has its own, tighter floors:

- the mean device and the embedding's and the head's devices (``floor_problem`` with ``min_d f_d``);
- the layers' harmonic floor (:func:`harmonic_flight`).  Device ``d`` holding ``k_d`` layers needs at least
  ``R + k_d (s + f_d a)`` (``R`` the reserve and what a device holds beside for one layer, its gathered weights
  and recompute working set; ``s`` and ``a`` one layer's parameter state and activations of the plan; the parts
  outside the layers only add), so a cut that fits ``M`` has
  ``L = Σ_d k_d <= (M − R) Σ_d 1 / (s + f_d a)``.  With ``μ = s / p + a / H``, ``H = Σ_d 1 / f_d``, and
  Cauchy-Schwarz (``1 / (x + y) <= α² / x + β² / y`` for ``α + β = 1``; ``α = s / (p μ)``, ``β = a / (H μ)``),
  ``Σ_d 1 / (s + f_d a) <= p α² / s + H β² / a = 1 / μ``, hence ``M >= R + L s / p + L a / H``: the
  layers' state over ``p`` devices and their activations times ``p / H`` microbatches (the harmonic mean of
  the ``f_d``, above their least: 4.73 for 1F1B on 16 stages and 16 microbatches where the least is 1).

A plan the stage DP fits under a shape meets every floor of that shape (each is at most its busiest device),
so a shape whose least floor (:func:`~autoshard.search.exact.min_memory_plan` of the floor problem) is over the
budget runs no plan of the candidate.  LLaMA-3 405B on PP 16 without recomputation: 9.73 GiB under all
shapes at once; per shape (the harmonic floor) GPipe and ZB-V 135 GiB, interleaved v = 2 113 GiB, v = 3 122 GiB, v = 4
125 GiB, over 79.18 GiB; only 1F1B (40.8 GiB) lives.

The bound.  The refit returns a plan only with a split the stage DP fits under a live shape, so the plan meets
that shape's floor under the budget, and :func:`~autoshard.pipeline.bound.step_bound` over that floor problem
and that shape bounds its step (its argument holds for any memory model that keeps every fitting plan).  The
least over the live shapes bounds whatever the refit returns (1F1B above: 20.03 s, over selective
recomputation's 15.93 s: the refit, ~19 s CPU, is not run).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from autoshard.pipeline.bound import step_bound
from autoshard.pipeline.refit import StageMemoryError, floor_problem, least_memory
from autoshard.pipeline.schedules import Schedule, in_flight
from autoshard.problem.build import BuiltProblem
from autoshard.search import SearchProblem
from autoshard.search.problem import format_bytes

__all__ = ["Live", "harmonic_flight", "live_shapes", "refit_bound"]

Shape = tuple[Schedule, int]


@dataclasses.dataclass(frozen=True)
class Live:
    """The shapes whose floors fit the budget, each with its tightest floor problem, and the least floor over
    every shape (bytes; a lower bound on the busiest device of every plan the stage DP can fit)."""

    shapes: tuple[tuple[Shape, SearchProblem], ...]
    least: float

    def refusal(self) -> StageMemoryError:
        """The candidate's refusal when no shape lives: proven, with the least floor."""
        need = format_bytes(self.least)
        return StageMemoryError(
            f"every plan needs at least {need} on its busiest device under each schedule the stages may run "
            "(its share of the layers and of the microbatches in flight there). Fix: raise the memory limit to "
            f"at least {need} or spread the model over more devices (more stages or a larger mesh)",
            self.least,
            True,
        )


def harmonic_flight(schedule: Schedule, virtual: int, degree: int, microbatches: int) -> float:
    """``p / Σ_d 1 / f_d``: the microbatches of activations the layers' harmonic floor charges (module doc)."""
    flights = [in_flight(schedule, d, degree, virtual, microbatches) for d in range(degree)]
    return degree / sum(1.0 / f for f in flights)


def live_shapes(built: BuiltProblem, degree: int, shapes: Sequence[Shape], budget: float) -> Live:
    """The shapes whose floors (module docstring) all fit ``budget``, each with its floor problem of the
    largest least memory; floors shared by shapes of equal flights are solved once, the mean device's and the
    end stages' only for shapes whose layers' floor fits (``least``: of the floors solved)."""
    m = built.options.microbatches
    solved: dict[tuple[str, float], tuple[float, SearchProblem]] = {}

    def floor(kind: str, flight: float) -> tuple[float, SearchProblem]:
        if (kind, flight) not in solved:
            if kind == "harmonic":
                problem = floor_problem(built, degree, flight, budget, "layers")
                solved[kind, flight] = (least_memory(problem)[1], problem)
            else:
                problem = floor_problem(built, degree, flight, budget)
                held = max(
                    least_memory(floor_problem(built, degree, flight, budget, h))[1] for h in ("pre", "post")
                )
                solved[kind, flight] = (max(least_memory(problem)[1], held), problem)
        return solved[kind, flight]

    live: list[tuple[Shape, SearchProblem]] = []
    least = float("inf")
    for schedule, v in shapes:
        need, problem = floor("harmonic", harmonic_flight(schedule, v, degree, m))
        if need <= budget:  # the mean and the end stages' floors only where the layers' floor fits
            fewest = min(in_flight(schedule, d, degree, v, m) for d in range(degree))
            need, problem = max((need, problem), floor("mean", max(1.0, fewest)), key=lambda pair: pair[0])
        least = min(least, need)
        if need <= budget:
            live.append(((schedule, v), problem))
    # the refusal's figure: the mean and end stages' floor at the fewest flight holds under every shape too
    if not live and shapes:
        fewest = min(in_flight(s, d, degree, v, m) for s, v in shapes for d in range(degree))
        least = max(least, floor("mean", max(1.0, fewest))[0])
    return Live(tuple(live), least)


def refit_bound(
    built: BuiltProblem, degree: int, live: Live, best_step: float, time_limit: float, max_factor: float
) -> float:
    """A lower bound on the step of every plan the refit can return (module docstring): the least over the
    live shapes of :func:`~autoshard.pipeline.bound.step_bound` on the shape's floor problem; stops at the
    first under ``best_step``."""
    bound = float("inf")
    for shape, problem in live.shapes:
        bound = min(bound, step_bound(built, problem, [shape], degree, best_step, time_limit, max_factor))
        if bound < best_step:
            break
    return bound
