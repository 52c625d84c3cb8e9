"""A saved pipelined plan replayed: its stage problem rebuilt as the pipeline search built it, its step re-priced.

Input: a :class:`~autoshard.plans.Plan` with ``plan.pipeline`` (saved by ``search --pp``) and, for what-if,
a cluster to price it on.  Output: a :class:`Replay` -- the stage's :class:`~autoshard.problem.build.BuiltProblem`
(for ``explain``), the plan's choice on it, and the whole-cluster plan re-assembled from them.

How, step by step as :func:`autoshard.pipeline.search.search_pipeline` did it:

1. the model rebuilt from ``plan.source`` (:func:`model_case`; a plan never runs a model file it names) and
   captured at one microbatch's shapes (``B / m`` samples of the global batch);
2. the stage sub-mesh laid by :func:`autoshard.pipeline.search.layout` over the cluster's outermost axis, and
   the stage problem built on it with ``CostOptions(microbatches=m)``, the plan's recomputation and recipe;
3. the plan's strategy of every graph node (its labels widened with the pipeline axis's ``R``,
   :func:`~autoshard.pipeline.assemble.widen_label`) read back as the solver's choice -- nothing is solved;
4. the stage costs (:func:`~autoshard.pipeline.layers.part_costs`, the hand-off
   :func:`~autoshard.pipeline.schedules.p2p_time`, the tied-weight sum) priced at the plan's own cut, schedule
   and chunks (:func:`~autoshard.pipeline.stages.price_split`), and the plan assembled from them
   (:func:`~autoshard.pipeline.assemble.assemble`): the step, bubble and per-stage memory come from the
   search's own functions, never a second copy of a formula.

Replayed on the plan's own cluster, the step must equal ``plan.predicted_step_time`` (relative 1e-9): when it
does not (another model, other options), :func:`replay` refuses rather than price a different plan.

Example::

    r = replay(load_plan("pp.json"))
    faster = replay(plan, cluster=varied_cluster(plan, {"inter_bandwidth": 2.0}))
    print(r.plan.predicted_step_time, faster.plan.predicted_step_time)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from autoshard.cluster import Cluster
from autoshard.errors import AutoshardError
from autoshard.plans import Plan
from autoshard.problem.build import BuiltProblem

__all__ = ["MATCH", "Replay", "ReplayError", "model_case", "replay", "stage_choice"]

MATCH = 1e-9
"""Relative tolerance between the replayed step on the plan's own cluster and the plan's predicted step."""


class ReplayError(AutoshardError):
    """A pipelined plan whose stage problem cannot be rebuilt as it was planned (the message says why)."""


@dataclass(frozen=True)
class Replay:
    """The stage problem of a pipelined plan and the plan re-assembled on ``cluster``."""

    built: BuiltProblem  # the stage problem on the stage sub-mesh, at one microbatch's shapes
    choice: tuple[int, ...]  # the plan's strategy index of every variable of ``built``
    plan: Plan  # the whole-cluster plan assembled from them (step, bubble, stages, memory)
    microbatch: int  # samples per microbatch
    cluster: Cluster  # the whole cluster it was priced on
    hand_off: float  # seconds of one p2p send between stages (activations or gradients of a microbatch)


def model_case(plan: Plan, spec: str | None = None) -> Any:
    """The :class:`~autoshard.zoo.ModelCase` the plan was made for, from ``plan.source`` (or ``spec``),
    refused in one line when it is not the plan's model (:func:`autoshard.plan_model.check_built`)."""
    from autoshard import zoo
    from autoshard.plan_model import check_built

    source = dict(plan.source)
    name = spec or str(source.get("spec") or "")
    if not name:
        raise AutoshardError(f"the plan does not record its model ({plan.model}): pass --model SPEC")
    if spec is None and name.rpartition(":")[0].endswith(".py"):
        raise AutoshardError(
            f"the plan was made from {name}; a plan never runs code it names: pass --model {name}"
        )
    if name.rpartition(":")[0].endswith(".py"):
        case = zoo.load_spec(name)
    else:
        batch, seq = source.get("batch"), source.get("seq")
        case = zoo.build(
            name, batch=None if batch is None else int(batch), seq=None if seq is None else int(seq)
        )
    check_built(plan, name, case.model, scaled=False)  # before the capture: its class and parameter names
    return case


def stage_choice(plan: Plan, built: BuiltProblem) -> tuple[int, ...]:
    """The index of the plan's strategy for every variable of ``built``: the problem it was solved on (a
    pipelined plan's labels are on the whole mesh, the pipeline axis's ``R`` first: widened to compare)."""
    from autoshard.pipeline.assemble import widen_label

    by_name = {n.name: n.strategy for n in plan.nodes}
    staged = plan.pipeline is not None
    choice = []
    for v in built.variables:
        labels = [widen_label(str(s)) if staged else str(s) for s in built.strategies[v]]
        label = by_name.get(v)
        if label not in labels:
            raise ReplayError(
                f"graph node {v} of the rebuilt {'stage problem' if staged else 'model'} has no decision "
                f"{label!r} in the plan: the model or its inputs differ from the planned ones (pass the --model "
                "it was planned with)"
            )
        choice.append(labels.index(label))
    return tuple(choice)


def replay(plan: Plan, spec: str | None = None, cluster: Cluster | None = None, case: Any = None) -> Replay:
    """The plan's stage problem rebuilt and its step re-priced on ``cluster`` (default: the plan's own,
    where the step must match the plan's: module docstring).  ``case``: the model, when already built."""
    from autoshard.capture import capture
    from autoshard.capture.blocks import find_repeated_blocks
    from autoshard.capture.experts import plan_fuses_experts
    from autoshard.codegen.parallelize import plan_cluster
    from autoshard.pipeline.assemble import assemble
    from autoshard.pipeline.layers import boundary_bytes, part_costs
    from autoshard.pipeline.schedules import Schedule, p2p_time, tied_sync_time
    from autoshard.pipeline.search import Candidate, layout, microbatch_args
    from autoshard.pipeline.stages import price_split
    from autoshard.planner_steps import batch_size, output_order
    from autoshard.problem.build import build_problem
    from autoshard.problem.costs import CostOptions, Recompute, recipe
    from autoshard.problem.extract import extract_plan
    from autoshard.search import Solution

    pipe = plan.pipeline
    if pipe is None:
        raise ReplayError(f"plan of {plan.model} has no pipeline stages: nothing to replay")
    own = plan_cluster(plan)
    whole = own if cluster is None else cluster
    case = case if case is not None else model_case(plan, spec)
    args, kwargs = tuple(case.args), dict(case.kwargs)
    batch, m = batch_size(args, kwargs), plan.microbatches
    size = batch // m
    repeated = find_repeated_blocks(case.model)
    prefix, first = (repeated.prefix, repeated.first) if repeated else (None, 0)
    a, k = microbatch_args(args, kwargs, batch, size)
    captured = capture(case.model, a, k, blocks="auto", fuse_experts=plan_fuses_experts(plan.nodes))
    where = layout(whole, pipe.degree)
    opts = CostOptions(
        training=plan.training,
        recompute=Recompute(plan.recompute),
        microbatches=m,
        cp_layout="auto",  # as planner._plan_pipelined builds every stage (the layout is read on the winner)
        precision=recipe(plan.precision),
    )
    built = build_problem(captured, where.sub, opts, memory_limit=None)
    choice = stage_choice(plan, built)
    solution = Solution(built.full_choice(choice), math.nan, math.nan, math.nan, False, "replay", 0.0)
    costs = part_costs(built, solution)
    hop = p2p_time(boundary_bytes(built, solution), where.p2p_bandwidth, where.p2p_latency)
    tied = tied_sync_time(costs.tied_bytes, where.p2p_bandwidth, where.p2p_latency)
    costs = dataclasses.replace(costs, p2p_seconds=hop, tied_sync=tied)
    bounds = _bounds(plan, first)
    schedule = Schedule(pipe.schedule)
    split = price_split(costs, bounds, schedule, pipe.degree, pipe.virtual_stages, m)
    candidate = Candidate(
        split.step_seconds, where, m, built, solution, captured, split, Recompute(plan.recompute)
    )
    intra = extract_plan(
        built, solution, model=plan.model, block_prefix=prefix, block_first=first,
        output_order=output_order(captured), timings={},
    )  # fmt: skip
    record = {**plan.cluster, **_record(whole)}
    again = assemble(candidate, intra, prefix, record, first=first)
    again = dataclasses.replace(again, memory_limit=plan.memory_limit, precision=plan.precision)
    if cluster is None:
        _check_match(plan, again)
    return Replay(built, choice, again, size, whole, hop)


def _bounds(plan: Plan, first: int) -> tuple[int, ...]:
    """The stage DP's cut (``StageSplit.bounds``, counted from the repeated run's first layer)."""
    assert plan.pipeline is not None
    stages = plan.pipeline.stages
    if any(s.layers is None for s in stages):
        raise ReplayError(f"plan of {plan.model}: a pipeline stage records no layers; re-plan it")
    starts = [s.layers[0] - first for s in stages if s.layers is not None]
    return (*starts, stages[-1].layers[1] - first)  # type: ignore[index]


def _record(cluster: Cluster) -> Mapping[str, Any]:
    return {"nodes": cluster.nodes, "devices": cluster.num_devices, "description": cluster.describe()}


def _check_match(plan: Plan, again: Plan) -> None:
    want, got = plan.predicted_step_time, again.predicted_step_time
    if abs(got - want) > MATCH * max(abs(want), 1e-30):
        raise ReplayError(
            f"plan of {plan.model}: its stage problem rebuilt here prices the step at {got:.9g} s, the plan "
            f"says {want:.9g} s: it was planned with other options or another model (pass --model); re-plan it"
        )
