"""Codegen: a plan -> the ``fx.GraphModule`` each rank runs, with local shapes, local weights and collectives.

The tour, one step per module:

- :mod:`~autoshard.codegen.assign` -- the plan's decision for every node of a full capture (by ``NodePlan.key``),
  checked against the sharding rules: a model that is not the planned one fails here, clearly.
- :mod:`~autoshard.codegen.lower` -- the graph rewrite for one mesh coordinate: local args from each rule's
  ``local_args`` hook, one ``redistribute`` node per edge that moves data (the steps the cost model priced,
  forward and backward), Partial outputs reduced.
- :mod:`~autoshard.codegen.collectives` -- the steps run with ``torch.distributed`` on each mesh axis's group,
  inside one ``autograd.Function`` per edge; optional log of every collective to compare ranks.
- :mod:`~autoshard.codegen.shard` -- a tensor's piece for a coordinate, and the whole from every rank's piece.
- :mod:`~autoshard.codegen.parallelize` -- :func:`parallelize`: capture, assign, lower, cut the weights.
- :mod:`~autoshard.codegen.emitted` -- what an emitted module knows (``ParallelInfo``) and its inputs, outputs,
  whole weights and gradients (checkpoints).

Example (on every rank of a 4-rank process group)::

    plan = autoshard.plan(model, autoshard.load_cluster("cpu"), (x,))
    module = autoshard.parallelize(model, plan, (x,))
    print(module.code)                       # every collective, in the planner's notation
    y = gather_outputs(module, module(*shard_inputs(plan, x)))
"""

from autoshard.codegen.assign import PlanMismatchError, assign_strategies
from autoshard.codegen.collectives import MeshComm, redistribute
from autoshard.codegen.lower import LoweredGraph, lower_graph
from autoshard.codegen.parallelize import (
    ParallelInfo,
    full_grads,
    full_state_dict,
    gather_outputs,
    load_full_state_dict,
    parallel_info,
    parallelize,
    plan_cluster,
    shard_inputs,
)

__all__ = [
    "LoweredGraph",
    "MeshComm",
    "ParallelInfo",
    "PlanMismatchError",
    "assign_strategies",
    "full_grads",
    "full_state_dict",
    "gather_outputs",
    "load_full_state_dict",
    "lower_graph",
    "parallel_info",
    "parallelize",
    "plan_cluster",
    "redistribute",
    "shard_inputs",
]
