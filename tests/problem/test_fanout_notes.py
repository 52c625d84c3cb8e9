"""The "too many layouts to share one redistribution" upper bound is one note naming modules, not fx nodes.

A new-user trial found every LLaMA report ending in ~10 such notes, one per internal fx node (``to_6``,
``mul_4``): the same meaning repeated, in names a reader cannot look up.
"""

from __future__ import annotations

import re

import autoshard
from autoshard import zoo


def test_the_per_consumer_upper_bound_is_one_note_naming_modules() -> None:
    case = zoo.build("llama-tiny")
    cluster = autoshard.load_cluster("a100x8", nodes=1, mesh=(2, 4))
    plan = autoshard.plan(case.model, cluster, case.args, case.kwargs)
    bounded = [n for n in plan.notes if "combine too many layouts" in n]
    assert len(bounded) == 1, plan.notes
    note = bounded[0]
    match = re.match(
        r"(\d+) ops' outputs \(in (model\.[\w.]+)(, model\.[\w.]+)*( and \d+ more)?; the first", note
    )
    assert match and int(match[1]) > 1, note
    assert "model.layers.0" in note and "an upper bound" in note
    assert not re.search(r"\b(to|mul|add|transpose)_\d+\b", note), note  # no internal fx node names
