"""Collapse the further runs of identical blocks (``META_RUN``, :mod:`autoshard.capture.runs`) in the search.

Input: the captured graph's :class:`~autoshard.problem.graph.NodeInfo` records, the node -> variable
``template`` of the primary stack, and the graph itself.  Output: the template extended so that node ``p`` of
block ``i`` of a run shares the solver variable of node ``p`` of the run's block 0, and how many nodes each
such variable stands for.

Why this is exact: every block of a run is in the graph, so every use keeps its own edge of weight 1;
:func:`~autoshard.problem.fanout.split_uses` sums the uses that share a template key, so the collapsed
problem prices, for any shared choice, exactly what the full graph prices for that choice mapped onto every
block.  Two sharing rules keep it so: a tensor made outside a run and read at the same position by every
block is one tensor wanting one layout (moved once, as for the primary stack), and uses of a run's node are
kept apart by which copy they read (the same block's, the previous block's, or the last block's from
outside), :func:`relation`.  The plan lists every node of every block with the shared decision
(:mod:`autoshard.problem.extract`), so nothing downstream knows the run was collapsed.

Example::

    template, copies, runs = collapse_runs(ordered, template, gm)
    # template["linear_40"] == "linear_4" (encoder.block.2's q projection shares encoder.block.1's)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from torch import fx

from autoshard.capture.meta import META_RUN
from autoshard.problem.graph import NodeInfo

__all__ = ["RunPosition", "collapse_runs", "reads_into_run", "relation"]

RunPosition = tuple[int, int, int]
"""``(run, block, position)`` of a node of a further run."""


def collapse_runs(
    infos: Sequence[NodeInfo], template: dict[str, str], gm: fx.GraphModule
) -> tuple[dict[str, str], dict[str, int], dict[str, RunPosition]]:
    """(template with every run block mapped onto its block 0, copies per run variable, run membership)."""
    runs: dict[str, RunPosition] = {
        n.name: n.meta[META_RUN] for n in gm.graph.nodes if META_RUN in n.meta and n.name in template
    }
    # a run whose blocks return graph outputs (every layer's hidden state) prices output fixes per node
    returned = {runs[i.name][0] for i in infos if i.is_output and i.name in runs}
    runs = {name: where for name, where in runs.items() if where[0] not in returned}
    if not runs:
        return template, {}, {}
    head = {(r, p): name for name, (r, b, p) in runs.items() if b == 0}
    blocks: dict[int, int] = {}
    for r, b, _ in runs.values():
        blocks[r] = max(blocks.get(r, 0), b + 1)
    out = dict(template)
    for info in infos:
        where = runs.get(info.name)
        if where is None:
            continue
        assert info.block is None, f"{info.name} is in the primary stack and in a further run"
        out[info.name] = head[(where[0], where[2])]
    copies = {name: blocks[r] for name, (r, b, _) in runs.items() if b == 0}
    return out, copies, runs


def relation(producer: str, consumer: str, runs: Mapping[str, RunPosition]) -> str | None:
    """Which copy of a run's tensor a use reads (``None`` when neither end is in a run): a tensor made
    outside the run read ``into`` it, the ``same`` block's, the ``next`` block's, or the last block's as it
    ``leaves`` the run."""
    u, v = runs.get(producer), runs.get(consumer)
    if u is None:
        return None if v is None else f"into run {v[0]}"
    if v is None or v[0] != u[0]:
        return f"leaves run {u[0]}"
    return f"run {u[0]}: same" if u[1] == v[1] else f"run {u[0]}: next"


def reads_into_run(producer: str, consumer: str, runs: Mapping[str, RunPosition]) -> bool:
    """A tensor made outside every run, read by every block of the consumer's run: one layout for all,
    moved once (as a tensor read by every layer of the primary stack)."""
    return producer not in runs and consumer in runs
