"""Pipeline stages in the plan's drawing: one cluster per stage, chained by p2p edges.

Input: a :class:`~autoshard.plans.Plan` with ``pipeline`` set, and the drawing's networkx graph
(:func:`autoshard.report.dot.plan_graph`).  Output: one box per stage (its layers, the modules outside the
repeated layers it holds, its ranks and peak memory) whose ``cluster`` attribute titles it
``pipeline stage i (schedule)``, and a two-way ``p2p`` edge between consecutive stages (activations forward,
gradients backward; ``local`` between two stages on the same ranks, ZB-V's turn, which sends nothing).  Plans
without stages are left alone.
"""

from __future__ import annotations

import networkx as nx

from autoshard.plans import Plan
from autoshard.report.labels import fmt_bytes

__all__ = ["add_stages"]


def add_stages(g: nx.DiGraph, plan: Plan) -> None:
    """Pipeline stages, one cluster each, chained by their p2p edges (activations forward, gradients back)."""
    pipeline = plan.pipeline
    if pipeline is None:
        return
    for stage in pipeline.stages:
        span = f"layers {stage.layers[0]}–{stage.layers[1] - 1}" if stage.layers else "no repeated layer"
        extra = [m for m in stage.modules if not m.rsplit(".", 1)[-1].isdigit()]
        label = "\n".join(
            [span, *extra, f"ranks {stage.ranks[0]}–{stage.ranks[-1]}", f"{fmt_bytes(stage.memory_bytes)}"]
        )
        title = f"pipeline stage {stage.index} ({pipeline.schedule})"
        g.add_node(f"stage{stage.index}", label=label, shape="box", style="filled", fillcolor="lightyellow",
                   cluster=title)  # fmt: skip
    for a, b in zip(pipeline.stages, pipeline.stages[1:], strict=False):
        local = a.ranks == b.ranks  # ZB-V's turn: handed over in memory (pipeline.schedules.hand_offs)
        g.add_edge(
            f"stage{a.index}", f"stage{b.index}", label="local" if local else "p2p", dir="both", color="blue"
        )
