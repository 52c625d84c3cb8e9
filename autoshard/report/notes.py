"""The plan's notes as the report prints them: those that concern the plan, in a user's words.

Input: a :class:`~autoshard.plans.Plan` (``Plan.notes``, written by capture, the builder and the planner).
Output: the lines after ``note:`` in the text report.  The plan file keeps every note as written.

Two kinds of note are changed (new-user trial: solver words on almost every LLaMA plan, and a
context-parallel note on plans that split no sequence):

- notes about context parallelism (the layout search, attention masks run per chunk) are left out of a plan
  with no context-parallel axis: nothing in it depends on them;
- the builder's fan-out notes (``problem/fanout.py``: a tensor read in more layouts than the solver prices
  jointly) say what they mean for the user: the step time may be overstated a little, and where.

Example::

    >>> user_notes(plan)
    ['captured 2 of 32 blocks of model.layers; checked that 3 blocks add exactly one block's 69 nodes']
"""

from __future__ import annotations

import re

from autoshard.plans import Plan

__all__ = ["user_notes"]

_CONTEXT_ONLY = ("context-parallel layout searched:", "explicit attention masks proven causal")

# problem/fanout.py's two notes: "<where>: their consumers ..."
_PER_USE = re.compile(
    r"(?P<where>.+): their consumers can combine too many layouts to price one redistribution"
)
_INEXACT = re.compile(r"(?P<where>.+): their consumers want too many layout combinations to price sharing")


def user_notes(plan: Plan) -> list[str]:
    """``Plan.notes`` less those that do not concern this plan, the solver's in a user's words."""
    context = plan.context_axis is not None or bool(plan.ring_transfers)
    out = []
    for note in plan.notes:
        if not context and note.startswith(_CONTEXT_ONLY):
            continue
        out.append(_reworded(note))
    return out


def _reworded(note: str) -> str:
    found = _PER_USE.match(note)
    if found:
        return (
            f"step time may be overstated a little: {found['where']} are read in more layouts than the "
            "solver prices together, so each reader's move is counted as if none were shared"
        )
    found = _INEXACT.match(note)
    if found:
        return (
            f"step time may be overstated a little: {found['where']} are read in more layout combinations "
            "than the solver prices exactly, so some moves their readers share are counted twice"
        )
    return note
