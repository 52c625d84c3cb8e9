"""Before a pipeline candidate is refused for memory: a sound floor, and the plans tried at the true budget.

Input: one (degree, microbatches, recomputation) candidate's :class:`~autoshard.problem.build.BuiltProblem`,
the stage surrogate the search solves under the budget (:func:`~autoshard.pipeline.layers.stage_memory_problem`),
the budget, the (schedule, chunks) shapes the stage DP may price, and two callbacks: a budgeted solve and the
stage DP at the true budget (a plan's best :class:`~autoshard.pipeline.stages.StageSplit`, or None).
Output: the fastest (solution, split) that fits, or :class:`StageMemoryError` carrying a true lower bound.

Why: the surrogate shapes the intra-op plan so that whichever cut the stage DP picks is likely to fit, so it
is pessimistic -- the parts before and after the layers (embedding, head and loss) both count on one stage,
with 1F1B's first-stage microbatches in flight, plus gathered weights and the largest temporary.  Its
refusal is not a lower bound: LLaMA-3-8B on 8 devices, ``--pp 4 --forbid tp``, was refused at 30 GiB as
"every plan needs at least 38.74 GiB" while the plan found at 40 GiB (PP 4 ZB-V x CP 2) needs 27.2 GiB.  With
this module it plans at 30 GiB (28.4 GiB, 1.717 s), and at 40 GiB finds 1.302 s where it found 1.784 s (no
recomputation, whose surrogate had refused 40 GiB).  Nor is it an upper bound of a device's peak, though the
stage DP now counts the same terms (gathered weights, temporary, working set: pipeline/stages.py): it charges
``L / p`` layers and 1F1B's ``min(m, p)`` microbatches in flight, where the DP may give a device more layers
(uneven cuts: the 1T benchmark's stages run 1 to 3 layers) and GPipe or interleaved schedules more
microbatches; so a plan it admits may fit no cut, one it refuses may fit, and this module (with its deferral,
pipeline/walk.py) stays.

The floor (:func:`floor_problem`): every cut puts each layer and each part outside the layers on some device,
every device holds at least ``f`` microbatches of activations (``f``: the least
:func:`~autoshard.pipeline.schedules.in_flight` over the devices and the shapes the DP may price), so the
busiest device holds at least ``reserve + (static + f x activations) / degree`` -- the model's whole parameter
state and per-microbatch activations as :func:`~autoshard.pipeline.layers.part_costs` counts them (a layer
``L`` times, tied weights once) -- plus what every device holds beside for the layer it runs at the least
(one layer's gathered weights and recompute working set, :meth:`~autoshard.pipeline.stages.StageCosts.held`).
The least of that over the plans (:func:`~autoshard.search.min_memory_plan`) is a lower bound on every plan of
the candidate; above the budget, the refusal is sound and says that figure.

Otherwise, plans are tried at the true budget before refusing: the floor's budgeted optimum, then the
surrogate's least-memory plan and plans of the surrogate under budgets bisected between its least memory and
the floor optimum's (:data:`BISECTIONS` solves): the largest surrogate budget whose plan fits is the fastest
of that family.  The fastest plan that fits wins; when none does, :class:`StageMemoryError` says the floor and
that the plans tried do not fit.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import numpy as np

from autoshard.errors import InfeasibleError
from autoshard.pipeline.layers import part_names, rematerialised, runtime_reserve, working_set
from autoshard.pipeline.schedules import Schedule, in_flight
from autoshard.pipeline.stages import StageSplit
from autoshard.problem.build import BuiltProblem
from autoshard.problem.costs import node_memory
from autoshard.search import FactorCapExceeded, SearchProblem, Solution
from autoshard.search.exact import min_memory_plan
from autoshard.search.problem import format_bytes, memory_lower_bound

__all__ = [
    "BISECTIONS",
    "StageMemoryError",
    "floor_problem",
    "least_flight",
    "least_memory",
    "least_refusal",
    "refit",
]

BISECTIONS = 3
"""Surrogate budgets bisected after its least-memory plan fits (each one budgeted stage solve; only reached
when the surrogate refused the budget)."""

_ABOVE = 1e-9  # relative slack over a least-memory figure, so that its own plan passes the budget check

SolveFn = Callable[[SearchProblem], Solution]
SplitFn = Callable[[Solution], StageSplit | None]


class StageMemoryError(InfeasibleError):
    """A candidate no plan of which fits the budget as far as the search can tell; ``floor`` bytes is a lower
    bound on every plan's busiest device (``proven``: the floor itself exceeds the budget)."""

    def __init__(self, message: str, floor: float, proven: bool) -> None:
        super().__init__(message)
        self.floor = floor
        self.proven = proven


def least_flight(shapes: Sequence[tuple[Schedule, int]], degree: int, microbatches: int) -> float:
    """The fewest microbatches any device holds in flight under the (schedule, chunks) shapes the DP may price
    (1 when there are none: every device holds at least the microbatch it runs)."""
    flights = [
        in_flight(schedule, d, degree, v, microbatches) for schedule, v in shapes for d in range(degree)
    ]
    return max(1.0, min(flights, default=1.0))


def floor_problem(
    built: BuiltProblem, degree: int, flight: float, budget: float | None, holder: str | None = None
) -> SearchProblem:
    """``built.problem`` with each node's memory its share of a device's floor (module docstring): of the
    busiest device (``holder`` None): parameter state ``copies / degree``, activations ``flight x copies /
    degree`` (``copies``: the layers for a layer's node, 1 outside them); of the device holding the part
    ``holder`` (``"pre"`` or ``"post"``): that part and one layer, activations ``flight`` times; of the layers
    alone (``"layers"``, the harmonic floor of :mod:`autoshard.pipeline.floors`): a layer's node as for the
    busiest device, others nothing.  The reserve once, and once what every device holds beside, since each runs
    a layer (:meth:`~autoshard.pipeline.stages.StageCosts.held`): one layer's gathered weights and recompute
    working set (``holder`` ``"pre"`` / ``"post"``: that part's gathered weights too).  The largest temporary is
    left out (a floor may leave out what it likes)."""
    problem = built.problem
    parts = part_names(built)
    readers: dict[str, set[str]] = {}
    for use in built.edges:  # a parameter counts where it is read, as part_costs counts it
        if built.infos[use.producer].kind == "parameter":
            readers.setdefault(built.template[use.producer], set()).add(parts[use.consumer])
    layers = max(1, built.num_blocks)
    memory: list[np.ndarray] = []
    for k, name in enumerate(built.variables):
        info, keeps = built.infos[name], built.keeps.get(name, True)
        static = info.kind in ("parameter", "buffer", "constant")
        held = readers.get(name, {parts[name]})
        if holder is None or holder == "layers":
            copies = (layers if "layer" in held else (1 if holder is None else 0)) / degree
        else:
            copies = 1.0 if held & {holder, "layer"} else 0.0
        weight = copies * (1.0 if static else flight)
        strategies = built.strategies[name]
        own = np.array([node_memory(info, s, built.cluster, built.options, keeps) for s in strategies])
        working = np.zeros(len(strategies))
        if rematerialised(built, name):  # one layer's working set: a node for ``count`` layers, count / L
            working = np.array(
                [working_set(built, name, s) * built.multiplicity[name] / layers for s in strategies]
            )
        memory.append(own * weight + working + (runtime_reserve(built) if k == 0 else 0.0))
    memory += _gathered(built, holder)
    return dataclasses.replace(problem, memory=tuple(memory), peak=None, memory_limit=budget)


def _gathered(built: BuiltProblem, holder: str | None) -> list[np.ndarray]:
    """The floor's memory of the nodes after the variables: a gather node's bytes where the device of the
    floor holds them at the least -- one layer's gathers (the builder's count ``1 + prefetch`` layers' of the
    distinct layers holding them: :mod:`autoshard.problem.extras`), a weight outside the layers gathered for
    one whole, and for ``holder`` ``"pre"`` / ``"post"`` that part's gathers; nothing elsewhere."""
    problem, extras = built.problem, built.extras
    trailing = [np.zeros(len(m)) for m in (problem.memory or ())[len(built.variables) :]]
    if extras is None:
        return trailing
    parts, infos = part_names(built), built.infos
    blocks = {b[0] for g in extras.gathers if (b := infos[g.producer].block) is not None}
    depth = 1 + built.options.overlap.prefetch
    for k, g in enumerate(extras.gathers):
        if infos[g.producer].block is not None:
            share = 1.0 / (depth * len(blocks))
        else:
            share = 1.0 if parts[g.consumer] in ("layer", holder) else 0.0
        trailing[extras.offset + k - len(built.variables)] = g.memory * share
    return trailing


def least_memory(problem: SearchProblem) -> tuple[tuple[int, ...] | None, float]:
    """The least-memory plan of ``problem`` and its memory, peak dropped (None and a sum of per-node least
    memories when the problem is too wide to eliminate: also a floor)."""
    try:
        plan, value = min_memory_plan(dataclasses.replace(problem, peak=None))
    except FactorCapExceeded:  # too wide to eliminate: the sum of each node's least memory, also a floor
        return None, memory_lower_bound(dataclasses.replace(problem, peak=None))
    return plan, value


def _value(problem: SearchProblem, choice: Sequence[int]) -> float:
    """The surrogate's memory of a plan: the sum of its nodes' plus the largest temporary."""
    assert problem.memory is not None
    total = math.fsum(float(m[k]) for m, k in zip(problem.memory, choice, strict=True))
    peaks = problem.peak if problem.peak is not None else ()
    return total + max((float(p[k]) for p, k in zip(peaks, choice, strict=False)), default=0.0)


def refit(
    surrogate: SearchProblem,
    built: BuiltProblem,
    degree: int,
    flight: float,
    budget: float,
    solve_at: SolveFn,
    split_of: SplitFn,
) -> tuple[Solution, StageSplit]:
    """The fastest plan found that fits ``budget`` at the stage DP (module docstring); StageMemoryError when
    the floor rules every plan out (``proven``) or none of the plans tried fits."""
    floor = floor_problem(built, degree, flight, budget)
    # the busiest device holds at least the mean, and at least what the stage of the embedding / the head holds
    least = max(
        least_memory(floor_problem(built, degree, flight, budget, h))[1] for h in (None, "pre", "post")
    )
    held = "1 microbatch's" if flight == 1 else f"{flight:g} microbatches'"
    share = (
        f"a 1/{degree} share of the model's parameter state and of {held} activations, the fewest any device "
        "holds, with a layer's gathered weights and recompute working set; and the stage of the embedding or "
        "of the head holds it and a layer"
    )
    if least > budget:
        raise StageMemoryError(
            f"every plan needs at least {format_bytes(least)} on its busiest device ({share}). Fix: raise the "
            f"memory limit to at least {format_bytes(least)} or spread the model over more devices (more "
            "stages or a larger mesh)",
            least,
            True,
        )
    found: list[tuple[Solution, StageSplit]] = []

    def attempt(problem: SearchProblem) -> Solution | None:
        """The plan solved for ``problem`` (None if it has none), kept when a cut of it fits."""
        try:
            solution = solve_at(problem)
        except InfeasibleError:
            return None
        split = split_of(solution)
        if split is not None:
            found.append((solution, split))
        return solution

    top = attempt(floor)
    plan, low = least_memory(surrogate)
    low = _value(surrogate, plan) if plan is not None else low
    high = _value(surrogate, top.choice) if top is not None else low
    fitted = len(found)
    attempt(dataclasses.replace(surrogate, memory_limit=low * (1 + _ABOVE)))
    for _ in range(BISECTIONS if len(found) > fitted else 0):
        if high <= low * (1 + 1e-3):
            break
        mid, fitted = (low + high) / 2, len(found)
        attempt(dataclasses.replace(surrogate, memory_limit=mid))
        low, high = (mid, high) if len(found) > fitted else (low, mid)
    if not found:
        raise StageMemoryError(
            f"no plan found within {format_bytes(budget)} per device, though none is proven to need more: "
            f"the busiest device holds at least {format_bytes(least)} ({share}), and the plans tried (the "
            "floor's optimum, the stage surrogate's least-memory plan) fit no cut. Fix: raise the memory "
            "limit or spread the model over more devices (more stages or a larger mesh)",
            least,
            False,
        )
    return min(found, key=lambda pair: pair[1].step_seconds)


def least_refusal(errors: Sequence[str], floors: Sequence[StageMemoryError | None]) -> InfeasibleError:
    """The search's refusal when no candidate fits: with every candidate refused by its memory floor, the
    least floor (a lower bound on every plan the search may choose) and whose it is; otherwise the last
    candidate's reason."""
    if not errors:
        return InfeasibleError("no pipeline plan fits: no schedule and cut fits the memory")
    if floors and all(f is not None for f in floors):
        k = min(range(len(floors)), key=lambda i: floors[i].floor)  # type: ignore[union-attr]
        return InfeasibleError(f"no pipeline plan fits (of {len(errors)} candidates, the least): {errors[k]}")
    return InfeasibleError(f"no pipeline plan fits: {errors[-1]}")
