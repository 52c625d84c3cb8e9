"""Graph-structural nodes: placeholders, ``get_attr``, ``getitem``, and nodes that compute no tensor.

- **placeholder** / **get_attr** (parameters, buffers, user inputs): any spec that divides, per axis ``R`` or
  ``S(d)`` for each dim -- never ``P`` (a leaf value is whole).  A weight ``(N, K)`` on mesh (2, 2) has up to
  9 specs.
- **getitem** on a tuple-valued node (``topk``, ``split``, ``native_layer_norm``): one strategy per distinct
  spec that the producer's strategies give the selected element; ``inputs[0]`` is the spec of that *element*
  (not of the whole tuple), ``outputs[0]`` the same spec -- the planner links it to
  ``producer.outputs[index]``.
- **sym_size** / **sym_numel** / **sym_stride** and asserts read only metadata: inputs unconstrained, no
  tensor out.  ``item``/``_local_scalar_dense`` read a value, so their input must be replicated.
"""

from __future__ import annotations

import operator

import torch
from torch import fx

from autoshard.placement import Replicate, Shard, ShardingSpec
from autoshard.strategies.registry import register, register_node_kind, strategies_for
from autoshard.strategies.strategy import AxisChoice, OpStrategy, expand, grad_spec, output_vals, tensor_meta

aten = torch.ops.aten


@register_node_kind("placeholder", "get_attr")
def placeholder(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    val = tensor_meta(node)
    ndim = val.dim() if val is not None else 0
    choices = [AxisChoice((), (Replicate(),), False)] + [
        AxisChoice((), (Shard(d),), False) for d in range(ndim)
    ]
    return expand(node, (), choices, mesh_shape)


@register(operator.getitem)
def getitem(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    producer, index = node.args[0], node.args[1]
    assert isinstance(producer, fx.Node) and isinstance(index, int)
    element = output_vals(node)[0]
    if not isinstance(element, torch.Tensor) or not isinstance(producer.meta.get("val"), tuple | list):
        r = ShardingSpec.replicate(len(mesh_shape)) if isinstance(element, torch.Tensor) else None
        return [OpStrategy((r,), (r,), (None,), 1)]
    specs: list[ShardingSpec] = []
    for s in strategies_for(producer, mesh_shape):
        spec = s.outputs[index]
        if spec is not None and spec not in specs:
            specs.append(spec)
    return [OpStrategy((s,), (s,), (grad_spec(s, (s,), element, False),), 1) for s in specs]


@register(
    aten.sym_size.int, aten.sym_size.default, aten.sym_numel.default, aten.sym_stride.int,
    aten.sym_stride.default, aten.sym_storage_offset.default, aten._assert_tensor_metadata.default,
    aten._assert_scalar.default, aten.sym_constrain_range_for_size.default,
)  # fmt: skip
def metadata(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    """Reads shapes or asserts: every input unconstrained, no tensor output."""
    n = len(node.all_input_nodes)
    return [OpStrategy((None,) * n, (None,) * len(output_vals(node)), (None,) * n, 1)]


@register(aten._local_scalar_dense.default, aten.item.default)
def item(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    """Reads a value: its tensor must be whole on every device."""
    r = ShardingSpec.replicate(len(mesh_shape))
    ins = tuple(r if tensor_meta(n) is not None else None for n in node.all_input_nodes)
    return [OpStrategy(ins, (None,), (None,) * len(ins), 1)]
