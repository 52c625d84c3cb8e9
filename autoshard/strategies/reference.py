"""The numeric harness's reference: one op on whole inputs, its gradients, and how pieces are compared to them.

:mod:`autoshard.strategies.validate` checks each strategy against what this module computes once per node:

- :func:`build_node`: a one-node graph around an op and example tensors (``meta["val"]`` holds real tensors);
- :class:`Whole`: the op's outputs on the whole inputs and, per set of differentiated inputs, the gradients a
  fixed random output gradient gives;
- :func:`compare`: an assembled result against the reference, with a tolerance from the least precise dtype
  (:func:`tolerance`); ops whose values are undefined (``empty``) compare shapes and dtypes only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx
from torch.fx.node import map_arg

__all__ = [
    "UNDEFINED_VALUES", "Grads", "Whole", "as_tuple", "build_node", "clone", "compare", "run_whole", "tolerance"
]  # fmt: skip


def build_node(
    op: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any] | None = None
) -> tuple[fx.Node, dict[fx.Node, Any]]:
    """A graph with one placeholder per distinct example tensor and one ``call_function`` node of ``op``.

    Returns the node and the value of each input node.  ``meta["val"]`` holds real tensors (rules read only
    their shapes and dtypes).
    """
    graph = fx.Graph()
    values: dict[fx.Node, Any] = {}
    by_id: dict[int, fx.Node] = {}

    def lift(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            if id(v) not in by_id:
                ph = graph.placeholder(f"in{len(by_id)}")
                ph.meta["val"] = v
                by_id[id(v)] = ph
                values[ph] = v
            return by_id[id(v)]
        if isinstance(v, list | tuple):
            return type(v)(lift(x) for x in v)
        return v

    node_args = lift(tuple(args))
    node_kwargs = {k: lift(v) for k, v in (kwargs or {}).items()}
    node = graph.call_function(op, node_args, node_kwargs)
    node.meta["val"] = run_whole(node, values)
    graph.output(node)
    return node, values


def clone(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return v.clone()
    if isinstance(v, list | tuple):
        return type(v)(clone(x) for x in v)
    return v


def run_whole(
    node: fx.Node, values: dict[fx.Node, Any], leaves: dict[fx.Node, torch.Tensor] | None = None
) -> Any:
    def value(n: fx.Node) -> Any:
        if leaves is not None and n in leaves:
            return leaves[n].clone()
        return clone(values[n])

    assert callable(node.target)
    return node.target(*map_arg(node.args, value), **map_arg(node.kwargs, value))


def as_tuple(v: Any) -> tuple[Any, ...]:
    return tuple(v) if isinstance(v, tuple | list) else (v,)


def tolerance(tensors: Sequence[object]) -> tuple[float, float]:
    """``(rtol, atol)`` for the least precise floating dtype among ``tensors`` (inputs and outputs of an op:
    Partial addends of a float32 input carry float32 rounding even into a float64 output)."""
    floats = [t.dtype for t in tensors if isinstance(t, torch.Tensor) and t.is_floating_point()]
    if all(d == torch.float64 for d in floats):
        return 1e-7, 1e-9
    if all(d in (torch.float64, torch.float32) for d in floats):
        return 1e-4, 1e-4  # Partial addends of magnitude ~1 carry float32 rounding into every piece
    return 2e-2, 2e-2


UNDEFINED_VALUES = frozenset(
    {
        "aten.empty.memory_format",
        "aten.new_empty.default",
        "aten.empty_like.default",
        "aten.empty_strided.default",
    }
)
"""Ops whose output values are undefined: only shapes and dtypes are compared."""


def compare(
    got: Any, want: Any, tol: tuple[float, float], shape_only: bool = False
) -> tuple[bool, float, str]:
    if not isinstance(want, torch.Tensor):
        return True, 0.0, ""
    if not isinstance(got, torch.Tensor) or got.shape != want.shape or got.dtype != want.dtype:
        shape = getattr(got, "shape", type(got).__name__)
        return (
            False,
            float("inf"),
            f"shape {tuple(shape)} / {getattr(got, 'dtype', '')} != {tuple(want.shape)} / {want.dtype}",
        )
    if shape_only:
        return True, 0.0, ""
    if not (want.is_floating_point() or want.is_complex()):
        same = torch.equal(got, want)
        return same, 0.0 if same else float("inf"), "" if same else "integer values differ"
    rtol, atol = tol
    err = float((got.detach() - want.detach()).abs().max()) if want.numel() else 0.0
    ok = torch.allclose(got.detach(), want.detach(), rtol=rtol, atol=atol, equal_nan=True)
    return ok, err, "" if ok else f"max error {err:.3g}"


class Whole:
    """The op on whole inputs: its outputs and, per set of differentiated inputs, its gradients (computed once
    per node, shared by every strategy's check)."""

    def __init__(self, node: fx.Node, values: dict[fx.Node, Any], seed: int) -> None:
        self.node, self.values, self.seed = node, values, seed
        self.outputs = as_tuple(run_whole(node, values))
        flat = [x for v in values.values() for x in (v if isinstance(v, tuple | list) else (v,))]
        self.tol = tolerance([*flat, *self.outputs])
        self._grads: dict[tuple[fx.Node, ...], Grads | None] = {}

    def grads(self, diff: tuple[fx.Node, ...]) -> Grads | None:
        """Output gradients (random, fixed per node) and the input gradients they give; None if no backward."""
        if diff not in self._grads:
            self._grads[diff] = self._backward(diff)
        return self._grads[diff]

    def _backward(self, diff: tuple[fx.Node, ...]) -> Grads | None:
        leaves = {inp: self.values[inp].detach().clone().requires_grad_() for inp in diff}
        gen = torch.Generator().manual_seed(self.seed + 7)
        try:
            outs = as_tuple(run_whole(self.node, self.values, leaves))
            live = tuple(j for j, o in enumerate(outs) if isinstance(o, torch.Tensor) and o.requires_grad)
            if not live:
                return None
            grads_out = {j: torch.randn(outs[j].shape, generator=gen, dtype=outs[j].dtype) for j in live}
            want = torch.autograd.grad([outs[j] for j in live], list(leaves.values()),
                                       [grads_out[j] for j in live], allow_unused=True)  # fmt: skip
        except RuntimeError as e:
            if "derivative" in str(e) or "not differentiable" in str(e):
                return None  # the op itself has no backward: nothing to check
            raise
        expected = {
            inp: g if g is not None else torch.zeros_like(leaves[inp])
            for inp, g in zip(diff, want, strict=True)
        }
        return Grads(live, grads_out, expected)


@dataclass(frozen=True, slots=True)
class Grads:
    live: tuple[int, ...]
    grads_out: dict[int, torch.Tensor]
    expected: dict[fx.Node, torch.Tensor]
