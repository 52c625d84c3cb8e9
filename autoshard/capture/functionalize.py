"""Make slice assignment functional: ``base[..., a:b] = src`` becomes ``base = slice_scatter(base, src, ..)``.

The pre-dispatch graph keeps Python's slice assignment as an in-place ``copy_`` into a *view*::

    buf = q_pass.new_empty(B, H, S, D)        # DeepSeek's MLA builds its query/key heads like this
    buf[..., :nope] = q_pass                  # slice(buf, -1, 0, nope) -> copy_(view, q_pass)
    buf[..., nope:] = q_rot                   # slice(buf, -1, nope, D) -> copy_(view, q_rot)
    attention(buf, ...)                       # reads buf: the writes reach it only through aliasing

Dataflow says ``attention`` reads an uninitialised ``buf``.  Once the planner moves data between devices
(a collective or a local slice makes a *new* tensor), the writes no longer reach the reader: wrong values, and
in the backward a gradient of the wrong shape ("_RedistributeBackward returned an invalid gradient").  This
pass rewrites each ``copy_(slice(base, dim, start, end, step), src)`` into
``new = slice_scatter(base, src', dim, start, end, step)`` (``src'`` = ``src`` cast and expanded to the
slice's dtype and shape, as ``copy_`` does) and makes every later reader of ``base`` read ``new``, so the
graph says what the program does and every op in it is functional for the planner.

Only this pattern is rewritten: a ``copy_`` whose destination is one ``slice`` of a tensor computed in the
graph (not a parameter, buffer or input, whose mutation is a side effect the caller sees).

Reads ``meta["val"]``; new nodes copy the ``copy_`` node's other meta keys (``nn_module_stack`` ...).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

__all__ = ["functionalize_slice_assignment"]

aten = torch.ops.aten


def _emit(
    graph: fx.Graph, template: fx.Node, op: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None
) -> fx.Node:
    """A new node ``op(*args, **kwargs)`` with the template's meta and its own ``val``."""
    node = graph.call_function(op, args, kwargs or {})
    node.meta = {k: v for k, v in template.meta.items() if k != "val"}
    vals = tuple(a.meta["val"] if isinstance(a, fx.Node) else a for a in args)
    fake = next((v.fake_mode for v in vals if hasattr(v, "fake_mode")), None)
    if fake is not None:
        with fake:
            node.meta["val"] = op(*vals, **(kwargs or {}))
    else:
        node.meta["val"] = op(*vals, **(kwargs or {}))
    return node


def _slice_of_computed(dst: object) -> fx.Node | None:
    """``dst`` if it is ``slice.Tensor`` of a tensor computed by an op of the graph, else ``None``."""
    if not (isinstance(dst, fx.Node) and dst.op == "call_function" and dst.target is aten.slice.Tensor):
        return None
    base = dst.args[0]
    return dst if isinstance(base, fx.Node) and base.op == "call_function" else None


def functionalize_slice_assignment(gm: fx.GraphModule, *, recompile: bool = True) -> fx.GraphModule:
    """Rewrite ``copy_`` into a slice of a computed tensor as ``slice_scatter`` (module doc)."""
    graph = gm.graph
    order = {n: i for i, n in enumerate(graph.nodes)}
    latest: dict[fx.Node, fx.Node] = {}  # a written tensor -> its value after the writes so far
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not aten.copy_.default:
            continue
        view = _slice_of_computed(node.args[0])
        src = node.args[1]
        if view is None or not isinstance(src, fx.Node):
            continue
        original = view.args[0]
        assert isinstance(original, fx.Node)
        base = latest.get(original, original)  # a view taken before an earlier write still sees that write
        dim, start, end, step = (*view.args[1:], *(0, None, None, 1)[len(view.args) - 1 :])[:4]
        want = view.meta["val"]
        with graph.inserting_before(node):
            value = src
            if value.meta["val"].dtype != want.dtype:
                value = _emit(graph, node, aten._to_copy.default, (value,), {"dtype": want.dtype})
            if tuple(value.meta["val"].shape) != tuple(want.shape):
                value = _emit(graph, node, aten.expand.default, (value, list(want.shape)))
            new = _emit(graph, node, aten.slice_scatter.default, (base, value, dim, start, end, step))
        later = [u for u in original.users if u is not new and order.get(u, -1) > order[node]]
        later += [u for u in base.users if u is not new and u not in later and order.get(u, -1) > order[node]]
        for user in later:
            user.replace_input_with(base, new)
            user.replace_input_with(original, new)
        latest[original] = new
        if node.users:  # copy_ returns its destination: the slice of the new value
            with graph.inserting_after(new):
                again = _emit(graph, view, aten.slice.Tensor, (new, dim, start, end, step))
            node.replace_all_uses_with(again)
        graph.erase_node(node)
        order = {n: i for i, n in enumerate(graph.nodes)}
    graph.lint()  # the views written through are left unused: dead-code elimination drops them
    if recompile:
        gm.recompile()
    return gm
