"""Two plans side by side: step time, memory, collectives, placements and graph-node strategies, the terms
that differ first.

Input: two :class:`~autoshard.plans.Plan` (typically of one model: two meshes, with and without annotations,
two memory budgets, two precision recipes).  A note before the table names each setting that differs: model,
inputs (batch, sequence), hardware (profile and nodes), precision recipe, memory budget.  Placements are
compared normalised: replicated on every axis is ``R`` whatever the mesh's rank, so ``R`` on a 1-D mesh
equals ``(R, R, R)`` on a 3-D one.
Output: text (:func:`render`).  Nothing is re-planned; every figure is the plans' own.

Example::

    print(render(load_plan("a.json"), load_plan("b.json"), "a.json", "b.json"))
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Mapping

from autoshard.plans import Plan
from autoshard.report.labels import fmt_bytes, fmt_seconds

__all__ = ["figures", "render"]

Row = tuple[str, str, str, str]  # term, A, B, B - A


def figures(a: Plan, b: Plan) -> list[tuple[str, float, float, Callable[[float], str]]]:
    """The headline figures of both plans: (term, A, B, format)."""
    waited = a.pipeline is not None or b.pipeline is not None  # like with like: what each step waits for
    comm = "  communication waited for" if waited else "  communication (all)"
    a_comm = a.predicted_step_time - a.compute_time if waited else a.communication_time
    b_comm = b.predicted_step_time - b.compute_time if waited else b.communication_time
    rows: list[tuple[str, float, float, Callable[[float], str]]] = [
        ("step time", a.predicted_step_time, b.predicted_step_time, fmt_seconds),
        ("  compute", a.compute_time, b.compute_time, fmt_seconds),
        (comm, a_comm, b_comm, fmt_seconds),
        ("memory per device", a.memory_per_device, b.memory_per_device, fmt_bytes),
        ("devices", float(a.num_devices), float(b.num_devices), lambda x: f"{x:g}"),
    ]
    for key, (x, y) in _collectives(a, b).items():
        rows.append((f"{key} bytes", float(x[1]), float(y[1]), fmt_bytes))
        rows.append((f"{key} count", float(x[0]), float(y[0]), lambda v: f"{v:g}"))
    return rows


def _collectives(a: Plan, b: Plan) -> dict[str, tuple[tuple[int, int], tuple[int, int]]]:
    def tally(p: Plan) -> Mapping[str, tuple[int, int]]:
        count: Counter[str] = Counter()
        size: Counter[str] = Counter()
        for c in p.collectives:
            key = f"{c.phase} {c.kind}"
            count[key] += 1
            size[key] += c.nbytes
        return {k: (count[k], size[k]) for k in count}

    ta, tb = tally(a), tally(b)
    return {k: (ta.get(k, (0, 0)), tb.get(k, (0, 0))) for k in sorted(set(ta) | set(tb))}


def _table(rows: list[Row], names: tuple[str, str]) -> list[str]:
    width = max([len(r[0]) for r in rows] + [24]) + 2
    head = f"  {'':<{width}}{'A':>12}{'B':>12}   B - A"
    return [head, *(f"  {t:<{width}}{x:>12}{y:>12}   {d}" for t, x, y, d in rows)]


def _delta(x: float, y: float, fmt: Callable[[float], str]) -> str:
    if x == y:
        return "="
    sign = "+" if y > x else "-"
    ratio = f" ({y / x:.2f}x)" if x and y else ""
    return f"{sign}{fmt(abs(y - x))}{ratio}"


def _pairs(a: Mapping[str, object], b: Mapping[str, object]) -> tuple[list[str], int]:
    """Keys whose values differ once normalised (present on one side only counts), and how many agree."""
    keys = sorted(set(a) | set(b))
    differ = [k for k in keys if _normal(a.get(k)) != _normal(b.get(k))]
    return differ, len(keys) - len(differ)


_ALL_REPLICATED = re.compile(r"\(R(?:, R)*\)")


def _normal(value: object) -> object:
    """One spelling per placement: replicated on every axis is ``R`` whatever the mesh's rank (``(R, R, R)``,
    ``(R,)``, ``R``), a one-axis tuple is its placement; in a strategy label each all-``R`` operand is ``R``."""
    if isinstance(value, tuple):
        if value and all(p == "R" for p in value):
            return "R"
        return value[0] if len(value) == 1 else value
    if isinstance(value, str):
        return _ALL_REPLICATED.sub("R", value)
    return value


def _strategies(plan: Plan) -> dict[str, str]:
    """``"fc1 linear"`` (module and op; the graph node's name where it has no module) -> strategy label."""
    out: dict[str, str] = {}
    for n in plan.nodes:
        op = n.target.split(".")[1] if n.target.startswith("aten.") else n.target
        key = f"{n.module or n.name} {op}"
        while key in out:  # several ops of one kind in one module: number them in graph order
            key += "'"
        out[key] = n.strategy
    return out


def _spec(value: object) -> str:
    if value is None:
        return "(absent)"
    if isinstance(value, tuple) and len(value) == 1:
        return str(value[0])
    return "(" + ", ".join(map(str, value)) + ")" if isinstance(value, tuple) else str(value)


def _notes(a: Plan, b: Plan) -> list[str]:
    """One line per setting the plans were made under that differs, so a figure that moved because the
    batch, the hardware, the recipe or the budget moved is not read as the plan's doing."""
    out = []
    if a.model != b.model:
        out.append("the plans are for different models; placements and strategies compare by name")
    if a.input_shapes != b.input_shapes:
        out.append(
            f"inputs differ (A {_inputs(a)}; B {_inputs(b)}): figures move with the batch and sequence too"
        )
    if _hardware(a) != _hardware(b):
        out.append(
            f"hardware differs (A {_hardware(a)}; B {_hardware(b)}): figures move with the hardware too"
        )
    if a.precision != b.precision:  # Plan.precision: step time and memory differ by the recipe too
        out.append(
            f"A is priced for the {a.precision} recipe, B for {b.precision}: figures move with the recipe too"
        )
    if _budget(a) != _budget(b) and not (_whole_device(a) and _whole_device(b)):
        out.append(
            f"memory budgets differ (A {_budget(a)}; B {_budget(b)} per device): figures move with the budget too"
        )
    return [f"  note: {line}" for line in out]


def _inputs(plan: Plan) -> str:
    if not plan.input_shapes:
        return "inputs not recorded"
    return ", ".join(f"{k} {tuple(shape)}" for k, (shape, _) in plan.input_shapes.items())


def _hardware(plan: Plan) -> str:
    c = plan.cluster
    return f"{c.get('nodes', '?')} x {c.get('profile', '?')}"


def _whole_device(plan: Plan) -> bool:
    """The default budget: the whole device (its difference then follows from the hardware's)."""
    return plan.memory_limit is None or plan.memory_limit == plan.device_memory


def _budget(plan: Plan) -> str:
    return "no limit" if plan.memory_limit is None else fmt_bytes(plan.memory_limit)


def render(a: Plan, b: Plan, name_a: str = "A", name_b: str = "B", limit: int = 20) -> str:
    """Figures that differ, then placements and strategies that differ, then what is the same."""
    lines = [f"A: {name_a} ({a.model}, mesh {a.mesh_shape})", f"B: {name_b} ({b.model}, mesh {b.mesh_shape})"]
    lines += _notes(a, b)
    rows = [(t, fmt(x), fmt(y), _delta(x, y, fmt)) for t, x, y, fmt in figures(a, b)]
    differ = [r for r in rows if r[1] != r[2]]
    same = [r[0].strip() for r in rows if r[1] == r[2]]
    lines.append("figures that differ" if differ else "figures: all the same")
    if differ:
        lines += _table(differ, (name_a, name_b))
    keys, agree = _pairs(a.param_placements, b.param_placements)
    lines.append(f"parameter placements: {len(keys)} differ, {agree} the same")
    lines += [
        f"  {k:<48} {_spec(a.param_placements.get(k))} -> {_spec(b.param_placements.get(k))}"
        for k in keys[:limit]
    ]
    lines += [f"  ... {len(keys) - limit} more"] if len(keys) > limit else []
    na, nb = _strategies(a), _strategies(b)
    keys, agree = _pairs(na, nb)
    lines.append(f"graph-node strategies: {len(keys)} differ, {agree} the same")
    lines += [f"  {k:<40} {na.get(k, '(absent)')}  =>  {nb.get(k, '(absent)')}" for k in keys[:limit]]
    lines += [f"  ... {len(keys) - limit} more"] if len(keys) > limit else []
    if same:
        lines.append(f"the same in both: {', '.join(same)}")
    return "\n".join(lines)
