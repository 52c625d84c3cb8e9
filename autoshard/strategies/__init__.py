"""Per-op sharding strategies: what each node of a captured graph may do on a device mesh.

Input: an fx node of the pre-decomposition ATen graph (``node.meta["val"]`` set, as ``torch.export`` does) and a
mesh shape.  Output: its candidate :class:`OpStrategy` records -- a spec per input node, per output, per input
gradient, and the factor by which the op's work is divided -- for the planner to choose from.

The tour:

- :mod:`~autoshard.strategies.strategy` -- ``OpStrategy``; ``AxisChoice`` (what one mesh axis does);
  ``expand`` (product over mesh axes, divisibility filter, gradient specs derived once for every rule).
- :mod:`~autoshard.strategies.dimmap` -- ops written once as einsum-like dim maps (``"mk,kn->mn"``) from which
  the per-axis choices follow: split a letter, replicate, pass Partial through linear inputs.
- :mod:`~autoshard.strategies.registry` -- ``@register``, ``strategies_for``, ``has_rule``, ``missing_rules``,
  ``local_call``; replicate-only fallback with :class:`UnsupportedOpWarning`.
- :mod:`~autoshard.strategies.local` -- the ``local_args`` hook: what one device runs (localised sizes,
  vocab-parallel lookups); codegen and the numeric harness share it.
- ``rules/`` -- one module per op family (imported below, by name).
- :mod:`~autoshard.strategies.validate` -- the numeric harness that proves every strategy of a rule on a
  simulated mesh, forward and backward.

Example::

    >>> import torch
    >>> from autoshard.strategies import strategies_for
    >>> ep = torch.export.export(torch.nn.Linear(4, 8), (torch.randn(2, 4),), strict=False)
    >>> node = next(n for n in ep.graph.nodes if n.op == "call_function")
    >>> [str(s) for s in strategies_for(node, (2,))][:3]
    ['R, R, R -> R', 'S(0), R, R -> S(0)', 'R, S(0), S(0) -> S(1)']
"""

from __future__ import annotations

from autoshard.strategies import registry
from autoshard.strategies.local import LocalCall, LocalContext
from autoshard.strategies.registry import (
    UnsupportedOpWarning,
    has_rule,
    local_call,
    missing_rules,
    register,
    strategies_for,
)
from autoshard.strategies.rules import (
    attention,
    complex_views,
    conv,
    creation,
    dispatch,
    embedding,
    indexing,
    loss,
    matmul,
    moe,
    norm,
    pointwise,
    reduction,
    shape,
    structural,
)
from autoshard.strategies.strategy import OpStrategy

__all__ = [
    "LocalCall",
    "LocalContext",
    "OpStrategy",
    "UnsupportedOpWarning",
    "has_rule",
    "local_call",
    "missing_rules",
    "register",
    "registry",
    "strategies_for",
]

_RULE_MODULES = (
    attention,
    complex_views,
    conv,
    creation,
    dispatch,
    embedding,
    indexing,
    loss,
    matmul,
    moe,
    norm,
    pointwise,
    reduction,
    shape,
    structural,
)
