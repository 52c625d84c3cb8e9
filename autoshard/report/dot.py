"""The plan as a graph: DOT for Graphviz, rendered to SVG/PNG/PDF when the ``dot`` binary is installed.

Input: a :class:`~autoshard.plans.Plan`.
Output: :func:`plan_graph` → a ``networkx.DiGraph``; :func:`to_dot` → DOT text (written by pydot through
``networkx.nx_pydot``, so nothing is escaped by hand); :func:`write` → a ``.dot`` file or a rendered image.

What is drawn:

- one box per *unit*: a module (``level="module"``, the default: all ops of ``self_attn.q_proj`` in one box,
  labelled with its heaviest op and that op's strategy in S/R/P notation) or one box per op
  (``level="op"``); a repeated-layer stack is one cluster ``model.layers.0–31 (×32)`` holding the single
  decision the plan keeps per layer position;
- parameters as notes coloured by their placement (legend included: grey is replicated everywhere);
- edges that carry a redistribution in red (forward) or orange (backward only), labelled with the
  collective, its axis, bytes and time per occurrence (``×32`` when every layer pays it).

Edges.  A plan records each node's strategy, not its operands.  The collectives name their tensor and the op
that consumes it, so every edge that moves data is exact.  When :class:`~autoshard.plans.NodePlan` carries
``inputs`` (node names), the other edges are exact too; otherwise units are chained in program order and
those edges are dashed grey ("order"), and the graph label says so.

Example::

    write(plan, "plan.svg")          # needs graphviz; write(plan, "plan.dot") never does
"""

from __future__ import annotations

import itertools
import shutil
import subprocess
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import networkx as nx
from networkx.drawing.nx_pydot import to_pydot

from autoshard.errors import AutoshardError
from autoshard.plans import Collective, Plan
from autoshard.report.groups import OpRow, PlanView
from autoshard.report.labels import fmt_bytes, fmt_seconds, spec_text
from autoshard.report.stages import add_stages

__all__ = ["GraphvizError", "Level", "plan_graph", "render_dot", "to_dot", "write"]

Level = Literal["module", "op"]
RENDERED = {".svg": "svg", ".png": "png", ".pdf": "pdf"}
REPLICATED_COLOUR = "#e0e0e0"
PALETTE = ("#a6cee3", "#b2df8a", "#fdbf6f", "#cab2d6", "#fb9a99", "#ffff99", "#8dd3c7", "#bebada", "#fccde5")
_PHASE = {
    "forward": "fwd",
    "backward": "bwd",
    "recompute": "bwd recompute",
}  # recompute: Collective.recompute


class GraphvizError(AutoshardError, RuntimeError):
    """Graphviz is missing or failed to render a graph."""


@dataclass
class _Unit:
    """One box of the drawing."""

    id: str
    title: str
    cluster: str | None
    ops: list[OpRow] = field(default_factory=list)


def plan_graph(plan: Plan, level: Level = "module") -> nx.DiGraph:
    """The drawing as a networkx graph; node and edge attributes are Graphviz attributes."""
    view = PlanView.of(plan)
    units, unit_of = _units(view, level)
    g = nx.DiGraph()
    g.graph["graph"] = {
        "rankdir": "TB",
        "label": _title(plan),
        "labelloc": "t",
        "fontsize": "12",
        "fontname": "Helvetica",
    }
    g.graph["node"] = {"fontname": "Helvetica", "fontsize": "10"}
    g.graph["edge"] = {"fontname": "Helvetica", "fontsize": "9"}
    for unit in units:
        g.add_node(unit.id, label=_unit_label(unit), shape="box", style="rounded", cluster=unit.cluster)
    _add_inputs(g, view, units, unit_of)
    exact = _exact_edges(plan, unit_of)
    for u, v in exact or _order_edges(units):
        g.add_edge(u, v, style="solid" if exact else "dashed", color="black" if exact else "grey60")
    _add_collectives(g, view, unit_of)
    _add_output(g, plan, units)
    _add_params(g, view, unit_of, units)
    add_stages(g, plan)
    _add_legend(g, plan)
    if not exact:
        g.graph["graph"]["label"] += "\ngrey dashed edges: program order (the plan records no operands)"
    return g


def to_dot(plan: Plan, level: Level = "module") -> str:
    """DOT text of :func:`plan_graph`, clusters included."""
    g = plan_graph(plan, level)
    clusters: dict[str, list[str]] = defaultdict(list)
    for node, data in g.nodes(data=True):
        if data.get("cluster"):
            clusters[data["cluster"]].append(node)
        data.pop("cluster", None)
    dot = to_pydot(g)
    for index, (title, members) in enumerate(clusters.items()):
        dot.add_subgraph(_cluster(dot, index, title, members))
    return str(dot.to_string())


def _cluster(dot: object, index: int, title: str, members: list[str]) -> object:
    import pydot

    assert isinstance(dot, pydot.Dot)
    name = "legend" if title == "legend" else f"{'stage' if title.startswith('pipeline') else 'stack'}{index}"
    cluster = pydot.Cluster(name, label=title, style="rounded,dashed", color="grey40")
    for member in members:
        node = dot.get_node(member)[0]
        dot.del_node(member)
        cluster.add_node(node)
    return cluster


def write(plan: Plan, path: str | Path, level: Level = "module") -> Path:
    """Write ``path``: DOT text for ``.dot``/``.gv``, an image for ``.svg``/``.png``/``.pdf`` (needs graphviz)."""
    target = Path(path)
    text = to_dot(plan, level)
    fmt = RENDERED.get(target.suffix.lower())
    if fmt is None:
        _write_text(target, text)
    else:
        render_dot(text, target, fmt)
    return target


def _write_text(target: Path, text: str) -> None:
    try:
        target.write_text(text)
    except OSError as e:
        raise GraphvizError(f"cannot write {target}: {e.strerror}; check the directory exists") from e


def render_dot(text: str, target: Path, fmt: str) -> None:
    """Run graphviz's ``dot -T<fmt>``; :class:`GraphvizError` with the fix when it is missing or fails."""
    binary = graphviz_binary()
    if binary is None:
        raise GraphvizError(
            f"cannot render {target}: graphviz's `dot` is not installed (apt install graphviz / brew install "
            f"graphviz), or write DOT instead: {target.with_suffix('.dot')}"
        )
    try:
        subprocess.run(
            [binary, f"-T{fmt}", "-o", str(target)], input=text.encode(), check=True, capture_output=True
        )
    except subprocess.CalledProcessError as e:
        detail = e.stderr.decode(errors="replace").strip().splitlines()
        raise GraphvizError(f"graphviz failed to render {target}: {detail[-1] if detail else e}") from e
    except OSError as e:
        raise GraphvizError(f"cannot run graphviz's `dot` for {target}: {e}") from e


def graphviz_binary() -> str | None:
    """The path of graphviz's ``dot``, or ``None``."""
    return shutil.which("dot")


# -- units -----------------------------------------------------------------------------------------------------


def _units(view: PlanView, level: Level) -> tuple[list[_Unit], dict[str, str]]:
    """Boxes in program order, and op node name -> box id."""
    units: dict[str, _Unit] = {}
    unit_of: dict[str, str] = {}
    for row in view.ops:
        stacked = row.node.count > 1 or row.node.key.startswith("block:")
        cluster = f"{row.group} (×{row.node.count})" if stacked and view.block_count > 1 else None
        inside = row.local if cluster else row.node.module
        key = row.node.name if level == "op" else f"{row.group}/{inside}"
        if key not in units:
            units[key] = _Unit(f"u{len(units)}", _unit_title(row, inside, level), cluster)
        units[key].ops.append(row)
        unit_of[row.node.name] = units[key].id
    return list(units.values()), unit_of


def _unit_title(row: OpRow, inside: str, level: Level) -> str:
    where = inside or row.group
    return f"{row.node.name}  ({where})" if level == "op" else where


def _unit_label(unit: _Unit) -> str:
    main = max(unit.ops, key=lambda r: (r.node.compute_seconds, r.kind != "view"))
    lines = [unit.title, f"{main.op}: {main.node.strategy}"]
    if len(unit.ops) > 1:
        lines.append(f"+{len(unit.ops) - 1} more ops")
    time = sum(r.node.compute_seconds for r in unit.ops)
    if time > 0:
        lines.append(f"compute {fmt_seconds(time)}")
    return "\n".join(lines)


# -- edges -----------------------------------------------------------------------------------------------------


def _add_inputs(g: nx.DiGraph, view: PlanView, units: list[_Unit], unit_of: dict[str, str]) -> None:
    """Model inputs as ovals; in program order they feed the first box."""
    for index, (name, spec) in enumerate(view.plan.input_placements.items()):
        iid = f"in{index}"
        g.add_node(iid, label=f"input {name}\n{spec_text(spec)}", shape="oval")
        unit_of[name] = iid
        if units:
            units.insert(index, _Unit(iid, name, None))


def _add_output(g: nx.DiGraph, plan: Plan, units: list[_Unit]) -> None:
    specs = ", ".join(spec_text(s) for s in plan.output_placements)
    if "output" not in g:
        g.add_node("output", shape="oval")
    g.nodes["output"]["label"] = f"output\n{specs}" if specs else "output"
    last = next((u.id for u in reversed(units) if u.ops), None)
    if last is not None and not g.in_degree("output"):
        g.add_edge(last, "output", style="dashed", color="grey60")


def _exact_edges(plan: Plan, unit_of: dict[str, str]) -> list[tuple[str, str]]:
    """Unit edges from ``NodePlan.inputs`` when the plan records operands; empty otherwise."""
    edges: dict[tuple[str, str], None] = {}
    for node in plan.nodes:
        inputs: Iterable[str] = getattr(node, "inputs", None) or ()
        for source in inputs:
            u, v = unit_of.get(source), unit_of.get(node.name)
            if u and v and u != v:
                edges[(u, v)] = None
    return list(edges)


def _order_edges(units: list[_Unit]) -> list[tuple[str, str]]:
    return [(a.id, b.id) for a, b in itertools.pairwise(units)]


def _add_collectives(g: nx.DiGraph, view: PlanView, unit_of: dict[str, str]) -> None:
    """Label (or add) every edge that moves data with its collectives; parameters are handled apart."""
    per_edge: dict[tuple[str, str], list[Collective]] = defaultdict(list)
    for c in view.plan.collectives:
        if c.tensor in view.param_nodes:
            continue
        u = unit_of.get(c.tensor)
        consumer = view.consumer(c)
        v = "output" if c.node == "output" else (unit_of.get(consumer.node.name) if consumer else None)
        if u and v:
            per_edge[(u, v)].append(c)
    for (u, v), cs in list(per_edge.items()):
        if u == v:  # a redistribution between two ops of one box: say so on the box
            del per_edge[(u, v)]
            g.nodes[u]["label"] += "\n" + _inside(cs)
            g.nodes[u]["color"] = "red"
    if any(v == "output" for _, v in per_edge):
        g.add_node("output", label="output", shape="oval")
    slowest = max((sum(c.seconds for c in cs) for cs in per_edge.values()), default=0.0) or 1.0
    for (u, v), cs in per_edge.items():
        g.add_edge(u, v, **_collective_style(cs, slowest))


def _inside(cs: list[Collective]) -> str:
    kinds: dict[tuple[str, str, int], list[Collective]] = defaultdict(list)
    for c in cs:
        kinds[("recompute" if c.recompute else c.phase, c.kind, c.mesh_axis)].append(c)
    return "\n".join(
        f"inside: {_PHASE.get(p, p)} {k} axis {a} ×{len(v)}, {fmt_seconds(sum(c.seconds for c in v))}"
        for (p, k, a), v in sorted(kinds.items())
    )


def _collective_style(cs: list[Collective], slowest: float) -> dict[str, str]:
    lines = []
    buckets: dict[tuple[str, str, int, int, float], int] = defaultdict(int)
    for c in cs:
        buckets[("recompute" if c.recompute else c.phase, c.kind, c.mesh_axis, c.nbytes, c.seconds)] += 1
    for (phase, kind, axis, nbytes, secs), n in sorted(buckets.items()):
        times = f" ×{n}" if n > 1 else ""
        lines.append(
            f"{_PHASE.get(phase, phase)} {kind} axis {axis}: {fmt_bytes(nbytes)}, {fmt_seconds(secs)}{times}"
        )
    forward = any(c.phase == "forward" for c in cs)
    width = 1.0 + 3.0 * sum(c.seconds for c in cs) / slowest
    return {
        "label": "\n".join(lines),
        "color": "red" if forward else "darkorange",
        "fontcolor": "red3" if forward else "darkorange3",
        "penwidth": f"{width:.1f}",
        "style": "solid",
    }


# -- parameters and legend -------------------------------------------------------------------------------------


def _add_params(g: nx.DiGraph, view: PlanView, unit_of: dict[str, str], units: list[_Unit]) -> None:
    """Parameter notes, coloured by placement, with an edge to every box that reads them."""
    colours = _colours(view.plan)
    by_module = _units_by_module(units)
    default = _param_consumers(view, unit_of, by_module)
    cluster_of = {u.id: u.cluster for u in units}
    for index, (node_name, fqn) in enumerate(view.param_nodes.items()):
        spec = view.plan.param_placements[fqn]
        pid = f"p{index}"
        edges = _param_edges(view, node_name, default.get(fqn), unit_of, by_module)
        home = default.get(fqn) or next(iter(edges), None)
        label = ".".join(fqn.rsplit(".", 2)[-2:]) if home else fqn
        g.add_node(
            pid,
            label=f"{label}\n{spec_text(spec)}",
            shape="note",
            style="filled",
            fillcolor=colours[spec],
            cluster=cluster_of.get(home) if home else None,
        )
        slowest = max((sum(c.seconds for c in cs) for cs in edges.values()), default=0.0) or 1.0
        for target, moved in edges.items():
            style = _collective_style(moved, slowest) if moved else {"color": "grey50", "arrowsize": "0.6"}
            g.add_edge(pid, target, **style)


def _param_edges(
    view: PlanView, node_name: str, home: str | None, unit_of: dict[str, str], by_module: dict[str, str]
) -> dict[str, list[Collective]]:
    """box -> the collectives on the way from this parameter to it (forward: the consumer op is named;
    backward: the consumer's module is)."""
    edges: dict[str, list[Collective]] = {home: []} if home else {}
    for c in view.plan.collectives:
        if c.tensor != node_name:
            continue
        consumer = view.consumer(c) if c.phase == "forward" else None
        target = unit_of.get(consumer.node.name) if consumer else by_module.get(view.layer0(c.module))
        target = target or home
        if target:
            edges.setdefault(target, []).append(c)
    return edges


def _units_by_module(units: list[_Unit]) -> dict[str, str]:
    by_module: dict[str, str] = {}
    for unit in units:
        for row in unit.ops:
            by_module.setdefault(row.node.module, unit.id)
    return by_module


def _param_consumers(view: PlanView, unit_of: dict[str, str], by_module: dict[str, str]) -> dict[str, str]:
    """parameter FQN -> the box that reads it: its weighted op, else an op of its owning module."""
    found: dict[str, str] = {}
    for row in view.ops:
        if row.weight and row.weight not in found:
            found[row.weight] = unit_of[row.node.name]
    for fqn in view.param_nodes.values():
        owner = fqn.rpartition(".")[0]
        if fqn not in found and owner in by_module:
            found[fqn] = by_module[owner]
    return found


def _colours(plan: Plan) -> dict[tuple[str, ...], str]:
    specs = sorted(set(plan.param_placements.values()))
    colours: dict[tuple[str, ...], str] = {}
    palette = iter(PALETTE * (1 + len(specs) // len(PALETTE)))
    for spec in specs:
        colours[spec] = REPLICATED_COLOUR if all(p == "R" for p in spec) else next(palette)
    return colours


def _add_legend(g: nx.DiGraph, plan: Plan) -> None:
    colours = _colours(plan)
    for index, (spec, colour) in enumerate(colours.items()):
        g.add_node(
            f"legend{index}",
            label=f"parameters {spec_text(spec)}",
            shape="note",
            style="filled",
            fillcolor=colour,
            cluster="legend",
        )


def _title(plan: Plan) -> str:
    cluster = plan.cluster
    where = f"{cluster.get('nodes', 1)} x {cluster.get('profile', '?')}, mesh {tuple(plan.mesh_shape)}"
    return (
        f"{plan.model} on {where}: step {fmt_seconds(plan.predicted_step_time)} "
        f"(compute {fmt_seconds(plan.compute_time)}, communication{' waited for' * bool(plan.pipeline)} "
        f"{fmt_seconds(plan.communication_time)}), "
        f"{fmt_bytes(plan.memory_per_device)} per device"
    )
