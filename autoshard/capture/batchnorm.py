"""Rewrite training-mode batch norm into its statistic ops, so a batch split synchronises the statistics.

``aten.batch_norm(x, w, b, running_mean, running_var, training=True, momentum, eps)`` normalises each channel
by the mean and variance over the batch and spatial dims.  As one op, a batch split would normalise each
device's piece by its *local* statistics -- a different model.  Written out::

    moments = cat([x, x * x], 1).mean(dims, keepdim=True)   # dims = batch + spatial;  (1, 2C, 1, ..)
    mean, ex2 = moments[:, :C], moments[:, C:]
    var  = ex2 - mean * mean                                 # biased, as batch norm normalises
    y    = (x - mean) * rsqrt(var + eps) * w.view(C, 1, ..) + b.view(C, 1, ..)

each op has a rule: with the batch split, ``moments`` comes out Partial and the planner prices (and codegen
emits) one all-reduce of the ``2C`` per-channel sums -- SyncBatchNorm's semantics and its cost (it too
all-reduces sum and sum of squares together), and the dual in the backward.  A channel split needs no communication, as
before.

What changes: the running statistics are not updated by the rewritten graph (they are buffers that only
eval mode reads; the planner and ``verify`` compare outputs and gradients of training steps).  The pass says
so in ``gm.meta["autoshard_notes"]``, which capture copies into ``Captured.notes``.

Reads ``meta["val"]`` (FakeTensor or real) and copies the batch-norm node's other meta keys
(``nn_module_stack`` ...) onto the new nodes.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

__all__ = ["NOTES_KEY", "decompose_training_batch_norm"]

aten = torch.ops.aten
NOTES_KEY = "autoshard_notes"


def _val(arg: Any) -> Any:
    if isinstance(arg, list | tuple):
        return type(arg)(_val(a) for a in arg)
    return arg.meta["val"] if isinstance(arg, fx.Node) else arg


def _emit(graph: fx.Graph, template: fx.Node, op: Any, *args: Any) -> fx.Node:
    """A new node ``op(*args)`` with the template's meta and its own ``val``."""
    node = graph.call_function(op, args)
    node.meta = {k: v for k, v in template.meta.items() if k != "val"}
    vals = tuple(_val(a) for a in args)
    flat = [v for a in vals for v in (a if isinstance(a, list | tuple) else (a,))]
    fake = next((v.fake_mode for v in flat if hasattr(v, "fake_mode")), None)
    if fake is not None:
        with fake:
            node.meta["val"] = op(*vals)
    else:
        node.meta["val"] = op(*vals)
    return node


def decompose_training_batch_norm(gm: fx.GraphModule, *, recompile: bool = True) -> fx.GraphModule:
    """Replace every ``batch_norm(..., training=True, ...)`` by its statistic ops (module doc)."""
    graph = gm.graph
    count = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not aten.batch_norm.default:
            continue
        x, w, b, _rm, _rv, training, _momentum, eps = (*node.args, *([None] * 9))[:8]
        if not training or not isinstance(x, fx.Node):
            continue
        nd = x.meta["val"].dim()
        dims = [0, *range(2, nd)]
        shape = [int(x.meta["val"].shape[1]), *([1] * (nd - 2))]
        c = int(x.meta["val"].shape[1])
        with graph.inserting_before(node):
            xx = _emit(graph, node, aten.mul.Tensor, x, x)
            # (N, 2C, ..): both moments from one reduction, so a batch split costs one all-reduce
            both = _emit(graph, node, aten.cat.default, [x, xx], 1)
            moments = _emit(graph, node, aten.mean.dim, both, dims, True)  # (1, 2C, 1, ..)
            mean = _emit(graph, node, aten.slice.Tensor, moments, 1, 0, c)
            ex2 = _emit(graph, node, aten.slice.Tensor, moments, 1, c, 2 * c)
            var = _emit(graph, node, aten.sub.Tensor, ex2, _emit(graph, node, aten.mul.Tensor, mean, mean))
            rstd = _emit(
                graph, node, aten.rsqrt.default, _emit(graph, node, aten.add.Tensor, var, float(eps))
            )
            xc = _emit(graph, node, aten.sub.Tensor, x, mean)
            y = _emit(graph, node, aten.mul.Tensor, xc, rstd)
            if isinstance(w, fx.Node):
                y = _emit(graph, node, aten.mul.Tensor, y, _emit(graph, node, aten.view.default, w, shape))
            if isinstance(b, fx.Node):
                y = _emit(graph, node, aten.add.Tensor, y, _emit(graph, node, aten.view.default, b, shape))
        node.replace_all_uses_with(y)
        graph.erase_node(node)
        count += 1
    if count:
        notes = gm.meta.setdefault(NOTES_KEY, [])
        notes.append(
            f"{count} training batch norm(s) written as statistic ops (synchronised over a batch split); "
            "their running statistics are not updated by the planned graph"
        )
    graph.lint()
    assert not any(n.target is aten.batch_norm.default and n.args[5] is True for n in graph.nodes), (
        "a training batch norm survived decomposition"
    )
    if recompile:
        gm.recompile()
    return gm
