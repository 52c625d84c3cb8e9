"""Cleaning passes: turn torch.export's pre-dispatch ATen graph into plain ATen ops a planner can read.

Each pass is a function ``GraphModule -> GraphModule`` that edits the graph in place, checks its
postcondition (``graph.lint()`` plus what the pass promises) and recompiles the code (``recompile=False``
leaves that to the caller: :func:`clean` recompiles once).  :func:`clean` runs them in order:

1. :func:`inline_higher_order_ops` — splice the subgraphs of ``wrap_with_set_grad_enabled``,
   ``wrap_with_autocast`` and ``invoke_subgraph`` into the parent graph (HF's RoPE runs under
   ``torch.no_grad`` and arrives as ``wrap_with_set_grad_enabled``).  Writes ``META_NO_GRAD = True`` on
   nodes inlined from a grad-disabled region; copies ``nn_module_stack`` from the higher-order op onto
   inlined nodes that lack one; makes autocast's input casts explicit (``aten.to.dtype``) so the graph
   still computes in the dtypes the region used.
2. :func:`drop_asserts` — remove ``aten._assert_tensor_metadata``, ``aten._assert_scalar`` and other
   assert-like nodes (~130 in LLaMA-3-8B); they compute nothing the planner needs.
3. :func:`drop_identities` — replace by their input: ``dropout`` with ``p == 0`` or ``train=False``,
   ``alias``, and ``to`` conversions whose result has the input's dtype and device (``aten.to`` returns
   its input unchanged then).  Reads ``meta["val"]``.
4. :func:`~autoshard.capture.functionalize.functionalize_slice_assignment` — ``x[..., a:b] = y`` (``copy_``
   into a slice of a computed tensor) as ``slice_scatter``, so readers of ``x`` see the write in the dataflow.
5. :func:`~autoshard.capture.batchnorm.decompose_training_batch_norm` — training batch norm as its
   statistic ops, so a batch split synchronises the statistics (SyncBatchNorm).
6. :func:`~autoshard.capture.experts.fuse_expert_mlps` — a grouped-GEMM expert MLP (two grouped matmuls
   around the gated activation) as one node, so expert parallelism keeps it on the expert's device; then
   :func:`~autoshard.capture.dispatch.fuse_routed_experts` — the whole routed-experts block around it as one
   node, so expert parallelism can dispatch tokens by all-to-all.
7. :func:`eliminate_dead_code` — drop nodes whose values nobody uses (the shape arithmetic that fed the
   asserts, for example).

:func:`merge_placeholders` (tied weights: one placeholder per tensor) needs to know the model; the capture
step computes which placeholders alias and runs it before :func:`clean`.

``cond``/``while_loop``/``map`` carry real control flow and cannot be inlined; they stay, and
:func:`remaining_higher_order_ops` names them so the caller can say so.

Example::

    gm = clean(torch.export.export(model, args, strict=False).graph_module)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import fx

from autoshard.capture.batchnorm import decompose_training_batch_norm
from autoshard.capture.dispatch import fuse_routed_experts
from autoshard.capture.experts import fuse_expert_mlps
from autoshard.capture.functionalize import functionalize_slice_assignment
from autoshard.capture.meta import META_NO_GRAD, op_set

__all__ = [
    "clean",
    "drop_asserts",
    "drop_identities",
    "eliminate_dead_code",
    "inline_higher_order_ops",
    "merge_placeholders",
    "remaining_higher_order_ops",
]

# Higher-order op name -> (index of the subgraph argument, index of the first operand).
INLINE_HOPS = {
    "wrap_with_set_grad_enabled": (1, 2),  # (enabled, subgraph, *operands)
    "wrap_with_autocast": (4, 5),  # (device_type, dtype, enabled, cache_enabled, subgraph, *operands)
    "invoke_subgraph": (0, 2),  # (subgraph, identifier, *operands)
}
ASSERT_OPS = op_set(
    """_assert_tensor_metadata _assert_scalar _assert_async _functional_assert_async _functional_assert_scalar
    _functional_sym_constrain_range _functional_sym_constrain_range_for_size sym_constrain_range
    sym_constrain_range_for_size _print"""
)
CONVERSIONS = frozenset({"to", "type_as"})


def clean(gm: fx.GraphModule, *, fuse_experts: bool = True) -> fx.GraphModule:
    """Run every cleaning pass in order (see the module docstring); recompiles the code once, at the end.

    ``fuse_experts=False`` skips :func:`~autoshard.capture.experts.fuse_expert_mlps` (the planner tries both).
    """
    passes = (
        inline_higher_order_ops,
        drop_asserts,
        drop_identities,
        functionalize_slice_assignment,
        decompose_training_batch_norm,
        *((fuse_expert_mlps, fuse_routed_experts) if fuse_experts else ()),
        eliminate_dead_code,
    )
    for cleaning_pass in passes:
        gm = cleaning_pass(gm, recompile=False)
    gm.recompile()
    return gm


def _hop_name(node: fx.Node) -> str | None:
    if node.op == "call_function" and isinstance(node.target, torch._ops.HigherOrderOperator):
        return str(node.target.name())
    return None


def _packet_name(node: fx.Node) -> str | None:
    if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
        return str(node.target.overloadpacket.__name__)
    return None


def remaining_higher_order_ops(gm: fx.GraphModule) -> list[str]:
    """Names of the higher-order-op nodes left in ``gm`` (control flow that cannot be inlined)."""
    return [f"{node.name} ({_hop_name(node)})" for node in gm.graph.nodes if _hop_name(node) is not None]


def inline_higher_order_ops(gm: fx.GraphModule, *, recompile: bool = True) -> fx.GraphModule:
    """Splice inlinable higher-order ops' subgraphs into ``gm`` (recursively: nested ones first)."""
    for node in list(gm.graph.nodes):
        name = _hop_name(node)
        if name in INLINE_HOPS:
            _inline_one(gm, node, *INLINE_HOPS[name])
    _lint(gm, recompile)
    left = [n.name for n in gm.graph.nodes if _hop_name(n) in INLINE_HOPS]
    assert not left, f"inline_higher_order_ops left {left}"
    return gm


def _inline_one(gm: fx.GraphModule, hop: fx.Node, sub_index: int, first_operand: int) -> None:
    attr = hop.args[sub_index]
    assert isinstance(attr, fx.Node) and attr.op == "get_attr", (
        f"{hop.name}: subgraph argument is not get_attr"
    )
    sub = inline_higher_order_ops(getattr(gm, str(attr.target)), recompile=False)
    no_grad = _hop_name(hop) == "wrap_with_set_grad_enabled" and hop.args[0] is False
    env: dict[fx.Node, Any] = {}
    operands = iter(hop.args[first_operand:])
    result: Any = None
    with gm.graph.inserting_before(hop):
        for sn in sub.graph.nodes:
            if sn.op == "placeholder":
                env[sn] = next(operands)
            elif sn.op == "output":
                result = fx.map_arg(sn.args[0], lambda n: env[n])
            else:
                env[sn] = _copy_node(gm, sub, sn, env, hop, no_grad)
                if _hop_name(hop) == "wrap_with_autocast":
                    _cast_inputs_like_autocast(gm, env[sn])
    _replace_hop_uses(hop, result)
    gm.graph.erase_node(hop)
    if not attr.users:
        gm.graph.erase_node(attr)
        gm.delete_submodule(str(attr.target))


def _copy_node(
    gm: fx.GraphModule, sub: fx.GraphModule, sn: fx.Node, env: dict[fx.Node, Any], hop: fx.Node, no_grad: bool
) -> fx.Node:
    if sn.op == "get_attr":  # a constant of the subgraph: move it onto the parent under a fresh name
        name = f"_inlined_{hop.name}_{sn.target}".replace(".", "_")
        setattr(gm, name, getattr(sub, str(sn.target)))
        new = gm.graph.get_attr(name)
        new.meta = dict(sn.meta)
    else:
        new = gm.graph.node_copy(sn, lambda n: env[n])
    if "nn_module_stack" not in new.meta and "nn_module_stack" in hop.meta:
        new.meta["nn_module_stack"] = hop.meta["nn_module_stack"]
    if no_grad:
        new.meta[META_NO_GRAD] = True
    return new


def _cast_inputs_like_autocast(gm: fx.GraphModule, node: fx.Node) -> None:
    """Make autocast's implicit input casts explicit, so the inlined graph computes what the region did.

    Autocast runs an op on inputs cast to the dtype the op's result has (``meta["val"]`` recorded it);
    outside the region nothing casts, so we insert ``aten.to.dtype`` on every floating input whose dtype
    differs from the op's floating result.
    """
    out = node.meta.get("val")
    if node.op != "call_function" or not isinstance(out, torch.Tensor) or not out.dtype.is_floating_point:
        return
    if _packet_name(node) in CONVERSIONS:
        return
    for arg in node.all_input_nodes:
        val = arg.meta.get("val")
        if isinstance(val, torch.Tensor) and val.dtype.is_floating_point and val.dtype != out.dtype:
            with gm.graph.inserting_before(node):
                cast = gm.graph.call_function(torch.ops.aten.to.dtype, (arg, out.dtype))
            cast.meta = {k: v for k, v in node.meta.items() if k in ("nn_module_stack", "stack_trace")}
            cast.meta["val"] = val.to(out.dtype)
            node.replace_input_with(arg, cast)


def _replace_hop_uses(hop: fx.Node, result: Any) -> None:
    """Point users of the higher-order op at the inlined values: ``getitem(hop, i)`` -> ``result[i]``."""
    for user in list(hop.users):
        if user.op == "call_function" and user.target.__name__ == "getitem":  # type: ignore[union-attr]
            index = user.args[1]
            assert isinstance(index, int) and isinstance(result, (tuple, list))
            user.replace_all_uses_with(result[index], propagate_meta=False)
            user.graph.erase_node(user)
        else:
            assert isinstance(result, fx.Node), (
                f"{hop.name}: tuple result used without getitem by {user.name}"
            )
            user.replace_input_with(hop, result)


def merge_placeholders(
    gm: fx.GraphModule, same_as: Mapping[str, str], *, recompile: bool = True
) -> fx.GraphModule:
    """Point the users of each placeholder named in ``same_as`` at the placeholder it aliases, and drop it.

    Export lifts a tied weight once per name (GPT-2's ``lm_head.weight`` is ``transformer.wte.weight``);
    one node per tensor keeps a planner from placing, and counting, the same tensor twice.
    """
    nodes = {n.name: n for n in gm.graph.nodes if n.op == "placeholder"}
    for name, target in same_as.items():
        nodes[name].replace_all_uses_with(nodes[target], propagate_meta=False)
        gm.graph.erase_node(nodes[name])
    _lint(gm, recompile)
    return gm


def drop_asserts(gm: fx.GraphModule, *, recompile: bool = True) -> fx.GraphModule:
    """Remove assert-like nodes (they have no users); postcondition: none is left."""
    for node in list(gm.graph.nodes):
        if _packet_name(node) in ASSERT_OPS and not node.users:
            gm.graph.erase_node(node)
    _lint(gm, recompile)
    left = [n.name for n in gm.graph.nodes if _packet_name(n) in ASSERT_OPS]
    assert not left, f"drop_asserts: asserts with users remain: {left}"
    return gm


def _is_identity(node: fx.Node) -> bool:
    name = _packet_name(node)
    if name == "alias":
        return True
    if name == "dropout":  # dropout(input, p, train)
        p = node.kwargs.get("p", node.args[1] if len(node.args) > 1 else 0.5)
        train = node.kwargs.get("train", node.args[2] if len(node.args) > 2 else True)
        return bool(p == 0) or train is False
    if name in CONVERSIONS and not node.kwargs.get("copy", False):
        src, out = node.args[0], node.meta.get("val")
        val = src.meta.get("val") if isinstance(src, fx.Node) else None
        return (
            isinstance(val, torch.Tensor)
            and isinstance(out, torch.Tensor)
            and (val.dtype, val.device, tuple(val.shape)) == (out.dtype, out.device, tuple(out.shape))
        )
    return False


def drop_identities(gm: fx.GraphModule, *, recompile: bool = True) -> fx.GraphModule:
    """Replace identity ops (no-op dropout, ``alias``, no-op ``to``) by their input."""
    for node in list(gm.graph.nodes):
        if _is_identity(node) and isinstance(node.args[0], fx.Node):
            node.replace_all_uses_with(node.args[0], propagate_meta=False)
            gm.graph.erase_node(node)
    _lint(gm, recompile)
    assert not any(_is_identity(n) for n in gm.graph.nodes), "drop_identities left an identity op"
    return gm


def eliminate_dead_code(gm: fx.GraphModule, *, recompile: bool = True) -> fx.GraphModule:
    """Remove nodes whose values are unused (fx keeps side-effecting ones such as in-place ops)."""
    gm.graph.eliminate_dead_code()
    _lint(gm, recompile)
    return gm


def _lint(gm: fx.GraphModule, recompile: bool) -> None:
    """Check the graph; regenerate ``gm.code`` unless the caller batches that (6,000 nodes: ~0.3 s)."""
    gm.graph.lint()
    if recompile:
        gm.recompile()
