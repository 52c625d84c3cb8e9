"""What-if: a plan's step time as a sympy expression, and where another plan overtakes it.

Input: saved :class:`~autoshard.plans.Plan` records.  Output: :class:`PlanCost` (the expression) and
:class:`Crossover` records (the value of one variable where two plans cost the same, and which one wins on
each side).  Nothing is re-planned: every plan keeps its strategies; what changes is the size of the work
they are applied to.

Symbols: ``batch`` (global batch ``B``), ``seq`` (sequence length ``S``), ``devices`` (``D``, for plans on
a mesh with one axis of size > 1; refused for others, where which axis grows is not defined) and
``bandwidth`` (``W``, link bandwidth as a multiple of the profile's).  The plan was priced at
``B0, S0, D0, W = 1``; each priced term of the plan is scaled to first order:

================================  ==============================================================
term (from the plan)              scaled by
================================  ==============================================================
compute of a node fed by the      ``(B/B0) (S/S0)`` -- ``(S/S0)^2`` for attention
user inputs (an activation op)    (``scaled_dot_product_attention``, flash/efficient attention);
                                  ``D0/D`` when its strategy splits it (a ``S(..)`` or ``P`` in it)
compute of any other node         1 (parameters and their optimizer step)
(parameters, optimizer)           ``D0/D`` when split
collective: latency part          ``(D-1)/(D0-1)`` ring steps
(its time at 1 byte)
collective: bandwidth part        ``(B/B0)(S/S0)`` when it moves an activation (1 for a parameter or
(the rest)                        its gradient), ``((D-1)/D) / ((D0-1)/D0)`` and ``1/W``
================================  ==============================================================

The step is the sum of these terms minus what overlap hid in the plan (``compute + communication -
predicted step``), held constant.
That is the roofline and alpha-beta model of ``cost_models`` read at first order: launch floors, the
efficiency ramp, the bus-bandwidth curve and the overlap are not re-applied away from the planned size, so
figures far from ``B0, S0`` are extrapolations of the priced plan, not re-priced plans.
A plan cannot run everywhere: each point is held to the rules ``search`` plans under (the batch reaching the
plan's batch split, the sequence its sequence split, the memory, scaled as above, its budget;
:mod:`autoshard.whatif_limits`).  :attr:`PlanCost.limits` holds them, :meth:`PlanCost.why_not` says why a
point fails (``"batch 4 < DP 8"``, ``"does not fit: 3.2 GiB over"``) and :meth:`PlanCost.spans` where the
plan runs.  :func:`crossovers` solves ``cost_a = cost_b`` exactly (``sympy.solve``) for the varied symbol,
the others held at the reference, and keeps the roots where both plans run; where two plans do not cross,
:func:`lead` says which is faster and by how much (the CLI asks it over the spans where both run).

A pipelined plan (``plan.pipeline``) is refused here: its step is a schedule over stages, re-priced at one
point by :mod:`autoshard.whatif_pipeline` instead (``whatif --set``).

Example::

    dp, tp = plan_cost(load_plan("dp.json"), "dp"), plan_cost(load_plan("tp.json"), "tp")
    for c in crossovers(dp, [tp], "batch", 1, 1024):
        print(c)  # between batch 37 and 38: tp faster at 37 and below, dp faster at 38 and above ...
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import sympy

from autoshard.errors import AutoshardError
from autoshard.plans import Plan
from autoshard.whatif_limits import Limit, describe, feasible_spans, plan_limits

__all__ = [
    "INTEGER_SYMBOLS",
    "SYMBOLS",
    "Crossover",
    "Lead",
    "PlanCost",
    "WhatIfError",
    "check_same_model",
    "check_varies",
    "common",
    "crossovers",
    "lead",
    "plan_cost",
]

Variable = Literal["batch", "seq", "devices", "bandwidth"]
SYMBOLS: dict[str, sympy.Symbol] = {
    name: sympy.Symbol(name, positive=True) for name in ("batch", "seq", "devices", "bandwidth")
}
_ATTENTION = ("scaled_dot_product", "flash_attention", "efficient_attention", "cudnn_attention")


class WhatIfError(AutoshardError):
    """A what-if that cannot be answered from these plans (the message says which and why)."""


@dataclass(frozen=True)
class PlanCost:
    """A plan's step time as ``expr`` in :data:`SYMBOLS`, and the point it was priced at."""

    name: str
    expr: sympy.Expr
    reference: dict[str, float]
    mesh: tuple[int, ...] = ()  # the plan's mesh: ``devices`` scales it only with one axis of size > 1
    limits: tuple[Limit, ...] = ()  # where the plan can run at all (:mod:`autoshard.whatif_limits`)

    def at(self, **values: float) -> float:
        """Seconds at ``values`` (the reference for any symbol not given)."""
        point = {**self.reference, **values}
        return float(self.expr.subs({SYMBOLS[k]: v for k, v in point.items()}))

    def why_not(self, **values: float) -> str | None:
        """Why the plan cannot run at ``values`` (``"batch 4 < DP 8"``), or ``None`` where it can."""
        return describe(self.limits, {**self.reference, **values})

    def spans(self, variable: str, lo: float, hi: float) -> list[tuple[float, float]]:
        """The intervals of ``variable`` in ``[lo, hi]`` where the plan can run (others at the reference)."""
        return feasible_spans(self.limits, self.reference, variable, lo, hi)


@dataclass(frozen=True)
class Crossover:
    """Where plans ``a`` and ``b`` cost the same as ``variable`` varies."""

    variable: str
    value: float
    seconds: float
    below: str  # the faster plan just below ``value``
    above: str  # the faster plan just above

    def __str__(self) -> str:
        both = f"(both {self.seconds * 1e3:.4g} ms)"
        whole = round(self.value)
        if self.variable not in INTEGER_SYMBOLS or abs(self.value - whole) < _WHOLE_TOLERANCE:
            value = f"{whole}" if self.variable in INTEGER_SYMBOLS else f"{self.value:.6g}"
            return f"{self.variable} = {value}: {self.below} faster below, {self.above} faster above {both}"
        low = math.floor(self.value)  # a batch of 17.5 does not exist: name the two whole values around it
        return (
            f"between {self.variable} {low} and {low + 1}: {self.below} faster at {low} and below, "
            f"{self.above} faster at {low + 1} and above (both about {self.seconds * 1e3:.4g} ms)"
        )


INTEGER_SYMBOLS = frozenset({"batch", "seq", "devices"})
"""Symbols that only take whole values (a crossover between two is named by both; a gap by its values)."""

_WHOLE_TOLERANCE = 1e-9  # a root this near an integer is that integer (sympy's roots come back as floats)


def _reference(plan: Plan) -> dict[str, float]:
    shapes = [shape for shape, _ in plan.input_shapes.values()]
    if not shapes or not shapes[0]:
        raise WhatIfError(
            f"plan of {plan.model} records no input shape: batch and sequence are unknown; re-plan"
        )
    shape = shapes[0]
    return {
        "batch": float(shape[0]),
        "seq": float(shape[1]) if len(shape) > 1 else 1.0,
        "devices": float(plan.num_devices),
        "bandwidth": 1.0,
    }


def _activations(plan: Plan) -> set[str]:
    """Nodes whose value depends on a user input (forward reachability over ``NodePlan.inputs``)."""
    reached = set(plan.input_placements) | set(plan.input_shapes)
    for node in plan.nodes:  # plan.nodes is in graph order: inputs come before their users
        if any(i in reached for i in node.inputs):
            reached.add(node.name)
    return reached


def _split(strategy: str) -> bool:
    return "S(" in strategy or "P" in strategy


def plan_cost(plan: Plan, name: str | None = None) -> PlanCost:
    """The step time of ``plan`` as a sympy expression (module docstring)."""
    from autoshard.codegen.parallelize import plan_cluster  # the cluster the plan was priced on

    if plan.pipeline is not None:  # its step is a stage schedule with a bubble, not the sum over nodes
        raise WhatIfError(
            f"plan of {plan.model} is pipelined ({len(plan.pipeline.stages)} stages, "
            f"{plan.pipeline.schedule}): whatif cannot vary a pipelined step over a range (its time is a stage "
            "schedule with a bubble, not the node sum whatif scales); re-price it at one point with "
            "autoshard whatif PLAN.json --set inter_bandwidth=2 (or bandwidth, intra_bandwidth, memory=GiB)"
        )
    ref = _reference(plan)
    b, s, d, w = (SYMBOLS[k] for k in ("batch", "seq", "devices", "bandwidth"))
    tokens = (b / ref["batch"]) * (s / ref["seq"])
    one_axis = sum(1 for n in plan.mesh_shape if n > 1) <= 1
    d0 = ref["devices"]
    shrink = d0 / d if one_axis else sympy.Integer(1)
    act = _activations(plan)
    terms: list[sympy.Expr] = []
    memory: list[sympy.Expr] = []
    for node in plan.nodes:
        scale: sympy.Expr = sympy.Integer(1)
        held = shrink if _split(node.strategy) else sympy.Integer(1)
        if node.name in act:
            attention = any(a in node.target for a in _ATTENTION)
            scale = tokens * (s / ref["seq"] if attention else 1)
        terms.append(sympy.Float(node.compute_seconds) * scale * held)
        memory.append(sympy.Float(node.memory_bytes) * (tokens if node.name in act else 1) * held)
    for what, nbytes in plan.memory_breakdown.items():  # the largest temporary grows with the work
        memory.append(sympy.Float(nbytes) * (tokens if what == "largest temporary" else 1))
    cluster = plan_cluster(plan)
    ring_lat = (d - 1) / (d0 - 1) if one_axis and d0 > 1 else sympy.Integer(1)
    ring_bw = ((d - 1) / d) / ((d0 - 1) / d0) if one_axis and d0 > 1 else sympy.Integer(1)
    for c in (*plan.collectives, *plan.optimizer_gathers):  # ZeRO-1's gathers: in communication_time too
        latency = min(c.seconds, cluster.collective_time(c.kind, 1, axis=c.mesh_axis))
        moved = tokens if c.tensor in act else sympy.Integer(1)
        terms.append(sympy.Float(latency) * ring_lat + sympy.Float(c.seconds - latency) * moved * ring_bw / w)
    # the plan's step is a critical path (autoshard.problem.step): what overlap hid is kept constant
    hidden = plan.compute_time + plan.communication_time - plan.predicted_step_time
    expr = sympy.Add(*terms) - sympy.Float(max(hidden, 0.0))
    limits = plan_limits(plan, sympy.Add(*memory), d / d0 if one_axis else sympy.Integer(1))
    return PlanCost(name or plan.model, expr, ref, tuple(plan.mesh_shape), tuple(limits))


def crossovers(
    base: PlanCost, others: Sequence[PlanCost], variable: str, lo: float, hi: float
) -> list[Crossover]:
    """Every value of ``variable`` in ``[lo, hi]`` where ``base`` and one of ``others`` cost the same, both
    able to run there (:attr:`PlanCost.limits`)."""
    if variable not in SYMBOLS:
        raise WhatIfError(f"cannot vary {variable!r}: choose one of {', '.join(SYMBOLS)}")
    if not (0 < lo < hi):
        raise WhatIfError(f"range {lo}..{hi} for {variable}: give 0 < low < high, e.g. {variable}=1..1024")
    for cost in (base, *others):
        check_varies(cost, variable)
    x = SYMBOLS[variable]
    found: list[Crossover] = []
    for other in others:
        fixed = {SYMBOLS[k]: v for k, v in base.reference.items() if k != variable}
        diff = sympy.simplify((base.expr - other.expr).subs(fixed))
        if diff.free_symbols - {x}:
            raise WhatIfError(
                f"{other.name}: plans priced at different points cannot be compared; re-plan both"
            )
        both = common(base.spans(variable, lo, hi), other.spans(variable, lo, hi))
        for root in _real_roots(diff, x, lo, hi):
            if not any(a <= root <= b for a, b in both):
                continue  # one of the two cannot run there: no crossover to speak of
            seconds = float(base.expr.subs(fixed).subs(x, root))
            below, above = _winners(diff, x, root)
            names = {True: base.name, False: other.name}
            found.append(Crossover(variable, root, seconds, names[below], names[above]))
    return sorted(found, key=lambda c: c.value)


def common(a: Sequence[tuple[float, float]], b: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """The intersection of two sorted lists of intervals."""
    return [(max(x0, y0), min(x1, y1)) for x0, x1 in a for y0, y1 in b if max(x0, y0) <= min(x1, y1)]


@dataclass(frozen=True)
class Lead:
    """Plan ``faster`` beats ``slower`` over the whole range, by ``low``–``high`` (fractions of the faster
    one's time: ``slower / faster - 1``)."""

    variable: str
    lo: float
    hi: float
    faster: str
    slower: str
    low: float
    high: float

    def __str__(self) -> str:
        span = f"{self.variable} {self.lo:g}..{self.hi:g}"
        if self.high < 5e-4:
            return f"{self.faster} and {self.slower} take the same time throughout {span} (within 0.05%)"
        by = f"{self.low:.1%}" if self.high - self.low < 5e-4 else f"{self.low:.1%}–{self.high:.1%}"
        return f"{self.faster} is faster than {self.slower} throughout {span}, by {by}"


LEAD_SAMPLES = 257  # points, evenly spaced in log(variable), where the margin of a lead is read


def lead(base: PlanCost, other: PlanCost, variable: str, lo: float, hi: float) -> Lead:
    """Who is faster over ``[lo, hi]`` and by how much, for two plans that do not cross there (call it for
    a pair :func:`crossovers` found no crossing for).  The margin's extremes are read at
    :data:`LEAD_SAMPLES` points and both ends."""
    check_varies(base, variable)
    check_varies(other, variable)
    ratio = (hi / lo) ** (1 / (LEAD_SAMPLES - 1))
    points = [lo * ratio**i for i in range(LEAD_SAMPLES - 1)] + [hi]
    times = [(base.at(**{variable: v}), other.at(**{variable: v})) for v in points]
    base_faster = sum(a for a, _ in times) <= sum(b for _, b in times)
    margins = [(b / a if base_faster else a / b) - 1 for a, b in times if min(a, b) > 0]
    faster, slower = (base.name, other.name) if base_faster else (other.name, base.name)
    return Lead(
        variable, lo, hi, faster, slower, max(0.0, min(margins, default=0.0)), max(margins, default=0.0)
    )


def check_same_model(plans: Sequence[Plan], names: Sequence[str]) -> None:
    """Plans of different models (or of training against inference) have no crossover worth printing: their
    step times differ by the model, not by the plan.  Refuse, naming both.  The model is its class, its
    parameter names and, when both plans record it (``Plan.source``, saved by the CLI), its spec."""
    for plan, name in zip(plans[1:], names[1:], strict=True):
        specs = {_spec(plans[0]), _spec(plan)} - {None}
        if _identity(plan) != _identity(plans[0]) or len(specs) > 1:
            raise WhatIfError(
                f"{names[0]} plans {_describe(plans[0])} but {name} plans {_describe(plan)}: what-if compares "
                "plans of one model (and one mode); save both with autoshard search --out from the same --model"
            )


def _spec(plan: Plan) -> str | None:
    spec = plan.source.get("spec") if plan.source else None
    return str(spec) if spec is not None else None


def _identity(plan: Plan) -> tuple[object, ...]:
    return plan.model, plan.training, frozenset(plan.param_placements)


def _describe(plan: Plan) -> str:
    spec, mode = _spec(plan), "training" if plan.training else "inference"
    return f"{plan.model}{f' ({spec})' if spec else ''}, {len(plan.param_placements)} parameters, {mode}"


def check_varies(cost: PlanCost, variable: str) -> None:
    """``devices`` scales a plan on one mesh axis; on several, which axis grows is not defined: refuse."""
    if variable == "devices" and sum(1 for n in cost.mesh if n > 1) > 1:
        raise WhatIfError(
            f"cannot vary devices for {cost.name}: it is planned on the {len(cost.mesh)}-D mesh {cost.mesh}, "
            f"and which axis would grow is not defined; vary batch, seq or bandwidth, or re-plan on the "
            f"new mesh and compare the two files"
        )


def _real_roots(diff: sympy.Expr, x: sympy.Symbol, lo: float, hi: float) -> list[float]:
    if diff == 0:
        return []
    try:
        roots = sympy.solve(sympy.Eq(diff, 0), x)
    except NotImplementedError:  # transcendental: not produced by plan_cost, but say so rather than guess
        raise WhatIfError(f"cannot solve {diff} = 0 for {x} in closed form") from None
    out = []
    for r in roots:
        value = complex(sympy.N(r))
        if abs(value.imag) < 1e-9 * max(1.0, abs(value.real)) and lo <= value.real <= hi:
            out.append(value.real)
    return sorted(set(out))


def _winners(diff: sympy.Expr, x: sympy.Symbol, root: float) -> tuple[bool, bool]:
    """Is the base plan faster just below and just above ``root``?  (``diff`` = base - other.)"""
    eps = max(1e-9, 1e-6 * abs(root))
    f = sympy.lambdify(x, diff, "math")
    return bool(f(root - eps) < 0), bool(f(root + eps) < 0)
