"""Prove that an attention node's K and V are grouped-query copies, so context parallelism can rotate the originals.

Grouped-query attention (LLaMA-3: 128 query heads over 8 K/V heads) shares each K/V head among ``r`` query
heads.  Hugging Face models (transformers 5, ``attn_implementation="sdpa"`` with a mask) copy K and V to the
query heads' count before ``scaled_dot_product_attention`` (``repeat_kv``)::

    k = k[:, :, None, :, :].expand(b, h_kv, r, s, e).reshape(b, h_kv * r, s, e)

so the captured graph reads ``reshape(expand(unsqueeze(k, 2)))``; other code writes
``k.repeat_interleave(r, dim=1)``.  Either way query head ``h`` reads K/V head ``h // r``: every run of ``r``
heads (aligned at multiples of ``r``) of the attention's K and V holds ``r`` equal copies.  A ring that rotates
the copied K and V sends ``r`` times the bytes it needs; it can rotate one head of each run and copy it back
per hop (:func:`autoshard.codegen.context.context_sdpa`).

Output: ``node.meta[META_KV_REPEATS] = r`` on each ``scaled_dot_product_attention`` whose K and V are both
such copies with the same ``r > 1`` (proven from the graph's ops and shapes, never from values).  Nothing
else changes: the copies stay in the graph, priced and emitted as they are.  Read, through
:func:`autoshard.problem.attention.kv_stride` (the one rule), by the ring's pricing
(:mod:`autoshard.problem.context`, :mod:`autoshard.problem.ring_hops`) and by the attention rule's ring hook.

Example::

    cap = capture(LlamaForCausalLM(config), (ids,))   # 4 heads over 2 K/V heads
    {n.meta.get(META_KV_REPEATS) for n in cap.op_nodes() if n.target is aten.scaled_dot_product_attention.default}
    # {2}
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

from autoshard.capture.meta import META_KV_REPEATS

__all__ = ["kv_repeats", "mark_repeated_kv"]

aten = torch.ops.aten

_RESHAPES = (aten.reshape.default, aten.view.default, aten._unsafe_view.default)


def mark_repeated_kv(gm: fx.GraphModule) -> int:
    """Mark each SDPA node whose K and V are grouped-query copies (module doc); returns how many."""
    marked = 0
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target is not aten.scaled_dot_product_attention.default:
            continue
        k = node.args[1] if len(node.args) > 1 else node.kwargs.get("key")
        v = node.args[2] if len(node.args) > 2 else node.kwargs.get("value")
        rk, rv = kv_repeats(k), kv_repeats(v)
        if rk > 1 and rk == rv:
            node.meta[META_KV_REPEATS] = rk
            marked += 1
    return marked


def kv_repeats(node: Any) -> int:
    """``r`` when ``node`` (a rank-4 ``(B, H, S, E)`` value) is each head of some tensor repeated ``r`` times in
    a row along dim 1, else 1."""
    shape = _shape(node)
    if shape is None or len(shape) != 4 or not isinstance(node, fx.Node):
        return 1
    if node.target is aten.repeat_interleave.self_int:
        return _repeat_interleave(node, shape)
    if node.target not in _RESHAPES:
        return 1
    expand = node.args[0]
    wide = _shape(expand)
    if not isinstance(expand, fx.Node) or expand.target is not aten.expand.default or wide is None:
        return 1
    source = expand.args[0]
    narrow = _shape(source)
    if (
        not isinstance(source, fx.Node)
        or source.target is not aten.unsqueeze.default
        or source.args[1] not in (2, -3)
        or narrow is None
        or len(wide) != 5
        or narrow != (wide[0], wide[1], 1, wide[3], wide[4])  # (B, Hkv, 1, S, E) -> (B, Hkv, r, S, E)
        or shape != (wide[0], wide[1] * wide[2], wide[3], wide[4])  # -> (B, Hkv * r, S, E)
    ):
        return 1
    return wide[2]


def _repeat_interleave(node: fx.Node, shape: tuple[int, ...]) -> int:
    repeats = node.args[1] if len(node.args) > 1 else node.kwargs.get("repeats")
    dim = node.args[2] if len(node.args) > 2 else node.kwargs.get("dim")
    source = _shape(node.args[0])
    if not isinstance(repeats, int) or dim not in (1, -3) or source is None or len(source) != 4:
        return 1
    return repeats if shape == (source[0], source[1] * repeats, *source[2:]) else 1


def _shape(node: Any) -> tuple[int, ...] | None:
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    if not isinstance(val, torch.Tensor):
        return None
    try:
        return tuple(int(s) for s in val.shape)
    except TypeError:  # a symbolic size
        return None
