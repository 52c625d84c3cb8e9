"""A lower bound on a pipelined step from the busiest device's layers, proven by a dual solve of one layer's time.

Input: the :class:`~autoshard.problem.build.BuiltProblem` of one (degree, microbatches, recomputation)
candidate, its stage search problem (memory re-weighted and budgeted as the pipeline search solves it), the
(schedule, chunks per device) pairs the search may pick, and the best step so far.
Output: a lower bound on the step of every plan that fits the stage problem, under any of those schedules
(:func:`step_bound`); the pipeline search names a candidate whose bound reaches the best step, unsolved.

Why it holds.  Let ``ℓ(s)`` be one repeated layer's per-microbatch forward + backward on a device under
plan ``s``, as :func:`~autoshard.pipeline.layers.part_costs` prices it (``StageCosts.layer``): its compute
``f + b`` (recomputation included), the moves it exposes ``E`` (tensor parallel, resharding, a weight's
moves other than gathers), and what prefetch leaves of its weights' gathers ``g`` (forward) and re-gathers
``r`` (backward): ``max(0, g − f) + max(0, r − b)``; each chunk holding layers adds its first gather,
``min(g, f) + min(r, b)`` (``StageCosts.gather_head``).  ``L`` layers over ``p`` devices leave some device
``d`` at least ``K = ceil(L / p)`` layers (interleaving sums a device's chunks) in its ``v`` chunks of one
layer or more, so ``k_d >= K >= v`` and, every other term (``pre``, ``post``, p2p sends) being
non-negative,

    t_d >= k_d (f + b + E) + k_d max(0, g − f) + v min(g, f) + (the same in r, b)
        >= K (f + b + E) + v (g + r)          (k_d max(0, x − y) + v min(x, y) >= v x when k_d >= v)

and ``Σ_d t_d >= L (f + b + E) + p v (g + r)``.  Every schedule's step
(:func:`~autoshard.pipeline.schedules.step_time`, plus the non-negative once-per-step tail) is at least

    zero-bubble (zb_v, interleaved_zb):   m t* + (p − 1) gap / v       >=  m t*
    the others (v chunks per device):     Σ_d t_d / v + (m − 1/v) t*

so, with ``B(s) <= L (f + b + E)`` and ``G(s) <= L (g + r + the weights' other forward moves)``,
``step(s) >= F / L × (B(s) + ρ G(s))``: ``F = m K`` and ``ρ = v / K`` for the zero-bubble schedules,
``F = L / v + (m − 1/v) K`` and ``ρ = (p + m v − 1) / F`` for the others (:func:`schedule_factor`,
:func:`gather_weight`).  ``B`` and ``G`` are the objective of :func:`layer_problem`: ``B``, each layer
node's compute (the same :func:`~autoshard.problem.costs.node_compute` figure, times its copies) plus the
per-microbatch moves of every activation between two layer nodes (forward, backward, and forward again in
the layers backward recomputes); ``G``, every forward move of a layer's weight, once per copy and again in
the copies backward gathers again (recomputation, FSDP's reshard after forward); a tensor read by ``k``
consumers whose move may be shared counts ``1/k`` of each, the least a shared move costs; gradient syncs
(once per step) are left out.  The problem keeps the stage problem's memory, budget, pins and impossible
pairs, so a lower bound ``β`` on its optimum under the budget (the budget's Lagrangian, :func:`_least`)
bounds every plan the stage solve could return, and ``F β / L`` bounds their steps; the least over the
(schedule, v) pairs the search may price is :func:`step_bound`.

Where it pays: LLaMA-3 405B on PP 16 × (8, 16, 8), 16 microbatches, every schedule: full recomputation's
bound is 14.695 s (ZB-V, ρ = 2/8; ~3 s CPU), above selective recomputation's step 14.688 s, so its stage
solve (~10 s CPU) is skipped.  Without ``G`` the bound was 14.419 s: ``B``'s optimum shards every weight
and moves no activations, its gathers unseen (real layer time 0.148 s, 0.113 s in ``B``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from autoshard.pipeline.schedules import Schedule
from autoshard.problem.arrays import edge_matrix
from autoshard.problem.build import BuiltProblem
from autoshard.problem.costs import node_compute
from autoshard.problem.fanout import split_uses
from autoshard.problem.recompute import recompute_blocks, reissued, rerun_share
from autoshard.search import BoundExceeded, Edge, SearchProblem, memory_of, solve

__all__ = ["layer_compute", "layer_problem", "schedule_factor", "step_bound"]

#: Relative slack on the budgeted solve's ceiling: ``F β / L`` and the step sum the same figures in another
#: order (the caller prunes with its own slack).
_ROUNDING = 1e-9

#: Seconds the budget's first multiplier may cost the bound (``λ × limit``): far below any step, it breaks
#: ties towards less memory; then ``λ × limit`` is these shares of the first bound.
_TIE = 1e-6
_GROWTH = (1e-3, 1e-2)


def gather_weight(schedule: Schedule, virtual: int, degree: int, layers: int, microbatches: int) -> float:
    """``r``: the step of every plan on this schedule is at least ``F / L × (B(s) + r G(s))`` (module
    docstring: each of a device's ``v`` chunks exposes its first gather, at least ``min(f, g)``)."""
    most, v, m = math.ceil(layers / degree), virtual, microbatches
    if schedule.zero_bubble:
        return v / most
    return (degree + m * v - 1) / (layers / v + (m - 1.0 / v) * most)


def schedule_factor(schedule: Schedule, virtual: int, degree: int, layers: int, microbatches: int) -> float:
    """``F``: the step of every plan on this schedule is at least ``F`` times one layer's per-microbatch time
    (module docstring)."""
    most = math.ceil(layers / degree)  # the busiest device's layers
    if schedule.zero_bubble:
        return microbatches * most
    return layers / virtual + (microbatches - 1.0 / virtual) * most


def layer_compute(built: BuiltProblem) -> dict[int, np.ndarray]:
    """Per solver variable of a repeated layer's op, its compute (forward + backward, recomputation
    included) under each strategy, times its copies: ``B``'s node costs.  They depend on ``built`` alone, so
    :func:`step_bound` prices them once for every ``gathers`` weight it solves (LLaMA-3 405B's stage:
    ~10k strategies, ~0.3 s CPU each time)."""
    opts, cluster, infos = built.options, built.cluster, built.infos
    costs: dict[int, np.ndarray] = {}
    for i, name in enumerate(built.variables):
        info = infos[name]
        if info.kind == "op" and info.block is not None:
            inputs = tuple(infos[s] for s in info.inputs)
            cost = np.array(
                [sum(node_compute(info, s, cluster, opts, inputs)) for s in built.strategies[name]]
            )
            costs[i] = cost * built.multiplicity[name]
    return costs


def layer_problem(
    built: BuiltProblem,
    problem: SearchProblem,
    gathers: float = 0.0,
    compute: dict[int, np.ndarray] | None = None,
) -> SearchProblem:
    """``problem`` (the stage's, built from ``built``) with ``B(s) + gathers × G(s)`` as its objective: the
    repeated layers' compute and activation moves of one microbatch, summed over the ``L`` layers, and their
    weights' forward moves (module docstring).  Its memory, budget, masks and infinite (impossible) entries
    are ``problem``'s.  ``compute``: :func:`layer_compute` of ``built``, when the caller has it."""
    if compute is None:
        compute = layer_compute(built)
    costs: list[np.ndarray] = []
    for i, base in enumerate(problem.node_costs):
        cost = compute.get(i)
        costs.append(np.where(np.isfinite(base), np.zeros_like(base) if cost is None else cost, np.inf))
    edges = [Edge(e.u, e.v, np.where(np.isfinite(e.cost), 0.0, np.inf)) for e in problem.edges]
    edges = [e for e in edges if not np.all(np.isfinite(e.cost))]  # only what forbids pairs stays
    edges += _activation_edges(built, gathers)
    return dataclasses.replace(problem, node_costs=tuple(costs), edges=tuple(edges))


def _activation_edges(built: BuiltProblem, gathers: float) -> list[Edge]:
    """One microbatch's moves of activations between two layer nodes, every copy: forward and backward, and
    the forward moves backward re-issues in the layers it recomputes (exposed as forward moves are); and,
    times ``gathers``, a layer weight's forward moves (FSDP gathers) with those backward runs again."""
    infos, index, n = built.infos, {v: k for k, v in enumerate(built.variables)}, built.num_blocks
    one = dataclasses.replace(built.options, microbatches=1)  # per microbatch
    again = dataclasses.replace(one, training=False)  # forward moves only
    recomputed = recompute_blocks(one, n)
    sharing = split_uses(built.edges, infos, built.template, n, built.runs)
    # (producer, consumer, output, input position, copies, uses that may share the move)
    uses = [(tu, tv, which, pos, weight, 1) for (tu, tv, which, pos), weight in sharing.single.items()]
    for g in sharing.groups:
        uses += [(g.producer, tv, g.which, pos, g.weight, len(g.entries)) for tv, pos in g.entries]
    edges = []
    for tu, tv, which, pos, copies, sharers in uses:
        producer, consumer = infos[tu], infos[tv]
        if producer.block is None or consumer.block is None or tu == tv:
            continue  # reads into the layers, a copy's own output
        src, dst = built.strategies[tu], built.strategies[tv]
        if producer.kind == "parameter":  # its forward moves (gradient syncs are once a step: left out)
            if gathers > 0.0:
                share = rerun_share(producer, consumer, one)  # backward gathers again (recomputes, reshards)
                if share <= 0.0:
                    rerun = 0
                elif share >= 1.0 or recomputed is None:
                    rerun = copies
                else:  # the first k layers recompute: the fewest of these copies that are among them
                    rerun = max(0, recomputed - (n - copies))
                runs = copies + rerun
                moves = edge_matrix(producer, which, src, dst, pos, again, built.cache)
                edges.append(Edge(index[tu], index[tv], moves * (runs * gathers / sharers)))
            continue
        if producer.kind != "op":
            continue
        moves = edge_matrix(producer, which, src, dst, pos, one, built.cache)
        if reissued(producer, consumer, one):  # copies of layers >= k are not recomputed: the fewest that are
            rerun = copies if recomputed is None else max(0, recomputed - (n - copies))
            moves = moves + edge_matrix(producer, which, src, dst, pos, again, built.cache) * (rerun / copies)
        # a shared move costs at least its dearest use, so at least the mean of its uses
        edges.append(Edge(index[tu], index[tv], moves * (copies / sharers)))
    return edges


def step_bound(
    built: BuiltProblem,
    problem: SearchProblem,
    shapes: Sequence[tuple[Schedule, int]],
    degree: int,
    best_step: float,
    time_limit: float,
    max_factor_size: float,
) -> float:
    """A lower bound on the step of every plan fitting ``problem`` on any of ``shapes`` ((schedule, chunks per
    device) pairs the search may pick): the least over them of ``F / L × β(r)``, ``β(r)`` a lower bound on
    ``B + r G`` over the fitting plans (:func:`_least`); 0 when there is none.  Shapes are taken by
    increasing ``F``; one whose ``F / L × β(0)`` cannot lower the least so far, or already reaches ``best_step``
    (then so does every later shape's), is not solved, and the search stops at the first bound under
    ``best_step`` (then no candidate is pruned)."""
    layers, m = built.num_blocks, built.options.microbatches
    if not shapes or layers < degree:
        return 0.0
    weights = sorted(
        {
            (schedule_factor(s, v, degree, layers, m), gather_weight(s, v, degree, layers, m))
            for s, v in shapes
        }
    )
    found: dict[float, float] = {}
    compute = layer_compute(built)  # the same for every ``r``

    def least(r: float, factor: float) -> float:
        if r not in found:
            ceiling = best_step * layers / factor
            found[r] = _least(built, problem, r, ceiling, time_limit, max_factor_size, compute)
        return found[r]

    plain = least(0.0, weights[0][0])
    bound = math.inf
    for k, (factor, r) in enumerate(weights):
        if factor * plain / layers >= bound:
            continue
        if factor * plain / layers * (1 - _ROUNDING) >= best_step:
            # ``β(0)`` bounds ``B + r G`` too (``G >= 0``): it prunes this shape as the caller prunes (the
            # bound less its rounding at the best step) and every later one (``F`` rises), so ``β(r)``'s
            # solve would change no decision (405B: the full-recompute and refit bounds, one solve each)
            bound = factor * plain / layers
            continue
        bound = min(bound, factor * least(r, factor) / layers)
        if bound < best_step:  # no prune: the rest only by what the plain bound says of them
            return min([bound] + [f * plain / layers for f, _ in weights[k + 1 :]])
    return bound


def _least(
    built: BuiltProblem,
    problem: SearchProblem,
    gathers: float,
    ceiling: float,
    time_limit: float,
    max_factor_size: float,
    compute: dict[int, np.ndarray] | None = None,
) -> float:
    """A lower bound on ``B + gathers × G`` over the plans fitting ``problem`` (``compute``: as
    :func:`layer_problem`'s).

    First without the budget, plus ``λ (memory − limit)`` (the Lagrangian of the budget: at most the
    objective on every fitting plan, so its optimum is a bound) for a few growing ``λ``, each one exact solve
    of a problem with few costly edges; the first ``λ`` is tiny and picks the least memory among ties (the
    parts outside the layers, which ``B`` leaves free).  Once the relaxed optimum fits with its peak, the
    budgeted optimum is within ``λ × (limit − its memory)`` of the bound: done.  Otherwise the budgeted
    solve runs with ``ceiling`` and stops at the first bound that reaches it."""  # fmt: skip
    lower = layer_problem(built, problem, gathers, compute)
    limit = problem.memory_limit
    if limit is None or lower.memory is None:
        return solve(dataclasses.replace(lower, peak=None), method="exact", time_limit=time_limit).lower_bound
    costs = _too_large(lower, limit)
    bound, scales = -math.inf, [_TIE]
    for scale in scales:  # multipliers growing until the relaxed optimum fits
        lam = scale / max(limit, 1.0)  # seconds per byte
        tied = tuple(c + lam * mem for c, mem in zip(costs, lower.memory, strict=True))
        relaxed = dataclasses.replace(lower, node_costs=tied, memory_limit=None, peak=None)
        free = solve(relaxed, method="exact", time_limit=time_limit)
        bound = max(bound, free.lower_bound - lam * limit)
        if bound >= ceiling or memory_of(problem, free.choice) <= limit:
            return bound
        if len(scales) == 1:
            scales += [share * abs(free.lower_bound) for share in _GROWTH]
    try:
        found = solve(
            lower, method="exact", time_limit=time_limit, ceiling=ceiling * (1 + _ROUNDING),
            max_factor_size=max_factor_size,
        )  # fmt: skip
    except BoundExceeded as e:
        return e.bound
    return max(found.lower_bound, bound)


def _too_large(problem: SearchProblem, limit: float) -> list[np.ndarray]:
    """Node costs with ``inf`` on every strategy no fitting plan can pick: its memory (or peak) with every
    other node at its least memory (and the least peak any plan has) is over ``limit``.  Dropping the
    budget drops the peak term, so without this a relaxed plan may hold a temporary larger than the device."""
    assert problem.memory is not None
    least = [float(np.min(m)) for m in problem.memory]
    total = math.fsum(least)
    peaks = problem.peak or ()
    floor = max((float(np.min(p)) for p in peaks), default=0.0)
    costs = []
    for i, (cost, mem) in enumerate(zip(problem.node_costs, problem.memory, strict=True)):
        over = mem + (total - least[i]) + floor > limit
        if i < len(peaks):
            over |= peaks[i] + total > limit
        costs.append(np.where(over, np.inf, cost))
    return costs
