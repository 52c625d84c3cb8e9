"""The one registry of sharding rules, and the functions the planner calls.

A rule is ``fn(node, mesh_shape) -> list[OpStrategy]``; it reads shapes and dtypes only from
``node.meta["val"]`` (a FakeTensor, or a tuple of them; ``torch.export`` always sets it).  Rules register with
one decorator, keyed by ATen ``OpOverload`` (``torch.ops.aten.mm.default``), ``OpOverloadPacket``
(``torch.ops.aten.mm``: every overload), a qualified name for ops of optional libraries
(``"transformers::grouped_mm_fallback"``, so the core never imports them) or a Python callable
(``operator.getitem``)::

    @register(torch.ops.aten.mm.default, local_args=None)
    def mm(node, mesh_shape): ...

Rule modules are imported by name in ``autoshard/strategies/__init__.py``.

Planner API:

- :func:`strategies_for` -- the candidate strategies of a node, in a deterministic order, never empty: an op
  without a rule falls back to replicate-only and warns once (:class:`UnsupportedOpWarning`), naming the op and
  the user module (``node.meta["autoshard_module"]`` if capture set it, else the last entry of
  ``node.meta["nn_module_stack"]``).  ``placeholder``/``get_attr`` nodes get every spec of R/S per axis;
  nodes whose value holds no tensor (``sym_size``, asserts) get one all-``None`` strategy.
- :func:`local_call` -- what one device runs for a node under a strategy (the rule's ``local_args`` hook).
- :func:`has_rule`, :func:`missing_rules` -- coverage checks.

Reads ``node.meta["val"]``, ``node.meta["nn_module_stack"]``, ``node.meta["autoshard_module"]``; writes nothing.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx

from autoshard.errors import ShardingError
from autoshard.placement import Partial, ShardingSpec
from autoshard.strategies.local import LocalArgsFn, LocalCall, LocalContext, default_call
from autoshard.strategies.strategy import OpStrategy, output_vals

__all__ = [
    "Rule",
    "RuleEntry",
    "UnsupportedOpWarning",
    "has_rule",
    "local_call",
    "lookup",
    "missing_rules",
    "register",
    "register_node_kind",
    "registered_targets",
    "replicate_strategy",
    "strategies_for",
]

Rule = Callable[[fx.Node, tuple[int, ...]], list[OpStrategy]]
Target = object  # OpOverload, OpOverloadPacket, "ns::name[.overload]" or a Python callable


class UnsupportedOpWarning(UserWarning):
    """An op has no sharding rule; it was planned replicate-only."""


@dataclass(frozen=True, slots=True)
class RuleEntry:
    """A registered rule and its optional ``local_args`` hook."""

    rule: Rule
    local_args: LocalArgsFn | None
    name: str


_RULES: dict[object, RuleEntry] = {}
_NODE_KINDS: dict[str, RuleEntry] = {}


def _key(target: Target) -> object:
    """Registry key: ``"aten::mm.default"`` for an overload, ``"aten::mm"`` for a packet, else the object."""
    if isinstance(target, torch._ops.OpOverload):
        return f"{target._schema.name}.{target._overloadname}"
    if isinstance(target, torch._ops.OpOverloadPacket):
        return target._qualified_op_name
    return target


def register(*targets: Target, local_args: LocalArgsFn | None = None) -> Callable[[Rule], Rule]:
    """Register ``fn`` as the rule of every target; registering a target twice is an error."""

    def deco(fn: Rule) -> Rule:
        for t in targets:
            key = _key(t)
            if key in _RULES:
                raise ValueError(f"{t} already has rule {_RULES[key].name}; remove one of the registrations")
            _RULES[key] = RuleEntry(fn, local_args, f"{fn.__module__}.{fn.__name__}")
        return fn

    return deco


def register_node_kind(*ops: str) -> Callable[[Rule], Rule]:
    """Register the rule of non-call nodes (``"placeholder"``, ``"get_attr"``)."""

    def deco(fn: Rule) -> Rule:
        for op in ops:
            _NODE_KINDS[op] = RuleEntry(fn, None, f"{fn.__module__}.{fn.__name__}")
        return fn

    return deco


def lookup(target: Target) -> RuleEntry | None:
    """The rule of ``target``: its exact overload first, then its packet."""
    entry = _RULES.get(_key(target))
    if entry is None and isinstance(target, torch._ops.OpOverload):
        entry = _RULES.get(_key(target.overloadpacket))
    return entry


def has_rule(target: Target) -> bool:
    return lookup(target) is not None


def registered_targets() -> list[object]:
    """Every registry key, in registration order (for coverage tests)."""
    return list(_RULES)


# -- planner API -----------------------------------------------------------------------------------------------


def _has_tensor(val: object) -> bool:
    if isinstance(val, torch.Tensor):
        return True
    return isinstance(val, tuple | list) and any(_has_tensor(v) for v in val)


def _is_scalar_node(node: fx.Node) -> bool:
    """A node whose value and inputs hold no tensor (SymInt arithmetic, asserts on scalars)."""
    return not _has_tensor(node.meta.get("val")) and not any(
        _has_tensor(n.meta.get("val")) for n in node.all_input_nodes
    )


def strategies_for(
    node: fx.Node, mesh_shape: Sequence[int], *, drop_dominated: bool = True
) -> list[OpStrategy]:
    """The candidate strategies of ``node`` on ``mesh_shape`` (deterministic order, never empty).

    With ``drop_dominated`` (the default), strategies that need a ``Partial`` input on an axis from placeholder
    or ``get_attr`` nodes alone are dropped: such a node never holds a Partial value, and the same strategy
    with that axis replicated yields an output at least as useful.  The numeric harness turns this off to check them.
    """
    mesh = tuple(int(n) for n in mesh_shape)
    if node.op == "output":
        raise ShardingError(f"{node} is the graph output: it has no strategies; the planner handles it")
    entry = _NODE_KINDS.get(node.op) if node.op != "call_function" else lookup(node.target)
    if entry is None and node.op == "call_function" and _is_scalar_node(node):
        return [_scalar_strategy(node)]
    if entry is None:
        _warn_unsupported(node)
        return [replicate_strategy(node, mesh)]
    result = entry.rule(node, mesh)
    if drop_dominated:
        result = _drop_partial_from_leaf(node, result)
    if not result:  # a rule whose every strategy needs sizes that do not divide
        return [replicate_strategy(node, mesh)]
    return result


def replicate_strategy(node: fx.Node, mesh_shape: tuple[int, ...]) -> OpStrategy:
    """All tensor inputs and outputs replicated, no split of work."""
    r = ShardingSpec.replicate(len(mesh_shape))
    ins = tuple(r if _has_tensor(n.meta.get("val")) else None for n in node.all_input_nodes)
    outs = tuple(r if isinstance(v, torch.Tensor) else None for v in output_vals(node))
    grads = tuple(
        r if isinstance(v := n.meta.get("val"), torch.Tensor) and v.is_floating_point() else None
        for n in node.all_input_nodes
    )
    return OpStrategy(ins, outs, grads, 1)


def _scalar_strategy(node: fx.Node) -> OpStrategy:
    n_in = len(node.all_input_nodes)
    return OpStrategy((None,) * n_in, (None,) * len(output_vals(node)), (None,) * n_in, 1)


def _drop_partial_from_leaf(node: fx.Node, strategies: list[OpStrategy]) -> list[OpStrategy]:
    """The strategies but those Partial on an axis in placeholder or ``get_attr`` inputs alone.  A leaf
    Partial beside a computed one on the same axis is kept: ``x + h`` with ``x`` a pipeline stage's received
    hidden states and ``h`` a row-split projection's sum runs ``P, P -> P`` with the leaf's ``R -> P`` a free
    local step, where replicating the axis would reduce ``h``."""
    leaves = [k for k, inp in enumerate(node.all_input_nodes) if inp.op in ("placeholder", "get_attr")]
    if not leaves:
        return strategies
    partial: dict[ShardingSpec, frozenset[int]] = {}  # isinstance on torch placements is slow: once per spec

    def axes(spec: ShardingSpec | None) -> frozenset[int]:
        if spec is None:
            return frozenset()
        found = partial.get(spec)
        if found is None:
            found = partial[spec] = frozenset(
                a for a, p in enumerate(spec.placements) if isinstance(p, Partial)
            )
        return found

    others = [k for k in range(len(node.all_input_nodes)) if k not in leaves]
    kept = []
    for s in strategies:
        mine = frozenset().union(*(axes(s.inputs[k]) for k in leaves))
        if not mine or mine <= frozenset().union(*(axes(s.inputs[k]) for k in others)):
            kept.append(s)
    return kept


def module_path(node: fx.Node) -> str:
    """The user module a node came from, or ``"<unknown module>"``."""
    path = node.meta.get("autoshard_module")
    if isinstance(path, str):
        return path
    stack = node.meta.get("nn_module_stack")
    if isinstance(stack, dict) and stack:
        last = list(stack.values())[-1]
        if isinstance(last, tuple | list) and last:
            return str(last[0]) or "<root>"
    return "<unknown module>"


def _user_module(path: str) -> str:
    return f"module {path}" if path not in ("", "<root>", "<unknown module>") else "the model's own forward"


def _warn_unsupported(node: fx.Node) -> None:
    warnings.warn(
        f"no sharding rule for {node.target} (graph node {node.name!r} in "
        f"{_user_module(module_path(node))}); it runs replicated on every device: correct, but nothing of it "
        "is split",
        UnsupportedOpWarning,
        stacklevel=3,
    )


def missing_rules(graph_module: fx.GraphModule) -> list[str]:
    """Names of the ops in ``graph_module`` that have no rule (sorted, each once).

    Nodes that compute no tensor from no tensor (SymInt arithmetic) are not counted; a higher-order op that
    capture failed to inline is (it would run replicated).
    """
    missing = {
        str(n.target)
        for n in graph_module.graph.nodes
        if n.op == "call_function" and not has_rule(n.target) and not _is_scalar_node(n)
    }
    return sorted(missing)


def local_call(
    node: fx.Node,
    strategy: OpStrategy,
    mesh_shape: Sequence[int],
    coord: Sequence[int],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    zigzag_axis: int | None = None,
) -> LocalCall:
    """What device ``coord`` runs for ``node`` under ``strategy``, given its local ``args``/``kwargs``
    (``zigzag_axis``: the mesh axis whose splits use the load-balanced layout, :mod:`autoshard.codegen.context`)."""
    ctx = LocalContext(
        node, strategy, tuple(mesh_shape), tuple(coord), tuple(args), dict(kwargs), zigzag_axis
    )
    entry = lookup(node.target) if node.op == "call_function" else None
    hook = entry.local_args if entry is not None and entry.local_args is not None else default_call
    return hook(ctx)
