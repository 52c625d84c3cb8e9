"""What-if feasibility: the rules ``search`` plans under, applied to a saved plan away from its planned size.

Input: a :class:`~autoshard.plans.Plan` and the scale of its terms (:mod:`autoshard.whatif`).  Output:
:class:`Limit` records, each an expression ``excess <= 0`` in the what-if symbols, and the intervals of one
varied symbol where every limit holds (:func:`feasible_spans`).

A plan keeps its strategies at every point, so a point is feasible when those strategies can run there:

==========  ================================================================================================
rule        holds when
==========  ================================================================================================
batch       the global batch reaches the plan's batch split: ``B >= dp x fsdp x microbatches`` (``D``
            replaces ``D0`` in it when the plan's one split axis splits the batch and ``devices`` varies);
            at a point the batch must also be a multiple of it, as ``search`` asks
sequence    the sequence reaches the plan's sequence split: ``S >= cp x sp`` (x tp where the TP axis splits
            the sequence between its matmuls, ``TP 8 (+SP)``; x 2 with the zigzag layout: ``2n`` chunks)
memory      the memory per device, scaled as the compute (activations by ``(B/B0)(S/S0)``, split nodes by
            ``D0/D``; weights, optimizer state, gathered weights and the runtime reserve held), is within
            the budget the plan was solved under (``Plan.memory_limit``; none when it had none)
==========  ================================================================================================

Example::

    spans = feasible_spans(cost.limits, cost.reference, "batch", 1, 1024)   # [(8.0, 512.3)]
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import sympy

from autoshard.plans import Plan

__all__ = ["Limit", "describe", "feasible_spans", "plan_limits"]

GIB = 2**30


def _symbol(name: str) -> sympy.Symbol:
    return sympy.Symbol(name, positive=True)  # the same symbol as autoshard.whatif.SYMBOLS[name]


@dataclass(frozen=True)
class Limit:
    """One rule a point must meet (module docstring): ``excess <= 0``."""

    rule: str  # "batch" | "seq" | "memory"
    need: sympy.Expr  # batch / seq: the least value the point must reach; memory: bytes per device
    names: str = ""  # what the plan splits by: "DP", "DP × FSDP × microbatches", "CP × SP"
    budget: float = 0.0  # memory: bytes per device the plan was solved under

    @property
    def excess(self) -> sympy.Expr:
        return self.need - (sympy.Float(self.budget) if self.rule == "memory" else _symbol(self.rule))

    def why(self, point: Mapping[str, float]) -> str:
        """Why ``point`` breaks this rule: ``"batch 4 < DP 8"``, ``"does not fit: 3.2 GiB over"``."""
        need = float(self.need.subs({_symbol(k): v for k, v in point.items()}))
        if self.rule == "memory":
            return f"does not fit: {(need - self.budget) / GIB:.3g} GiB over"
        return f"{self.rule} {point[self.rule]:g} < {self.names} {need:g}"


def plan_limits(plan: Plan, memory: sympy.Expr, grows: sympy.Expr) -> list[Limit]:
    """The plan's limits.  ``memory``: its memory per device as an expression; ``grows``: what its
    split degree is multiplied by as ``devices`` varies (``D / D0`` on one axis, else 1)."""
    deg = plan.degrees
    out = []
    batch = [k for k in ("dp", "fsdp") if deg.get(k, 1) > 1]
    split = math.prod(deg[k] for k in batch)
    names = [k.upper() for k in batch] + (["microbatches"] if plan.microbatches > 1 else [])
    if split * plan.microbatches > 1:
        grown = grows if split > 1 else sympy.Integer(1)
        need = sympy.Integer(split * plan.microbatches) * grown  # an Expr even when it is a constant
        out.append(Limit("batch", need, " × ".join(names)))
    seq = [k for k in ("cp", "sp") if deg.get(k, 1) > 1]
    zigzag = 2 if plan.context_layout == "zigzag" and "cp" in seq else 1  # 2n chunks
    between = _tp_sequence_split(plan)  # TP 8 (+SP): its norms split the sequence 8 ways too
    if seq or between > 1:
        names = [k.upper() for k in seq] + (["TP (+SP)"] if between > 1 else [])
        names += ["2 (zigzag)"] if zigzag > 1 else []
        need = math.prod(deg[k] for k in seq) * between * zigzag * grows
        out.append(Limit("seq", need, " × ".join(names)))
    if plan.memory_limit is not None and math.isfinite(plan.memory_limit):
        out.append(Limit("memory", memory, budget=float(plan.memory_limit)))
    return out


def _tp_sequence_split(plan: Plan) -> int:
    """How many ways the TP axes that split the sequence between their matmuls (Megatron's sequence
    parallelism, ``TP 8 (+SP)``: :attr:`autoshard.report.axes.AxisUse.sequence_between`) cut it; 1 for none."""
    from autoshard.report.axes import axis_uses  # the report reads plans; import it only when asked
    from autoshard.report.groups import PlanView

    uses = axis_uses(PlanView.of(plan), 0 if plan.pipeline is not None else None)
    return math.prod(u.size for u in uses if u.sequence_between)


def feasible_spans(
    limits: Sequence[Limit], reference: Mapping[str, float], variable: str, lo: float, hi: float
) -> list[tuple[float, float]]:
    """The intervals of ``variable`` in ``[lo, hi]`` where every limit holds, the other symbols at the
    reference point (each limit is monotone or has few roots: split at them, test each piece's middle)."""
    x = _symbol(variable)
    fixed = {_symbol(k): v for k, v in reference.items() if k != variable}
    excesses = [sympy.simplify(limit.excess.subs(fixed)) for limit in limits]
    cuts = sorted({lo, hi, *(r for e in excesses for r in _roots(e, x, lo, hi))})
    spans: list[tuple[float, float]] = []
    for a, b_ in itertools.pairwise(cuts):
        mid = (a + b_) / 2
        if all(float(e.subs(x, mid)) <= 0 for e in excesses):
            if spans and spans[-1][1] == a:
                spans[-1] = (spans[-1][0], b_)
            else:
                spans.append((a, b_))
    return spans


def describe(limits: Sequence[Limit], point: Mapping[str, float]) -> str | None:
    """Why the plan cannot run at ``point`` (the first rule broken), or ``None`` where it can."""
    values = {_symbol(k): v for k, v in point.items()}
    for limit in limits:
        if float(limit.excess.subs(values)) > 0:
            return limit.why(point)
    return None


def _roots(expr: sympy.Expr, x: sympy.Symbol, lo: float, hi: float) -> list[float]:
    if x not in expr.free_symbols:
        return []
    out = []
    for r in sympy.solve(sympy.Eq(expr, 0), x):
        value = complex(sympy.N(r))
        if abs(value.imag) < 1e-9 * max(1.0, abs(value.real)) and lo < value.real < hi:
            out.append(value.real)
    return out
