"""Why a plan chose a strategy for a graph node, and not the runner-up: the cost terms side by side.

Input: a :class:`~autoshard.plans.Plan` and the :class:`~autoshard.problem.build.BuiltProblem` of the same
model on the same cluster (:func:`rebuild` makes it from the plan's ``source``).  Output: one
:class:`Explanation` per graph node asked about.

How: every other graph node keeps the plan's strategy; for the node explained, each of its strategies is
priced in the solver's own terms -- its node cost (compute forward + backward and optimizer, for every
repeated layer it stands for), the redistribution on the edges from its producers and to its consumers
(forward + backward), and memory per device.  The chosen strategy is the cheapest of these local totals when
the plan is optimal; the runner-up is the next cheapest.  (A strategy change that pays off only together with
a neighbour's change does not show here: that is a different plan, compare two with ``autoshard diff``.)

Example::

    built = rebuild(plan)
    for e in explain(plan, built, "fc1"):
        print(render(e))
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass

import numpy as np

from autoshard.errors import AutoshardError
from autoshard.plans import Plan
from autoshard.problem.build import BuiltProblem
from autoshard.report.labels import fmt_bytes, fmt_seconds

__all__ = ["Explanation", "Terms", "explain", "rebuild", "render", "render_summary"]


@dataclass(frozen=True, slots=True)
class Terms:
    """One strategy of one graph node, priced with every neighbour at the plan's choice."""

    strategy: str
    node: float  # compute forward + backward + optimizer (all repeated copies), seconds
    edges_in: float  # redistribution of its inputs (forward + backward), seconds
    edges_out: float  # redistribution of its output to its consumers, seconds
    memory: float  # bytes per device

    @property
    def total(self) -> float:
        return self.node + self.edges_in + self.edges_out


@dataclass(frozen=True, slots=True)
class Explanation:
    name: str  # graph node
    module: str
    target: str
    count: int  # graph nodes of the full model sharing the decision
    chosen: Terms
    runner_up: Terms | None  # None: the node has one strategy
    options: int  # strategies the node had
    stages: tuple[int, ...] = ()  # pipelined plans: the stages (chunks) that run this decision
    forbidden: int = 0  # strategies the plan's allow/forbid ruled out (Plan.pinned): never the runner-up
    pins: tuple[str, ...] = ()  # those pins: "no dp", "no fsdp", ...


def rebuild(plan: Plan, spec: str | None = None) -> BuiltProblem:
    """The search problem the plan was solved on: its model rebuilt from ``plan.source`` (or ``spec``, a zoo
    name; model files are never run from a plan), captured and priced on the plan's cluster.  A pipelined
    plan's is its stage problem, as the pipeline search built it (:mod:`autoshard.pipeline_replay`: the stage
    sub-mesh, one microbatch's shapes; refused when it does not price the plan's step)."""
    from autoshard.capture import capture
    from autoshard.capture.experts import plan_fuses_experts
    from autoshard.codegen.parallelize import plan_cluster
    from autoshard.problem.build import build_problem
    from autoshard.problem.costs import CostOptions, Recompute, recipe

    if plan.pipeline is not None:  # the stage problem the pipeline search solved (its sub-mesh, microbatch)
        from autoshard.pipeline_replay import replay

        return replay(plan, spec).built
    from autoshard.pipeline_replay import model_case

    case = model_case(plan, spec)  # checks the built model's class and parameter names (plan_model)
    fuse = plan_fuses_experts(plan.nodes)  # the graph the plan was made on
    captured = capture(case.model, case.args, dict(case.kwargs), blocks="auto", fuse_experts=fuse)
    layers = (
        captured.blocks.num_blocks if captured.blocks else 1
    )  # Plan.recompute on recompute_blocks of them
    share = min(1.0, plan.recompute_blocks / layers) if plan.recompute_blocks else 1.0
    opts = CostOptions(
        training=plan.training,
        recompute=Recompute(plan.recompute),
        recompute_share=share,
        precision=recipe(plan.precision),  # priced under the plan's own recipe (an amp plan's bytes)
    )
    return build_problem(captured, plan_cluster(plan), opts)


def _choices(plan: Plan, built: BuiltProblem) -> list[int]:
    from autoshard.pipeline_replay import stage_choice

    return list(stage_choice(plan, built))


def _terms(built: BuiltProblem, i: int, choice: list[int], widen: bool = False) -> list[Terms]:
    """Each strategy of variable ``i`` priced with every other variable at the plan's choice.  Fan-out nodes
    (one shared redistribution per tensor, indices past the variables) take the state the choice then needs
    (``BuiltProblem.full_choice``), and the edges out of those fed by ``i`` count as its output's."""
    p = built.problem
    n = len(p.node_costs[i])
    into, out = np.zeros(n), np.zeros(n)
    first_fan = len(built.variables)
    fed = {e.v for e in p.edges if e.u == i and e.v >= first_fan}  # fan-out nodes carrying i's output
    for s in range(n):
        full = built.full_choice([s if k == i else c for k, c in enumerate(choice)])
        for e in p.edges:
            if e.v == i:
                into[s] += e.cost[full[e.u], s]
            elif e.u == i or e.u in fed:
                out[s] += e.cost[full[e.u], full[e.v]]
    memory = p.memory[i] if p.memory is not None else np.zeros(n)
    labels = (
        p.strategy_labels[i] if p.strategy_labels else tuple(map(str, built.strategies[built.variables[i]]))
    )
    if widen:  # a pipelined plan's labels are on the whole mesh, the pipeline axis first
        from autoshard.pipeline.assemble import widen_label

        labels = tuple(widen_label(str(s)) for s in built.strategies[built.variables[i]])
    return [
        Terms(labels[s], float(p.node_costs[i][s]), float(into[s]), float(out[s]), float(memory[s]))
        for s in range(len(labels))
    ]


def explain(
    plan: Plan, built: BuiltProblem, node: str | None = None, top: int = 10, stage: int | None = None
) -> list[Explanation]:
    """Explanations for the graph nodes named ``node`` (a graph node name, a module path or a glob over
    either), else for the ``top`` costliest computing nodes.  A pipelined plan's ``built`` is its stage
    problem (:func:`rebuild`); ``stage`` keeps the nodes that stage (chunk) runs."""
    choice = _choices(plan, built)
    held = _stages_of(plan, built)
    if stage is not None:
        count = len(plan.pipeline.stages) if plan.pipeline is not None else 0
        if not count:
            raise AutoshardError(
                f"--stage {stage}: the plan of {plan.model} has no pipeline stages; drop --stage"
            )
        if not 0 <= stage < count:
            raise AutoshardError(f"--stage {stage}: the plan has stages 0..{count - 1}")

    def wanted(v: str) -> bool:
        info = built.infos[v]
        if stage is not None and stage not in held.get(v, ()):
            return False
        if node is None:
            return info.kind == "op"
        return any(fnmatch.fnmatchcase(t, node) for t in (v, info.module, info.fqn) if t)

    picked = [i for i, v in enumerate(built.variables) if wanted(v)]
    if node is not None and not picked:
        where = "" if stage is None else f" in stage {stage}"
        raise AutoshardError(
            f"--node {node}: no graph node or module of the plan matches{where}; try a module path"
        )
    pins = tuple(p for p in plan.pinned if p.startswith("no "))
    kinds = frozenset(p.removeprefix("no ") for p in pins)
    pinned = _pinned(built, kinds)
    out = []
    for i in picked:
        widen = plan.pipeline is not None
        terms = _terms(pinned, i, choice, widen=widen)
        free = _terms(built, i, choice, widen=widen) if pinned is not built else terms
        mask = pinned.problem.allowed[i] if pinned.problem.allowed else None
        ruled = {  # masked by a forbidden kind, or (no fsdp) priced inf only by the forbidden weight gathers
            k for k in range(len(terms))
            if k != choice[i] and ((mask is not None and not mask[k])
                                   or (math.isfinite(free[k].total) and not math.isfinite(terms[k].total)))
        }  # fmt: skip
        others = sorted(
            (t for k, t in enumerate(terms) if k != choice[i] and k not in ruled and math.isfinite(t.total)),
            key=_key,
        )
        v = built.variables[i]
        info = built.infos[v]
        out.append(
            Explanation(v, info.fqn or info.module, info.target, built.multiplicity[v], terms[choice[i]],
                        others[0] if others else None, len(terms), held.get(v, ()), len(ruled),
                        pins if ruled else ())
        )  # fmt: skip
    if node is None:
        out = sorted(out, key=lambda e: -e.chosen.total)[:top]
    return out


def _pinned(built: BuiltProblem, kinds: frozenset[str]) -> BuiltProblem:
    """``built`` under the plan's forbidden kinds, as the planner pinned it (masks; no fsdp: weight gathers
    priced ``inf``), so that a runner-up is a strategy the plan could have chosen."""
    if not kinds:
        return built
    from autoshard.annotations import pin_problem

    return pin_problem(built, None, kinds)


def _stages_of(plan: Plan, built: BuiltProblem) -> dict[str, tuple[int, ...]]:
    """Pipelined plans: the stages (chunks) running each variable's decision -- the first chunk the part
    before the layers, the last the part after, every chunk the layers (one decision for all of them)."""
    if plan.pipeline is None:
        return {}
    from autoshard.pipeline.layers import part_names

    chunks = tuple(s.index for s in plan.pipeline.stages)
    ends = {"pre": chunks[:1], "post": chunks[-1:], "layer": chunks}
    parts = part_names(built)
    readers: dict[str, set[int]] = {}  # a graph input is held where it is read (a head weight: the last)
    for use in built.edges:
        readers.setdefault(built.template[use.producer], set()).update(ends[parts[use.consumer]])
    held = {v: ends[parts[v]] for v in built.variables}
    for v in built.variables:
        if built.infos[v].kind != "op" and built.infos[v].block is None and v in readers:
            held[v] = tuple(sorted(readers[v]))
    return held


def _key(t: Terms) -> tuple[float, float]:
    return (t.total, t.memory)


def render(e: Explanation) -> str:
    """The chosen strategy beside the runner-up, term by term."""
    head = f"graph node {e.name} ({e.target}) in {e.module or 'the model'}"
    if e.count > 1:
        head += f", x{e.count} repeated layers"
    lines = [head]
    if e.stages:
        which = f"stage {e.stages[0]}" if len(e.stages) == 1 else f"stages {e.stages[0]}..{e.stages[-1]}"
        lines.append(f"  run by {which} (one decision, priced in the stage problem)")
    ruled = f" ({e.forbidden} ruled out by the plan's {_steer(e.pins)})" if e.forbidden else ""
    lines.append(f"  {e.options} strategies{ruled}; chosen {e.chosen.strategy}")
    if e.runner_up is None:
        return "\n".join([*lines, f"  no other strategy {'the plan allows ' if ruled else ''}fits this node"])
    a, b = e.chosen, e.runner_up
    lines.append(f"  runner-up {b.strategy}")
    lines.append(f"  {'term':<28}{'chosen':>12}{'runner-up':>12}{'difference':>12}")
    rows = (("compute + optimizer", a.node, b.node), ("redistribution of inputs", a.edges_in, b.edges_in),
            ("redistribution of output", a.edges_out, b.edges_out), ("total", a.total, b.total))  # fmt: skip
    for name, x, y in rows:
        lines.append(
            f"  {name:<28}{fmt_seconds(x):>12}{fmt_seconds(y):>12}{_signed(y - x, fmt_seconds, max(x, y)):>12}"
        )
    lines.append(
        f"  {'memory per device':<28}{fmt_bytes(a.memory):>12}{fmt_bytes(b.memory):>12}"
        f"{_signed(b.memory - a.memory, fmt_bytes, max(a.memory, b.memory)):>12}"
    )
    lines.append(f"  why: {_why(a, b)}")
    return "\n".join(lines)


def _steer(pins: tuple[str, ...]) -> str:
    """``("no cp", "no dp", ...)`` as the user asked for it: ``allow tp`` or ``forbid dp, fsdp``."""
    from autoshard.steering import KINDS

    forbidden = [p.removeprefix("no ") for p in pins]
    allowed = [k for k in KINDS if k not in forbidden]
    return (
        f"allow {', '.join(allowed)}" if len(allowed) < len(forbidden) else f"forbid {', '.join(forbidden)}"
    )


def _signed(x: float, fmt: object, scale: float = 1.0) -> str:
    assert callable(fmt)
    if abs(x) <= 1e-6 * max(scale, 1e-12):  # float noise of equal costs
        return "="
    return ("+" if x > 0 else "-") + str(fmt(abs(x)))


def _why(a: Terms, b: Terms) -> str:
    if b.total > a.total:
        terms = {"compute": b.node - a.node, "input redistribution": b.edges_in - a.edges_in}
        terms["output redistribution"] = b.edges_out - a.edges_out
        worst = max(terms, key=lambda k: terms[k])
        return f"the runner-up costs {fmt_seconds(b.total - a.total)} more, mostly in {worst}"
    if b.total < a.total:
        return (
            f"the runner-up would be {fmt_seconds(a.total - b.total)} cheaper here: the choice is pinned (an "
            "annotation, allow/forbid, the memory budget), pays off only with its neighbours' choices, or the "
            "plan was ranked by its critical-path step over the linear optimum"
        )
    if b.memory > a.memory:
        return "same time; the runner-up needs more memory"
    return "a tie: the solver kept the first strategy of equal cost"


def render_summary(explanations: list[Explanation]) -> str:
    """One line per graph node: chosen, runner-up and what choosing it would cost."""
    lines = [f"{'graph node':<28}{'module':<34}{'chosen':>10}  runner-up (extra time)"]
    for e in explanations:
        extra = f"+{fmt_seconds(e.runner_up.total - e.chosen.total)}" if e.runner_up else "none"
        other = e.runner_up.strategy if e.runner_up else "-"
        name = e.name if len(e.name) < 28 else e.name[:26] + "…"
        lines.append(f"{name:<28}{e.module[:33]:<34}{fmt_seconds(e.chosen.total):>10}  {e.chosen.strategy}")
        lines.append(f"{'':<72}vs {other} ({extra})")
    return "\n".join(lines)
