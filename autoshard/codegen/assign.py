"""Read a plan's decisions back onto a capture of the model: one :class:`OpStrategy` per graph node.

Input: a :class:`~autoshard.capture.Captured` of the model with every layer in the graph
(``capture(..., blocks="full")``) and a :class:`~autoshard.plans.Plan`, usually made on a capture cut to two
layers.  Output: ``{node name: OpStrategy}`` for every placeholder and ``call_function`` node.

Plans name nodes by a key that survives re-capture (``NodePlan.key``): ``"block:<p>"`` is the decision every
repeated layer shares for its node at position ``p`` (``META_BLOCK``), ``"outside:<i>"`` the ``i``-th other
node in graph order.  A plan without block keys (nothing was collapsed) names every node ``"outside:<i>"``.
Each decision is checked: same op, and a strategy of :func:`~autoshard.strategies.strategies_for` printing
exactly as the plan's label.  Any difference means the model is not the one planned: :class:`PlanMismatchError`.

Reads ``META_BLOCK`` (through :func:`autoshard.problem.graph.describe`); writes nothing.

Example::

    cap = capture(model, args, blocks="full")
    strategies = assign_strategies(cap, plan)        # {"linear": OpStrategy(R, S(0), S(0) -> S(1)), ...}
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import fx

from autoshard.capture import Captured
from autoshard.errors import AutoshardError
from autoshard.plans import NodePlan, Plan
from autoshard.problem.graph import NodeInfo, describe
from autoshard.strategies import OpStrategy, strategies_for

__all__ = ["PlanMismatchError", "PlanMismatchWarning", "assign_strategies", "node_keys"]


class PlanMismatchError(AutoshardError, ValueError):
    """The model (or its example inputs) is not the one the plan was made for."""


class PlanMismatchWarning(UserWarning):
    """The emitted module is correct but does not run the collectives the plan priced."""


def node_keys(infos: tuple[NodeInfo, ...], by_block: bool) -> dict[str, str]:
    """The plan key of every node: ``block:<position>`` for repeated-layer nodes when ``by_block``, else
    ``outside:<i>`` counting the other nodes in graph order (as :mod:`autoshard.problem.extract` does)."""
    keys: dict[str, str] = {}
    outside = 0
    for info in infos:
        if by_block and info.block is not None:
            keys[info.name] = f"block:{info.block[1]}"
        else:
            keys[info.name] = f"outside:{outside}"
            outside += 1
    return keys


def assign_strategies(captured: Captured, plan: Plan) -> dict[str, OpStrategy]:
    """The plan's strategy for every placeholder and ``call_function`` node of ``captured`` (module doc)."""
    gm = captured.graph_module
    infos = describe(gm)
    decisions = {n.key: n for n in plan.nodes}
    by_block = any(key.startswith("block:") for key in decisions)
    if by_block and not any(info.block is not None for info in infos):
        raise PlanMismatchError(
            f"the plan shares decisions across repeated layers ({plan.model}), but the capture found no "
            "repeated layers: capture the same model with blocks='full' (or re-plan with blocks=None)"
        )
    keys = node_keys(infos, by_block)
    _check_outside_count(keys, decisions, plan)
    nodes: dict[str, fx.Node] = {n.name: n for n in gm.graph.nodes}
    chosen: dict[str, OpStrategy] = {}
    for info in infos:
        decision = decisions.get(keys[info.name])
        if decision is None:
            raise PlanMismatchError(
                f"graph node {info.name} ({info.target}{_where(info)}) has no decision in the plan (key "
                f"{keys[info.name]}): the model differs from the planned one; re-plan it"
            )
        chosen[info.name] = _pick(nodes[info.name], info, decision, plan.mesh_shape)
    return chosen


def _check_outside_count(keys: Mapping[str, str], decisions: Mapping[str, NodePlan], plan: Plan) -> None:
    ours = sum(1 for k in keys.values() if k.startswith("outside:"))
    theirs = sum(1 for k in decisions if k.startswith("outside:"))
    if ours != theirs:
        raise PlanMismatchError(
            f"the capture has {ours} nodes outside repeated layers, the plan for {plan.model} has {theirs}: "
            "the model or its example inputs differ from the planned ones (same shapes and dtypes needed); "
            "re-plan with these inputs"
        )


def _pick(node: fx.Node, info: NodeInfo, decision: NodePlan, mesh_shape: tuple[int, ...]) -> OpStrategy:
    if decision.target != info.target:
        raise PlanMismatchError(
            f"graph node {info.name}{_where(info)} runs {info.target}, but the plan's decision {decision.key} is for "
            f"{decision.target} ({decision.name}): the model differs from the planned one; re-plan it"
        )
    candidates = strategies_for(node, mesh_shape)
    for strategy in candidates:
        if str(strategy) == decision.strategy:
            return strategy
    shown = ", ".join(repr(str(s)) for s in candidates[:6]) + (" ..." if len(candidates) > 6 else "")
    raise PlanMismatchError(
        f"graph node {info.name} ({info.target}{_where(info)}): the plan chose {decision.strategy!r}, which is not a "
        f"strategy of this node on mesh {mesh_shape} (it has {shown}); the tensor shapes differ from the "
        "planned ones or the sharding rules changed since planning: re-plan"
    )


def _where(info: NodeInfo) -> str:
    where = info.fqn or info.module
    return f" in {where}" if where else ""
