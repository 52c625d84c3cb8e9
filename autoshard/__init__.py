"""autoshard: plan how a PyTorch model is split over a cluster, prove the plan cheap, and compile it.

The pipeline, one stage per subpackage, each a function from one plain record to the next::

    nn.Module + example inputs
      → capture/      torch.export (non-strict) → cleaned ATen graph with shapes, FLOPs, module paths
      → strategies/   per-op sharding strategies from dim maps, expanded over the N-D mesh
      → problem/      strategies + cost_models + Cluster → plain arrays (node, edge and memory costs)
      → search/       exact DP / variable elimination, CP-SAT under a memory budget, BFS propagation
      → plans.py      Plan: parameter placements, per-node specs, collectives, step time, memory

Quick start::

    import autoshard
    cluster = autoshard.load_cluster("a100x8")
    plan = autoshard.plan(model, cluster, (input_ids,))
    print(plan.summary())

Public names are imported lazily so ``import autoshard`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from autoshard.errors import (
    AnnotationError,
    AutoshardError,
    CaptureError,
    InfeasibleError,
    MeshError,
    PlanFileError,
    ProfileError,
    ShardingError,
    UnsupportedOpError,
)

if TYPE_CHECKING:
    from autoshard.cluster import Cluster, load_cluster
    from autoshard.codegen.parallelize import parallelize
    from autoshard.planner import plan
    from autoshard.plans import Plan, load_plan
    from autoshard.runtime.export import export_to_dtensor
    from autoshard.runtime.verify import verify

__version__ = "0.1.0"

_LAZY = {
    "Cluster": "autoshard.cluster",
    "load_cluster": "autoshard.cluster",
    "Plan": "autoshard.plans",
    "load_plan": "autoshard.plans",
    "plan": "autoshard.planner",
    "parallelize": "autoshard.codegen.parallelize",
    "verify": "autoshard.runtime.verify",
    "export_to_dtensor": "autoshard.runtime.export",
}

__all__ = [
    "AnnotationError",
    "AutoshardError",
    "CaptureError",
    "Cluster",
    "InfeasibleError",
    "MeshError",
    "Plan",
    "PlanFileError",
    "ProfileError",
    "ShardingError",
    "UnsupportedOpError",
    "export_to_dtensor",
    "load_cluster",
    "load_plan",
    "parallelize",
    "plan",
    "verify",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'autoshard' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
