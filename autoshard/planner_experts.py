"""The op-by-op alternative to fused expert MLPs: proven slower before it is planned, else planned too.

Input: the plan of a capture whose expert MLPs capture fused (:mod:`autoshard.capture.experts`), or the
error planning it raised; a function that captures the model op by op; the planner's solve of one capture
(:func:`autoshard.planner._plan_captured` with the plan's options bound); the cluster and the plan's options
as :func:`autoshard.plan`'s keywords.  Output: the plan with the lower reported step
(:func:`~autoshard.planner_steps.cheaper`, whose note says which capture won), or the fused capture's error
when neither plans.

Fused experts buy cheap expert parallelism but lose the K/N splits inside the experts, so
:func:`autoshard.plan` plans both captures.  Before the op-by-op capture is solved, the floor the mesh search
prunes meshes with (:func:`~autoshard.meshbound.mesh_floor`: one lower-bound problem per recomputation
policy and per range of recomputed blocks, each bounding the reported step of every plan in its part) is
asked whether every op-by-op plan steps at least the fused plan's step (or the caller's ``ceiling``, if
lower); when it proves so, the capture is not solved (:class:`~autoshard.planner_steps.Pruned`: the note
gives the bound).  Otherwise the capture is solved with that step as its ceiling, as before.

Why a floor and not the solve's own ceiling: the solver prunes only where the budget binds (its optimum
without the budget above the ceiling and over the budget); a policy whose optimum without the budget fits
returns that plan however slow, and the recomputation-count search that follows it runs under that plan's
step, not the fused one.  Mixtral-8x7B on 2 x 8 H100s at batch 16 x 4096 (``autoshard search --profile
h100x8 --model mixtral-8x7b --nodes 2 --mesh 2x8 --batch 16``): since ZeRO-1's gathers are priced
(:mod:`autoshard.problem.zero_terms`), op by op under full recomputation fits without the budget (65 of
79 GiB), so the alternative was solved to the end -- 31 solves of its problem, 15 of them the recomputation
count search's, 92 of the plan's 97 CPU s -- to find a 1.72 s plan against the fused 0.87 s; its floor
proves every op-by-op plan at least 1.34 s in 0.6 CPU s (``benchmarks/results/zero_gathers.txt``).

Example::

    result = plan_unfused(fused, recapture, solve_one, cluster, {"training": True}, math.inf)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from autoshard.capture import Captured
from autoshard.cluster import Cluster
from autoshard.errors import AnnotationError, AutoshardError, InfeasibleError
from autoshard.meshbound import mesh_floor, prove_above
from autoshard.planner_steps import Pruned, cheaper
from autoshard.plans import Plan
from autoshard.search import BoundExceeded

__all__ = ["plan_unfused", "proven_slower"]


def proven_slower(
    captured: Captured, cluster: Cluster, options: Mapping[str, Any], ceiling: float
) -> float | None:
    """A proven lower bound, at least ``ceiling``, on the reported step of every plan of ``captured`` under
    ``options`` (:func:`autoshard.plan`'s keywords); None when the floor does not prove it or there is no
    sound floor (:func:`~autoshard.meshbound.mesh_floor` says when)."""
    if not math.isfinite(ceiling):
        return None
    floor = mesh_floor(captured, cluster, options)
    found = prove_above(floor, ceiling) if floor is not None else None
    return None if found is None else found[0]


def plan_unfused(
    fused: Plan | AutoshardError,
    recapture: Callable[[], Captured],
    solve_one: Callable[..., Plan],
    cluster: Cluster,
    options: Mapping[str, Any],
    ceiling: float,
) -> Plan | AutoshardError:
    """The cheaper of ``fused`` and the op-by-op capture's plan (module docstring).  ``solve_one(captured,
    timings, ceiling=)`` plans one capture.  Raises :class:`BoundExceeded` when the fused capture has no plan
    and the op-by-op one cannot beat the caller's ``ceiling`` either."""
    best = min(ceiling, fused.predicted_step_time if isinstance(fused, Plan) else math.inf)
    plain: Plan | AutoshardError | Pruned
    try:
        again = recapture()
        bound = proven_slower(again, cluster, options, best)
        if bound is not None:
            raise BoundExceeded(bound, best)
        plain = solve_one(again, {}, ceiling=best)
    except (InfeasibleError, AnnotationError) as e:
        plain = e
    except BoundExceeded as e:
        if not isinstance(fused, Plan):
            raise  # the caller's own ceiling: neither capture beats it
        plain = Pruned(e.bound)
    return cheaper(fused, plain)
