"""The one-line messages of an annotation that pins nothing: what it matched, what it could pin, the fix.

A target that names nothing gets the closest names (``fc9`` -> ``did you mean fc1, fc2?``).  A target that
names something of another kind than its choice needs (``fc1=ring``: ``fc1`` is a linear module, ``ring``
pins attention) is told so, with the choices that fit and, for ``ring``, where the attention runs; the
closest names would only repeat the target.

Example::

    no_attention(Annotation("fc1", "ring"), infos)
    # "annotation 'fc1' = 'ring': ring (context parallel) pins a module that runs
    #  scaled_dot_product_attention, and this model runs none; other choices are column, row, ..."
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from autoshard.problem.graph import NodeInfo

__all__ = ["choices", "no_attention", "no_match"]

_CHOICES = {
    "layout": "column, row, vocab or replicate (optionally @AXIS) on a module with weights",
    "ring": "ring on an attention module",
    "stage": "stage on a layer",
    "placements": "placements like '(R, S(0))' on a parameter or input",
}
"""Every kind of choice an annotation takes (:mod:`autoshard.annotations`), named in refusals."""


def choices(*leave_out: str) -> str:
    """The kinds of choice, but ``leave_out``, in one phrase."""
    kept = [text for kind, text in _CHOICES.items() if kind not in leave_out]
    return "; ".join(kept)


_ATTENTION = "scaled_dot_product_attention"


def no_match(ann: Any, infos: Mapping[str, NodeInfo], what: str) -> str:
    """``annotation 'fc9' matches no module with parameters; did you mean fc1, fc2?``"""
    names = _names(infos)
    if ann.target in names:  # it names something, of another kind than the choice pins
        return f"annotation {ann.target!r} = {ann.choice!r}: {ann.target} is no {what}; the choices are {choices()}"
    close = difflib.get_close_matches(ann.target, names, n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else "; targets are module paths or parameter names"
    return f"annotation {ann.target!r} matches no {what}{hint}"


def no_attention(ann: Any, infos: Mapping[str, NodeInfo]) -> str:
    """``ring`` on a target that runs no attention: where attention runs (a glob that pins it all), or that
    the model has none, and the choices that fit the target."""
    modules = sorted({i.module for i in infos.values() if i.kind == "op" and _ATTENTION in i.target})
    head = f"annotation {ann.target!r} = {ann.choice!r}: ring (context parallel) pins a module that runs {_ATTENTION}"
    if not modules:
        return f"{head}, and this model runs none; other choices are {choices('ring')}"
    leaves = {m.rsplit(".", 1)[-1] for m in modules}
    where = ", ".join(modules[:2]) + (f" and {len(modules) - 2} more" if len(modules) > 2 else "")
    glob = (
        f" (*.{next(iter(leaves))}={ann.choice} pins them all)"
        if len(leaves) == 1 and len(modules) > 1
        else ""
    )
    return (
        f"{head}, and {ann.target} matches none: attention runs in {where}{glob}; other choices are "
        f"{choices('ring')}"
    )


def _names(infos: Mapping[str, NodeInfo]) -> list[str]:
    """Every name a target may give: parameter and buffer names, module paths, model inputs."""
    return sorted(
        {i.fqn for i in infos.values() if i.fqn}
        | {i.module for i in infos.values() if i.module}
        | {i.name for i in infos.values() if i.kind == "user_input"}
    )
