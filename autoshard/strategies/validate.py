"""The numeric harness: proves every strategy of a rule on a simulated mesh, forward and backward.

For each strategy that :func:`~autoshard.strategies.registry.strategies_for` yields for a node (with
``drop_dominated=False``, so Partial inputs are checked too):

1. split each input per its spec with :func:`autoshard.local_mesh.distribute` (Partial inputs become random
   addends, so a rule that wrongly passes Partial through a nonlinear op fails);
2. run, on every device, what :func:`~autoshard.strategies.registry.local_call` says (the rule's
   ``local_args`` hook: localised sizes, masked lookups) on that device's pieces;
3. assemble each output per its spec and compare with the op on the whole inputs (replicated axes must
   agree across devices);
4. backward: feed each device the output gradient in the output's dual spec (``S -> S``, ``R -> R``,
   ``P -> R``), differentiate locally, assemble each input's gradient per ``input_grads`` and compare with the
   whole op's gradient.

Use float64 inputs for tight tolerances (float32 is checked looser).  Ops that draw random numbers (dropout
with ``p > 0``) cannot match and should be checked with ``p = 0``.

Example::

    >>> import torch
    >>> report = check_rule(torch.ops.aten.mm.default, (torch.randn(4, 6, dtype=torch.float64),
    ...                     torch.randn(6, 2, dtype=torch.float64)), (2,))
    >>> report.ok, len(report.checks)
    (True, 6)
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx
from torch.fx.node import map_arg

from autoshard.local_mesh import Coord, assemble, coords, distribute, replicas_agree
from autoshard.placement import Partial, Replicate, ShardingSpec
from autoshard.strategies.reference import UNDEFINED_VALUES, Whole, as_tuple, build_node, clone, compare
from autoshard.strategies.registry import local_call, strategies_for
from autoshard.strategies.strategy import OpStrategy

__all__ = ["RuleReport", "StrategyCheck", "build_node", "check_rule", "check_strategy"]


@dataclass(frozen=True, slots=True)
class StrategyCheck:
    """The verdict on one strategy; ``backward_ok`` is None when no gradient was checked."""

    strategy: str
    forward_ok: bool
    backward_ok: bool | None
    max_error: float
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.forward_ok and self.backward_ok is not False


@dataclass(frozen=True, slots=True)
class RuleReport:
    """All checks of one node on one mesh; ``n_strategies`` counts strategies before any sampling."""

    op: str
    mesh_shape: tuple[int, ...]
    n_strategies: int
    checks: tuple[StrategyCheck, ...]

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def failures(self) -> tuple[StrategyCheck, ...]:
        return tuple(c for c in self.checks if not c.ok)

    def __str__(self) -> str:
        passed = sum(c.ok for c in self.checks)
        head = f"{self.op} on mesh {self.mesh_shape}: {passed}/{len(self.checks)} checked strategies pass"
        head += f" ({self.n_strategies} in all)"
        lines = [f"  FAIL {c.strategy}: {c.message}" for c in self.failures]
        return "\n".join([head, *lines])


# -- the check -------------------------------------------------------------------------------------------------------


def check_rule(
    node_or_op: fx.Node | Callable[..., Any],
    example_inputs: Sequence[Any],
    mesh_shape: Sequence[int],
    *,
    kwargs: dict[str, Any] | None = None,
    backward: bool = True,
    max_strategies: int | None = None,
    seed: int = 0,
) -> RuleReport:
    """Check every strategy of a rule numerically (module doc).

    ``node_or_op`` is an op (then ``example_inputs`` are its positional args, ``kwargs`` its keyword args) or a
    node of a captured graph (then ``example_inputs`` are the values of ``node.all_input_nodes``).
    ``max_strategies`` checks an evenly spaced sample, first and last included.
    """
    mesh = tuple(int(n) for n in mesh_shape)
    if isinstance(node_or_op, fx.Node):
        node = node_or_op
        values = dict(zip(node.all_input_nodes, example_inputs, strict=True))
    else:
        node, values = build_node(node_or_op, example_inputs, kwargs)
    strategies = strategies_for(node, mesh, drop_dominated=False)
    # a strategy whose local op talks to other ranks (ring attention) cannot run on the simulated mesh: its
    # own test runs it on real gloo ranks (tests/codegen/test_codegen_context.py)
    chosen = _sample([s for s in strategies if not _needs_ranks(node, s, mesh)], max_strategies)
    whole = Whole(node, values, seed)
    checks = tuple(_check_one(node, values, s, mesh, seed + i, backward, whole) for i, s in enumerate(chosen))
    return RuleReport(str(node.target), mesh, len(strategies), checks)


def _needs_ranks(node: fx.Node, strategy: OpStrategy, mesh: tuple[int, ...]) -> bool:
    call = local_call(node, strategy, mesh, (0,) * len(mesh), tuple(node.args), dict(node.kwargs))
    return bool(getattr(call.target, "takes_comm", False))


def check_strategy(
    node: fx.Node,
    values: dict[fx.Node, Any],
    strategy: OpStrategy,
    mesh_shape: Sequence[int],
    *,
    backward: bool = True,
    seed: int = 0,
) -> StrategyCheck:
    """Check one strategy of ``node`` (``values``: the value of each input node), e.g. a hand-written one."""
    return _check_one(node, values, strategy, tuple(int(n) for n in mesh_shape), seed, backward)


def _sample(strategies: list[OpStrategy], k: int | None) -> list[OpStrategy]:
    n = len(strategies)
    if k is None or n <= k:
        return strategies
    if k <= 1:
        return strategies[:1]
    picks = sorted({round(i * (n - 1) / (k - 1)) for i in range(k)})
    return [strategies[i] for i in picks]


def _pieces(
    node: fx.Node, values: dict[fx.Node, Any], strategy: OpStrategy, mesh: tuple[int, ...], seed: int
) -> dict[fx.Node, dict[Coord, Any]]:
    """Every input's value on every device."""
    result: dict[fx.Node, dict[Coord, Any]] = {}
    for i, (inp, spec) in enumerate(zip(node.all_input_nodes, strategy.inputs, strict=True)):
        v = values[inp]
        if spec is not None and isinstance(v, torch.Tensor):
            result[inp] = _distribute(v, spec, mesh, seed * 31 + i)
        elif spec is not None and isinstance(v, tuple | list) and node.target is operator.getitem:
            index = node.args[1]
            assert isinstance(index, int)
            split = _distribute(v[index], spec, mesh, seed * 31 + i)
            result[inp] = {c: tuple(split[c] if j == index else x for j, x in enumerate(v)) for c in split}
        else:
            result[inp] = {c: v for c in coords(mesh)}
    return result


def _distribute(
    v: torch.Tensor, spec: ShardingSpec, mesh: tuple[int, ...], seed: int
) -> dict[Coord, torch.Tensor]:
    """:func:`distribute`, with replicas made identical: ``distribute`` draws a Partial axis's addends afresh
    for each replica group, so under ``(R, P)`` the devices along the replicated axis would disagree."""
    pieces = distribute(v, spec, mesh, seed=seed)
    replicated = [a for a, p in enumerate(spec.placements) if isinstance(p, Replicate)]
    if not spec.partial_axes() or not replicated:
        return pieces
    return {c: pieces[tuple(0 if a in replicated else i for a, i in enumerate(c))] for c in pieces}


def _piece_of(pieces: dict[fx.Node, dict[Coord, Any]], coord: Coord) -> Callable[[fx.Node], Any]:
    """A fresh copy of device ``coord``'s piece of each input (in-place ops must not touch the originals)."""
    return lambda n: clone(pieces[n][coord])


def _run_local(
    node: fx.Node,
    strategy: OpStrategy,
    mesh: tuple[int, ...],
    coord: Coord,
    value: Callable[[fx.Node], Any],
) -> tuple[Any, ...]:
    args = map_arg(node.args, value)
    kwargs = map_arg(node.kwargs, value)
    return as_tuple(local_call(node, strategy, mesh, coord, args, kwargs).run())


def _check_one(
    node: fx.Node,
    values: dict[fx.Node, Any],
    strategy: OpStrategy,
    mesh: tuple[int, ...],
    seed: int,
    backward: bool,
    whole: Whole | None = None,
) -> StrategyCheck:
    name = str(strategy)
    try:
        whole = whole if whole is not None else Whole(node, values, seed)
        pieces = _pieces(node, values, strategy, mesh, seed)
        local = {c: _run_local(node, strategy, mesh, c, _piece_of(pieces, c)) for c in coords(mesh)}
        shape_only = str(node.target) in UNDEFINED_VALUES
        ok, err, msg = _check_outputs(local, whole.outputs, strategy.outputs, mesh, whole.tol, shape_only)
        if not ok:
            return StrategyCheck(name, False, None, err, f"forward: {msg}")
        if not backward:
            return StrategyCheck(name, True, None, err)
        b_ok, b_err, b_msg = _check_backward(node, strategy, mesh, pieces, whole)
        return StrategyCheck(name, True, b_ok, max(err, b_err), f"backward: {b_msg}" if b_ok is False else "")
    except Exception as e:  # a rule that crashes on its own strategy is a failed check, not a crashed harness
        return StrategyCheck(name, False, None, float("inf"), f"{type(e).__name__}: {e}")


def _check_outputs(
    local: dict[Coord, tuple[Any, ...]],
    want: tuple[Any, ...],
    specs: tuple[ShardingSpec | None, ...],
    mesh: tuple[int, ...],
    tol: tuple[float, float],
    shape_only: bool,
) -> tuple[bool, float, str]:
    worst = 0.0
    for j, spec in enumerate(specs):
        if spec is None or not isinstance(want[j], torch.Tensor):
            continue
        per_device = {c: out[j] for c, out in local.items()}
        if not shape_only and not replicas_agree(per_device, spec, mesh, atol=1e-6):
            return False, float("inf"), f"output {j}: replicated pieces differ across devices under {spec}"
        ok, err, msg = compare(assemble(per_device, spec, mesh), want[j], tol, shape_only)
        worst = max(worst, err)
        if not ok:
            return False, err, f"output {j} under {spec}: {msg}"
    return True, worst, ""


def _dual(spec: ShardingSpec) -> ShardingSpec:
    """The layout of an output's gradient: ``S -> S``, ``R -> R``, ``P -> R``."""
    return ShardingSpec(tuple(Replicate() if isinstance(p, Partial) else p for p in spec.placements))


def _local_grads(
    outs: list[torch.Tensor], leaves: dict[fx.Node, torch.Tensor], grads_out: list[torch.Tensor]
) -> Sequence[torch.Tensor | None]:
    if not outs:
        return [None] * len(leaves)
    return torch.autograd.grad(outs, list(leaves.values()), grads_out, allow_unused=True)


def _check_backward(
    node: fx.Node,
    strategy: OpStrategy,
    mesh: tuple[int, ...],
    pieces: dict[fx.Node, dict[Coord, Any]],
    whole: Whole,
) -> tuple[bool | None, float, str]:
    inputs = node.all_input_nodes
    diff = tuple(inp for inp, g in zip(inputs, strategy.input_grads, strict=True) if g is not None)
    if not diff or node.target is operator.getitem:  # getitem: the identity on one element
        return None, 0.0, ""
    ref = whole.grads(diff)
    if ref is None:
        return None, 0.0, ""
    live = [j for j in ref.live if strategy.outputs[j] is not None]
    out_specs = {j: spec for j in live if (spec := strategy.outputs[j]) is not None}
    dual = {j: _distribute(ref.grads_out[j], _dual(out_specs[j]), mesh, 0) for j in live}
    local_grads: dict[fx.Node, dict[Coord, torch.Tensor]] = {inp: {} for inp in diff}
    for c in coords(mesh):
        local_leaves = {inp: pieces[inp][c].detach().clone().requires_grad_() for inp in diff}

        def value(n: fx.Node, c: Coord = c, lv: dict[fx.Node, torch.Tensor] = local_leaves) -> Any:
            return lv[n].clone() if n in lv else clone(pieces[n][c])

        outs_local = _run_local(node, strategy, mesh, c, value)
        used = [j for j in live if outs_local[j].requires_grad]
        grads = _local_grads([outs_local[j] for j in used], local_leaves, [dual[j][c] for j in used])
        for inp, g in zip(diff, grads, strict=True):
            local_grads[inp][c] = g if g is not None else torch.zeros_like(local_leaves[inp])
    worst = 0.0
    for inp in diff:
        spec = strategy.input_grads[inputs.index(inp)]
        assert spec is not None
        if not replicas_agree(local_grads[inp], spec, mesh, atol=1e-6):
            return False, float("inf"), f"grad of {inp.name}: replicated pieces differ under {spec}"
        ok, err, msg = compare(assemble(local_grads[inp], spec, mesh), ref.expected[inp], whole.tol)
        worst = max(worst, err)
        if not ok:
            return False, err, f"grad of {inp.name} under {spec}: {msg}"
    return True, worst, ""
