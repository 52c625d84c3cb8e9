"""The solver stage: from plain cost arrays to one strategy index per node.

No torch and no fx here: the stage sees a :class:`SearchProblem` (node cost vectors, edge cost matrices,
memory vectors and masks, all numpy) and returns a :class:`Solution`.

Modules, in the order :func:`solve` uses them:

* ``problem``   -- the records (:class:`SearchProblem`, :class:`Edge`, :class:`Solution`), :func:`evaluate`.
* ``reduce``    -- exact preprocessing: arc consistency, parallel/separable edges, fixed and free nodes,
  dominated strategies (``dominance``).
* ``propagate`` -- BFS from the annotations: a plan in milliseconds and a warm start.
* ``exact``     -- tree DP and variable elimination (orders and cutset conditioning in ``order``): the main,
  provably optimal path; ``messages`` keeps a bucket's message for the next solve while its inputs hold.
* ``budget``    -- a binding memory budget: Lagrangian bound and plan, Lagrangian fixing of strategies.
* ``peak``      -- a max term in the budget (``SearchProblem.peak``: the largest temporary), by thresholds.
* ``wide``      -- a budget on a problem too wide to eliminate with its memory terms: the dual with each
  relaxed problem reduced on its own; ``neighbourhood`` turns its minimisers into fitting plans.
* ``ilp``       -- CP-SAT for what fixing leaves under a budget, or treewidth beyond conditioning
  (formulation in its docstring).
* ``solve``     -- dispatch, time limit, lower bound and gap.
* ``brute``     -- exhaustive search, the reference in tests.

Example::

    >>> import numpy as np
    >>> from autoshard.search import Edge, SearchProblem, solve
    >>> p = SearchProblem((np.array([0.0, 3.0]), np.array([3.0, 0.0])),
    ...                   (Edge(0, 1, np.array([[0.0, 2.0], [2.0, 0.0]])),), ("a", "b"))
    >>> solve(p).choice
    (0, 1)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from autoshard.search.brute import brute_force
from autoshard.search.exact import ExactResult, FactorCapExceeded, solve_exact
from autoshard.search.problem import (
    AnnotationConflictError,
    Edge,
    SearchProblem,
    Solution,
    evaluate,
    memory_of,
)
from autoshard.search.propagate import propagate
from autoshard.search.reduce import Reduction, reduce_problem
from autoshard.search.solve import BoundExceeded, Method, solve

if TYPE_CHECKING:
    from autoshard.search.ilp import IlpResult, solve_ilp

__all__ = [
    "AnnotationConflictError",
    "BoundExceeded",
    "Edge",
    "ExactResult",
    "FactorCapExceeded",
    "IlpResult",
    "Method",
    "Reduction",
    "SearchProblem",
    "Solution",
    "brute_force",
    "evaluate",
    "memory_of",
    "propagate",
    "reduce_problem",
    "solve",
    "solve_exact",
    "solve_ilp",
]


def __getattr__(name: str) -> Any:
    # ortools' cp_model imports pandas (~0.5 s): load it only when CP-SAT is wanted.
    if name in ("IlpResult", "solve_ilp"):
        value = getattr(importlib.import_module("autoshard.search.ilp"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'autoshard.search' has no attribute {name!r}")
