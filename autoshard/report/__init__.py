"""Reports of a plan for people and machines: text, JSON, and graphs.

One module per concern, all reading only a :class:`~autoshard.plans.Plan` (so ``autoshard show`` can report a
saved file without the model):

- :mod:`~autoshard.report.labels` — parse the plan's S/R/P strategy labels; units (bytes, seconds);
- :mod:`~autoshard.report.groups` — module groups with repeated layers collapsed, ops classified;
- :mod:`~autoshard.report.roles` — what one op does on one mesh axis (batch, sequence, column, row, ...);
- :mod:`~autoshard.report.axes` — what each mesh axis splits, and the headline's degrees made of it;
- :mod:`~autoshard.report.describe` — one phrase list per module group (the report's body);
- :mod:`~autoshard.report.patterns` — the named parallelisms (data parallel, FSDP, Megatron column→row,
  head-parallel attention, vocab-parallel embedding, sequence parallel, expert parallel);
- :mod:`~autoshard.report.table` — the text report (100 columns) and its JSON form, with
  :mod:`~autoshard.report.figures` (step time, memory, the data-parallel baseline);
- :mod:`~autoshard.report.dot` — the plan as a networkx graph, DOT via pydot, SVG/PNG via graphviz;
- :mod:`~autoshard.report.progress` — the spinner ``autoshard search`` shows on a terminal.

Example::

    from autoshard.report import render, to_dot
    print(render(plan))
    open("plan.dot", "w").write(to_dot(plan))
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from autoshard.report.patterns import Pattern, recognise
from autoshard.report.table import Baseline, render, report_data

if TYPE_CHECKING:
    from autoshard.report.dot import to_dot, write

__all__ = ["Baseline", "Pattern", "recognise", "render", "report_data", "to_dot", "write"]


def __getattr__(name: str) -> Any:
    # the graph writer pulls in networkx and pydot (~0.15 s): load it only when asked for
    if name in ("to_dot", "write"):
        return getattr(importlib.import_module("autoshard.report.dot"), name)
    raise AttributeError(f"module 'autoshard.report' has no attribute {name!r}")
