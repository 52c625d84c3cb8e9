"""What one device runs for a node under a chosen strategy: the ``local_args`` hook of a rule.

Most ops run unchanged on their local pieces.  Some carry global sizes in their arguments (``view`` sizes,
``expand`` sizes, ``arange`` ends) or compute something different per device (vocab-parallel ``embedding``
looks up only its vocab range; a ``mean`` over a split dim divides by the global count).  Their rule is
registered with a hook, ``register(..., local_args=fn)``; codegen and the numeric harness both call it through
:func:`autoshard.strategies.registry.local_call`, so what the harness proves is what codegen emits.

A hook receives a :class:`LocalContext` -- the node, the strategy, the mesh, the device's coordinate and the
node's arguments with every input node replaced by that device's local value -- and returns a
:class:`LocalCall`.  It must treat tensor arguments as opaque (in codegen they are fx nodes): it may move them
and read their specs and global shapes from the context, never their values.

Example (``view`` sizes follow the output spec)::

    ctx.args == (x_local, [2, 8, -1, 8])  and  strategy ``S(2) -> S(2)`` on mesh (2,)
    hook -> LocalCall(aten.view.default, (x_local, [2, 8, 2, 8]), {})
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx

from autoshard.errors import ShardingError
from autoshard.placement import Shard, ShardingSpec
from autoshard.strategies.strategy import OpStrategy, output_vals, tensor_meta

__all__ = [
    "LocalArgsFn",
    "LocalCall",
    "LocalContext",
    "bind",
    "default_call",
    "shard_intervals",
    "shard_range",
    "with_arg",
    "zigzag_chunks",
]


@dataclass(frozen=True, slots=True)
class LocalCall:
    """``target(*args, **kwargs)`` is what one device runs."""

    target: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)

    def run(self) -> Any:
        return self.target(*self.args, **self.kwargs)


@dataclass(frozen=True, slots=True)
class LocalContext:
    """Everything a ``local_args`` hook may use (see module doc)."""

    node: fx.Node
    strategy: OpStrategy
    mesh_shape: tuple[int, ...]
    coord: tuple[int, ...]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    zigzag_axis: int | None = None  # the mesh axis whose splits are load-balanced (codegen/context.py)

    @property
    def target(self) -> Callable[..., Any]:
        """The node's op (what runs when no hook changes it)."""
        target = self.node.target
        assert callable(target), f"{self.node} has no callable target"
        return target

    def input_spec(self, node: object) -> ShardingSpec | None:
        """The strategy's spec of input ``node`` (None if it is not an input node)."""
        for inp, spec in zip(self.node.all_input_nodes, self.strategy.inputs, strict=True):
            if inp is node:
                return spec
        return None

    def output_spec(self, i: int = 0) -> ShardingSpec:
        spec = self.strategy.outputs[i]
        return spec if spec is not None else ShardingSpec.replicate(len(self.mesh_shape))

    def global_out_shape(self, i: int = 0) -> tuple[int, ...]:
        val = output_vals(self.node)[i]
        assert isinstance(val, torch.Tensor), f"output {i} of {self.node} is not a tensor"
        return tuple(int(s) for s in val.shape)

    def local_out_shape(self, i: int = 0) -> tuple[int, ...]:
        """The shape of this device's piece of output ``i``."""
        return self.output_spec(i).local_shape(self.global_out_shape(i), self.mesh_shape)

    def out_range(self, dim: int, i: int = 0) -> tuple[int, int]:
        """``(start, length)`` of this device's piece of output ``i`` along ``dim``."""
        return shard_range(
            self.output_spec(i),
            dim,
            self.global_out_shape(i)[dim],
            self.mesh_shape,
            self.coord,
            self.zigzag_axis,
        )

    def out_intervals(self, dim: int, i: int = 0) -> tuple[tuple[int, int], ...]:
        """``(start, length)`` runs, in local order, of this device's piece of output ``i`` along ``dim``."""
        size = self.global_out_shape(i)[dim]
        return shard_intervals(self.output_spec(i), dim, size, self.mesh_shape, self.coord, self.zigzag_axis)

    def in_range(self, node: fx.Node, dim: int) -> tuple[int, int]:
        """``(start, length)`` of this device's piece of input ``node`` along ``dim``."""
        val = tensor_meta(node)
        spec = self.input_spec(node)
        assert val is not None and spec is not None, (
            f"{node} is not a constrained tensor input of {self.node}"
        )
        return shard_range(spec, dim, int(val.shape[dim]), self.mesh_shape, self.coord, self.zigzag_axis)

    def partial_axes_of_output(self, i: int = 0) -> tuple[int, ...]:
        return self.output_spec(i).partial_axes()

    def bound(self) -> dict[str, Any]:
        """The local arguments by schema name, defaults filled in."""
        return bind(self.node.target, self.args, self.kwargs)


LocalArgsFn = Callable[[LocalContext], LocalCall]


def default_call(ctx: LocalContext) -> LocalCall:
    """Run the op itself on the local pieces."""
    return LocalCall(ctx.target, ctx.args, dict(ctx.kwargs))


def zigzag_chunks(rank: int, size: int) -> tuple[int, int]:
    """The two of ``2 * size`` chunks that member ``rank`` holds under the zigzag (load-balanced) layout."""
    return rank, 2 * size - 1 - rank


def shard_intervals(
    spec: ShardingSpec,
    dim: int,
    size: int,
    mesh_shape: Sequence[int],
    coord: Sequence[int],
    zigzag_axis: int | None = None,
) -> tuple[tuple[int, int], ...]:
    """``(start, length)`` runs of ``dim`` (global ``size``) that device ``coord`` holds, in local order.

    Axes sharding the same dim split it outer axis first, as in :mod:`autoshard.local_mesh`: each axis cuts
    the piece its outer axes left.  A contiguous axis keeps block ``k`` of ``n``; the ``zigzag_axis`` keeps
    chunks ``k`` and ``2n - 1 - k`` of ``2n`` (:func:`zigzag_chunks`), so that piece is two runs.
    """
    runs: list[tuple[int, int]] = [(0, size)]
    for axis, p in enumerate(spec.placements):
        if not (isinstance(p, Shard) and p.dim == dim):
            continue
        n, k = mesh_shape[axis], coord[axis]
        held = sum(length for _, length in runs)
        if axis == zigzag_axis:
            chunk = held // (2 * n)
            runs = [r for c in zigzag_chunks(k, n) for r in _cut(runs, c * chunk, chunk)]
        else:
            runs = _cut(runs, k * (held // n), held // n)
    return tuple(runs)


def _cut(runs: list[tuple[int, int]], offset: int, length: int) -> list[tuple[int, int]]:
    """The runs of positions ``[offset, offset + length)`` of the concatenation of ``runs``."""
    out: list[tuple[int, int]] = []
    for start, n in runs:
        lo, hi = max(offset, 0), min(offset + length, n)
        if lo < hi:
            out.append((start + lo, hi - lo))
        offset -= n
    return out


def shard_range(
    spec: ShardingSpec,
    dim: int,
    size: int,
    mesh_shape: Sequence[int],
    coord: Sequence[int],
    zigzag_axis: int | None = None,
) -> tuple[int, int]:
    """``(start, length)`` of the piece of ``dim`` (global ``size``) that device ``coord`` holds under ``spec``.

    Axes sharding the same dim split it outer axis first, as in :mod:`autoshard.local_mesh`.  Raises
    :class:`~autoshard.errors.ShardingError` when the piece is not one run (a zigzag split: use
    :func:`shard_intervals`).
    """
    runs = shard_intervals(spec, dim, size, mesh_shape, coord, zigzag_axis) or ((0, 0),)
    if len(runs) != 1:
        raise ShardingError(
            f"dim {dim} of {spec} is split in the zigzag layout on mesh axis {zigzag_axis}, so a device holds "
            f"{len(runs)} runs {runs}, and this op needs one: plan with cp_layout='contiguous'"
        )
    return runs[0]


# -- argument access by schema name --------------------------------------------------------------------------


def _schema_args(target: object) -> list[Any] | None:
    schema = getattr(target, "_schema", None)
    return list(schema.arguments) if schema is not None else None


def bind(target: object, args: Sequence[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """Arguments of an ATen-style call by schema name, with schema defaults filled in.

    Targets without a schema (plain Python callables) bind positionally as ``arg0``, ``arg1``, ...
    """
    schema = _schema_args(target)
    if schema is None:
        return {f"arg{i}": a for i, a in enumerate(args)} | dict(kwargs)
    bound: dict[str, Any] = {}
    for i, a in enumerate(schema):
        if not a.kwarg_only and i < len(args):
            bound[a.name] = args[i]
        elif a.name in kwargs:
            bound[a.name] = kwargs[a.name]
        elif a.has_default_value():
            bound[a.name] = a.default_value
        else:
            bound[a.name] = None
    return bound


def with_arg(
    target: object, args: Sequence[Any], kwargs: dict[str, Any], name: str, value: Any
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``(args, kwargs)`` with argument ``name`` set to ``value`` where it was given (or as a keyword)."""
    schema = _schema_args(target)
    new_args, new_kwargs = list(args), dict(kwargs)
    if schema is not None:
        for i, a in enumerate(schema):
            if a.name == name and not a.kwarg_only and i < len(args):
                new_args[i] = value
                return tuple(new_args), new_kwargs
    new_kwargs[name] = value
    return tuple(new_args), new_kwargs
