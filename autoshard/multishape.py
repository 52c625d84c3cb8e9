"""Several input shapes at once: one parameter layout for a weighted set of (batch, sequence) shapes.

Training on sequence buckets (say 2k, 8k and 32k tokens) runs the same weights on inputs of several shapes;
resharding the weights between steps is not an option, but each shape may lay out its activations its own way.
:func:`plan_shapes` finds the parameter layout and the per-shape activation strategies that minimise the
weighted step time ``sum_i w_i * step_i``.

How: each shape is captured and priced on its own (:func:`autoshard.problem.build.build_problem`); the
problems are merged into one :class:`~autoshard.search.SearchProblem` in which every parameter (and buffer)
is one variable shared by all shapes -- its strategy list depends only on its shape and the mesh, so the lists
agree -- while every other node keeps a variable per shape.  Costs are weighted by ``w_i`` (shared variables
sum their weighted costs), and the exact solver returns the joint optimum.  Each shape's plan is then read
back with the same cost functions as a single-shape plan, so ``weighted_step_time`` equals the solver's
objective.

Memory.  The budget holds per shape (the largest shape's activations decide), which one summed constraint
cannot express, so the joint problem is solved without it and each shape's plan is checked afterwards; when
one does not fit, the whole set is planned again with full activation recomputation (``recompute="auto"``),
and if it still does not fit an :class:`~autoshard.errors.InfeasibleError` says which shape and by how much.

Example::

    shapes = [(0.7, (ids_2k,), {}), (0.3, (ids_8k,), {})]
    multi = autoshard.multishape.plan_shapes(model, cluster, shapes)
    multi.param_placements["model.layers.0.mlp.up_proj.weight"]  # the same for every shape
    multi.plans[1].summary()                                     # the 8k bucket's plan
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from autoshard.capture import Captured, capture
from autoshard.cluster import Cluster
from autoshard.errors import AutoshardError, InfeasibleError
from autoshard.plans import Plan
from autoshard.problem.build import BuiltProblem, build_problem
from autoshard.problem.costs import CostOptions, Recompute
from autoshard.problem.extract import extract_plan
from autoshard.search import Edge, SearchProblem, Solution, evaluate, solve

__all__ = ["MultiShapePlan", "plan_shapes"]

ShapeCase = tuple[float, tuple[Any, ...], Mapping[str, Any]]
"""``(weight, example_args, example_kwargs)`` of one input shape."""


@dataclass(frozen=True)
class MultiShapePlan:
    """One plan per shape, all with the same parameter placements, and their weighted step time."""

    plans: tuple[Plan, ...]
    weights: tuple[float, ...]
    weighted_step_time: float
    seconds: float

    @property
    def param_placements(self) -> dict[str, tuple[str, ...]]:
        return self.plans[0].param_placements

    def summary(self) -> str:
        lines = [
            f"{len(self.plans)} input shapes, one parameter layout: weighted step {self.weighted_step_time:.4g} s"
        ]
        for w, p in zip(self.weights, self.plans, strict=True):
            gib = p.memory_per_device / 2**30
            lines.append(
                f"  weight {w:g}: {_describe(p)}: {p.predicted_step_time:.4g} s/step, {gib:.1f} GiB/device"
            )
        return "\n".join(lines)


def plan_shapes(
    model: torch.nn.Module,
    cluster: Cluster,
    shapes: Sequence[ShapeCase],
    *,
    training: bool = True,
    memory_limit: float | None = None,
    recompute: Literal["auto", "none", "full"] = "auto",
    time_limit: float = 60.0,
) -> MultiShapePlan:
    """The parameter layout and per-shape strategies minimising ``sum_i w_i * step_i`` (module docstring)."""
    start = time.perf_counter()
    if not shapes:
        raise AutoshardError("plan_shapes needs at least one (weight, args, kwargs) shape; got none")
    weights = tuple(float(w) for w, _, _ in shapes)
    if any(not (w > 0 and math.isfinite(w)) for w in weights):
        raise AutoshardError(f"shape weights must be positive and finite, got {weights}: e.g. token shares")
    captures = [capture(model, tuple(args), dict(kwargs)) for _, args, kwargs in shapes]
    limit = float(cluster.device_memory) if memory_limit is None else float(memory_limit)
    policies = [Recompute.NONE, Recompute.FULL] if recompute == "auto" else [Recompute(recompute)]
    if not training:
        policies = [Recompute.NONE]
    over = ""
    for policy in policies:
        opts = CostOptions(training=training, recompute=policy)
        builts = [build_problem(c, cluster, opts) for c in captures]
        merged, maps = _merge(builts, weights)
        solution = solve(merged, time_limit=time_limit)
        plans = tuple(
            _plan_of(model, b, c, tuple(solution.choice[g] for g in m), solution, start)
            for b, c, m in zip(builts, captures, maps, strict=True)
        )
        worst = max(range(len(plans)), key=lambda i: plans[i].memory_per_device)
        if plans[worst].memory_per_device <= limit:
            total = math.fsum(w * p.predicted_step_time for w, p in zip(weights, plans, strict=True))
            return MultiShapePlan(plans, weights, total, time.perf_counter() - start)
        over = (
            f"shape {worst} ({_describe(plans[worst])}) needs {plans[worst].memory_per_device / 2**30:.2f} GiB "
            f"per device with recompute={policy.value}, over the budget of {limit / 2**30:.2f} GiB"
        )
    raise InfeasibleError(
        f"no joint plan of the {len(shapes)} shapes fits: {over}. Fix: raise the memory limit, use a larger "
        "mesh, or plan the largest shape with a memory budget on its own (autoshard.plan)"
    )


def _describe(plan: Plan) -> str:
    return ", ".join(f"{k} {tuple(s)}" for k, (s, _) in plan.input_shapes.items())


def _merge(builts: Sequence[BuiltProblem], weights: Sequence[float]) -> tuple[SearchProblem, list[list[int]]]:
    """One problem over every shape: parameters and buffers shared by FQN, everything else per shape.

    ``maps[i][k]`` is the merged node of node ``k`` of shape ``i``'s problem, for *every* node of it: its
    variables, then its fan-out nodes (``BuiltProblem.fanouts``; ``problem.num_nodes == len(variables) +
    len(fanouts)`` and edges may name them).  A fan-out node prices one tensor of one shape's graph, so it is
    never shared: each shape's fan-out nodes become nodes of their own with their weighted costs, labels and
    annotation masks, and ``[solution.choice[g] for g in maps[i]]`` is shape ``i``'s full choice.
    """
    keys: dict[tuple[Any, ...], int] = {}
    costs: list[np.ndarray] = []
    names: list[str] = []
    labels: list[tuple[str, ...]] = []
    masks: list[np.ndarray | None] = []
    maps: list[list[int]] = []
    for i, (built, w) in enumerate(zip(builts, weights, strict=True)):
        p = built.problem
        gathers = (
            len(built.extras.gathers) if built.extras is not None else 0
        )  # memory nodes (problem/extras)
        gathers += len(built.zero.nodes) if built.zero is not None else 0  # ZeRO-1's (problem/zero_terms)
        if p.num_nodes != len(built.variables) + len(built.fanouts) + gathers:
            raise AutoshardError(
                f"shape {i}: the problem has {p.num_nodes} nodes for {len(built.variables)} variables and "
                f"{len(built.fanouts)} fan-out nodes; expected the variables followed by the fan-out nodes"
            )
        here: list[int] = []
        for k in range(p.num_nodes):
            key: tuple[Any, ...] | None = None  # None: a fan-out node (k >= len(variables)), never shared
            what = p.names[k]
            if k < len(built.variables):
                name = built.variables[k]
                info = built.infos[name]
                key = ("state", info.fqn) if info.kind in ("parameter", "buffer") else (i, name)
                what = info.fqn or name
            found = None if key is None else keys.get(key)
            label = p.strategy_labels[k] if p.strategy_labels is not None else ()
            mask = p.allowed[k] if p.allowed is not None else None
            if found is None:
                found = len(costs)
                if key is not None:
                    keys[key] = found
                costs.append(w * p.node_costs[k])
                names.append(p.names[k] if i == 0 else f"{p.names[k]} [shape {i}]")
                labels.append(label)
                masks.append(mask)
            else:
                if labels[found] != label or costs[found].shape != p.node_costs[k].shape:
                    raise AutoshardError(
                        f"{what} has different strategies in shape {i} than in shape 0: the shapes must run "
                        "the same model with the same parameters (only input sizes may differ)"
                    )
                costs[found] = costs[found] + w * p.node_costs[k]
                if mask is not None:
                    prev = masks[found]
                    masks[found] = mask if prev is None else prev & mask
            here.append(found)
        maps.append(here)
    edges = [
        Edge(m[e.u], m[e.v], w * e.cost)
        for b, w, m in zip(builts, weights, maps, strict=True)
        for e in b.problem.edges
    ]
    # No memory model: the budget holds per shape, which the joint problem cannot express (module docstring);
    # each shape's plan is checked against it after the solve.
    problem = SearchProblem(
        node_costs=tuple(costs),
        edges=tuple(e for e in edges if e.u != e.v),
        names=tuple(names),
        allowed=tuple(masks) if any(m is not None for m in masks) else None,
        strategy_labels=tuple(labels) if all(labels) else None,
    )
    return problem, maps


def _plan_of(
    model: torch.nn.Module,
    built: BuiltProblem,
    captured: Captured,
    choice: tuple[int, ...],
    joint: Solution,
    start: float,
) -> Plan:
    objective = evaluate(built.problem, choice)
    solution = Solution(
        choice=choice,
        objective=objective,
        lower_bound=objective if joint.optimal else -math.inf,
        gap=0.0 if joint.optimal else math.inf,
        optimal=joint.optimal,
        method=f"joint:{joint.method}",
        seconds=joint.seconds,
        log=joint.log,
    )
    out = next(n for n in captured.graph_module.graph.nodes if n.op == "output")
    return extract_plan(
        built,
        solution,
        model=type(model).__name__,
        block_prefix=captured.blocks.prefix if captured.blocks else None,
        output_order=tuple(n.name for n in out.all_input_nodes),
        timings={"total": time.perf_counter() - start},
        notes=("planned jointly with other input shapes: the parameter layout is shared",),
    )
