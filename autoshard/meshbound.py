"""A proven lower bound on the step of every plan a candidate mesh could return, before it is planned.

Input: a capture, one candidate :class:`~autoshard.cluster.Cluster` and the options :func:`autoshard.plan`
would get.  Output: a :class:`MeshFloor` (the relaxations covering every plan the planner could return on
that mesh, and their optima without the budget), and :func:`prove_above`, which proves cheaply, when it can,
that none of those plans reaches a step below a ceiling (the mesh search's best so far).

The plans a mesh can return (:func:`autoshard.planner._plan_captured`): for each recomputation policy in
play, every plan of its problem that fits the budget; with ``recompute="auto"`` also ``k`` of the ``N``
repeated blocks recomputed under selective or full recomputation (:mod:`autoshard.problem.mix`).  The
planner returns the one with the lowest reported step, and every plan's reported step is at least its
problem's lower-bound objective (:func:`~autoshard.planner_rerank.lower_bound_problem`; the planner ranks
by it too).  So the floor is a minimum over *parts*, one per policy, each a lower-bound problem under the
budget whose optimum bounds every plan of that part:

* a uniform policy: its own lower-bound problem, budget, peak and pins kept;
* ``k`` of ``N`` blocks under policy ``p`` for every ``k`` in ``a..N`` (``a``: the least ``k`` whose
  per-node memory floor fits, :func:`~autoshard.problem.mix.least_fitting`; below it nothing fits): the
  problem at share ``k / N`` is affine in the share (:func:`~autoshard.problem.mix.share_problem`), its
  lower-bound terms are ``max(affine, 0)``, so monotone in the share either way, and the elementwise
  minimum of the two ends ``a`` and ``N`` is below every ``k`` between, for costs and memory alike.

Each part is built with the asked ``cp_layout``: ``"auto"`` prices rings balanced, below every sequence
layout the planner's layout search may pick (:mod:`autoshard.planner_layout`), so the part bounds those too.

A part's bound is its optimum without the budget (one exact solve; the first part's is the ordering key,
:attr:`MeshFloor.floor`)
or, where that is below the ceiling, a Lagrangian bound under the budget (``solve(ceiling=)`` stops at the
first multiplier whose dual value reaches it: any ``lambda >= 0`` gives ``min cost + lambda (memory -
budget) <= OPT``).  A part where nothing fits bounds nothing (``inf``).  The floor of a mesh holds for its
every plan whichever policy wins, so a mesh whose floor reaches the best step cannot beat it.

No floor (None) where the planner's plan space is wider or the bound is not sound: pipeline stages, fused
expert MLPs (the op-by-op capture is planned too), ``search="propagate"``, a problem whose lower-bound
problem does not exist (:func:`~autoshard.planner_rerank.unsound_reason`), or an error building it (the
planner then reports it).

Example::

    floor = mesh_floor(captured, cluster, plan_options)
    if floor is not None and prove_above(floor, best_step) is not None: ...  # pruned without planning
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from autoshard.capture import Captured
from autoshard.capture.experts import plan_fuses_experts
from autoshard.cluster import Cluster
from autoshard.errors import AutoshardError, InfeasibleError
from autoshard.planner_rerank import lower_bound_problem, unsound_reason
from autoshard.planner_steps import build
from autoshard.problem.build import BuiltProblem
from autoshard.problem.costs import CostOptions, Recompute, recipe
from autoshard.problem.mix import least_fitting, share_problem
from autoshard.search import BoundExceeded, Edge, SearchProblem, solve
from autoshard.steering import forbidden_kinds

__all__ = ["MeshFloor", "mesh_floor", "prove_above"]

#: plan options the floor understands (with their defaults in :func:`autoshard.plan`); any other makes no floor
_OPTIONS = {
    "annotations": None,
    "training": True,
    "memory_limit": None,
    "recompute": "auto",
    "search": "auto",
    "time_limit": 60.0,
    "blocks": "auto",
    "progress": None,
    "allow": (),
    "forbid": (),
    "cp_layout": "auto",
    "pipeline": None,
    "microbatches": None,
    "schedule": "auto",
    "precision": "bf16",
}


@dataclasses.dataclass(frozen=True, slots=True)
class Part:
    """One part of a mesh's plan space: ``name`` (e.g. ``"selective, 16..32 of 32 blocks"``), the lower-bound
    problem under the budget that relaxes it, and a lower bound on that problem's optimum without the budget
    (its optimum, or the first part's where every term of it is at least the first part's)."""

    name: str
    problem: SearchProblem
    free: float


class MeshFloor:
    """Every plan a mesh could return lies in one of :attr:`parts` (one per recomputation policy in play),
    each built and solved without the budget on first use: a mesh that is planned anyway never pays for
    more than its first part.  :attr:`floor` is the first part's optimum without the budget (policy none,
    or the pinned policy): the key the mesh search orders candidates by."""

    def __init__(
        self, policies: list[Recompute], make: Callable[[Recompute], Part | None], time_limit: float
    ):
        self.policies, self.time_limit = tuple(policies), time_limit
        self._make = make
        self._built: dict[Recompute, Part | None] = {}

    def part(self, policy: Recompute) -> Part | None:
        """The part of ``policy`` (None when it has no sound bound: then the mesh cannot be pruned)."""
        if policy not in self._built:
            try:
                self._built[policy] = self._make(policy)
            except AutoshardError:
                self._built[policy] = None  # the planner raises it again, with its own context
        return self._built[policy]

    @property
    def parts(self) -> tuple[Part | None, ...]:
        return tuple(self.part(p) for p in self.policies)

    @property
    def floor(self) -> float:
        first = self.part(self.policies[0])
        assert first is not None  # mesh_floor checked it
        return first.free


def mesh_floor(captured: Captured, cluster: Cluster, options: Mapping[str, Any]) -> MeshFloor | None:
    """The parts of ``cluster``'s plan space under ``options`` (:func:`autoshard.plan`'s keywords), or None
    when no sound floor is known (module docstring)."""
    opts = {**_OPTIONS, **options}
    if set(options) - set(_OPTIONS) or opts["search"] == "propagate" or _staged(opts):
        return None
    if plan_fuses_experts(captured.op_nodes()):
        return None
    kinds = forbidden_kinds(opts["allow"], opts["forbid"])
    limit = float(cluster.device_memory) if opts["memory_limit"] is None else float(opts["memory_limit"])
    training, recompute = bool(opts["training"]), str(opts["recompute"])

    def pinned(policy: Recompute, share: float = 1.0) -> BuiltProblem:
        costs = CostOptions(  # as the planner prices the capture (planner._plan_captured)
            training=training,
            recompute=policy,
            recompute_share=share,
            cp_layout=opts["cp_layout"],
            precision=recipe(opts["precision"]),
        )
        return build(captured, cluster, costs, opts["annotations"], limit, {}, kinds)[1]

    def make(policy: Recompute) -> Part | None:
        whole = pinned(policy)
        if unsound_reason(whole) is not None:
            return None
        mixed = recompute == "auto" and policy is not Recompute.NONE and whole.num_blocks >= 2
        name, problem = (
            _blocks(pinned(policy, 0.0), whole) if mixed else (policy.value, lower_bound_problem(whole))
        )
        if problem is None:
            return None
        first = found.part(policies[0]) if policy is not policies[0] else None
        if first is not None and _above(problem, first.problem):  # recomputation only added cost here
            return Part(name, problem, first.free)
        return Part(name, problem, _free(problem, opts["search"], opts["time_limit"]))

    policies = list(Recompute) if recompute == "auto" else [Recompute(recompute)]
    policies = policies if training else [Recompute.NONE]
    found = MeshFloor(policies, make, float(opts["time_limit"]))
    return found if found.part(policies[0]) is not None else None


def prove_above(floor: MeshFloor, ceiling: float) -> tuple[float, tuple[str, ...]] | None:
    """``(bound, one line per part)`` when every plan of ``floor`` is proven to step at least ``ceiling``
    (``bound`` >= ``ceiling``: the least of the parts' bounds); None when one part is not (plan the mesh).
    A part stops at its first Lagrangian bound that reaches the ceiling; where nothing fits it bounds nothing."""
    bounds: list[float] = []
    lines: list[str] = []
    fits = False
    for policy in floor.policies:  # none first: the part most likely to hold a plan under the ceiling
        part = floor.part(policy)
        if part is None:
            return None
        if part.free >= ceiling:
            bound, how = part.free, "without the budget"
            fits = True  # unknown: a plan of it may fit; the bound holds either way
        else:
            try:
                found = solve(part.problem, method="exact", time_limit=floor.time_limit, ceiling=ceiling)
            except BoundExceeded as e:
                bound, how, fits = e.bound, "under the budget", True
            except InfeasibleError:
                bound, how = math.inf, "nothing fits"
            except AutoshardError:
                return None
            else:
                if found.lower_bound < ceiling:
                    return None
                bound, how, fits = found.lower_bound, "under the budget", True
        bounds.append(bound)
        lines.append(f"{part.name}: at least {bound:.6g} s ({how})")
    if not fits:
        return None  # no plan anywhere: planning the mesh says why
    return min(bounds), tuple(lines)


def _staged(opts: Mapping[str, Any]) -> bool:
    pins = opts["annotations"] or {}
    stage_pin = any(isinstance(v, str) and v == "stage" for v in pins.values())
    return (
        opts["pipeline"] is not None
        or opts["microbatches"] not in (None, 1)
        or opts["schedule"] != "auto"
        or stage_pin
    )


def _free(problem: SearchProblem, method: str, time_limit: float) -> float:
    """The optimum of ``problem`` without its budget: a lower bound on it under the budget."""
    plain = dataclasses.replace(problem, memory_limit=None, peak=None)
    return solve(plain, method=method, time_limit=time_limit).lower_bound  # type: ignore[arg-type]


def _above(problem: SearchProblem, other: SearchProblem) -> bool:
    """Every node and edge cost of ``problem`` at least ``other``'s, term by term (same shape): then every
    plan costs at least as much, and ``other``'s optimum without the budget bounds ``problem``'s."""
    if problem.sizes != other.sizes or [(e.u, e.v) for e in problem.edges] != [
        (e.u, e.v) for e in other.edges
    ]:
        return False
    pairs = [
        *zip(problem.node_costs, other.node_costs, strict=True),
        *((e.cost, f.cost) for e, f in zip(problem.edges, other.edges, strict=True)),
    ]
    return all(bool(np.all(a >= b)) for a, b in pairs)


def _blocks(zero: BuiltProblem, whole: BuiltProblem) -> tuple[str, SearchProblem | None]:
    """The relaxation of ``k`` of ``N`` blocks recomputed, for every ``k`` from the least that may fit to
    ``N`` (module docstring): the elementwise minimum of the lower-bound problems at both ends."""
    n = whole.num_blocks
    first = least_fitting(zero.problem, whole.problem, n)
    name = f"{whole.options.recompute.value}, {first}..{n} of {n} blocks"
    low, high = lower_bound_problem(share_problem(zero, whole, first)), lower_bound_problem(whole)
    if low is None or high is None or low.memory is None or high.memory is None:
        return name, None
    return name, dataclasses.replace(
        high,
        node_costs=tuple(np.minimum(a, b) for a, b in zip(low.node_costs, high.node_costs, strict=True)),
        edges=tuple(
            Edge(a.u, a.v, np.minimum(a.cost, b.cost)) for a, b in zip(low.edges, high.edges, strict=True)
        ),
        memory=tuple(np.minimum(a, b) for a, b in zip(low.memory, high.memory, strict=True)),
        peak=None
        if high.peak is None or low.peak is None
        else tuple(np.minimum(a, b) for a, b in zip(low.peak, high.peak, strict=True)),
    )
