"""``aten.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)``.

Dim map, with ``q (..., H, L, E)``, ``k (..., Hkv, S, E)``, ``v (..., Hkv, S, Ev)`` and ``out (..., H, L, Ev)``:
leading dims (batch ``b``, heads ``h``) are shared by q, k, v, the mask and the output; ``q`` and the mask share
the query length ``l``; k, v and the mask share the key length ``s``.

- **batch** and **head** splits are free (Megatron attention splits heads).  With GQA (``enable_gqa``) the q
  and kv heads are both split into contiguous blocks, so head block ``j`` of q still reads kv block ``j``: the
  divisibility filter demands both ``H`` and ``Hkv`` divide.
- **query-length** split: q and the mask split along ``l``, k and v whole -- exact without ``is_causal``
  (an explicit mask is split with the queries, as HF models pass); with ``is_causal`` the implicit mask would
  be wrong per piece, so it is forbidden.
- **context parallel (ring)**: q, k, v, the output (and the mask's query rows) all split along the sequence
  on one mesh axis; K/V blocks travel around that axis's ring (:func:`autoshard.codegen.context.context_sdpa`,
  priced by :mod:`autoshard.problem.context`).  At most one axis rings, and then the queries split along
  the sequence on no other axis.  Offered without dropout and with no mask or a boolean one.  A mask
  proven causal at capture (``META_CAUSAL_MASK``, Hugging Face models) runs as ``is_causal``: each chunk
  pair's visibility comes from global positions, the mask's rows are not read.  Grouped-query K/V copies
  (``META_KV_REPEATS``, HF's ``repeat_kv``) travel as one head per run of copies and are copied back per hop
  (:func:`autoshard.problem.attention.kv_stride`).  Without a ring, such a mask
  is dropped for ``is_causal`` unless the query rows are split (:mod:`autoshard.codegen.causal`).
- otherwise the **key length** ``s`` and head dims ``E``/``Ev`` never split: softmax needs every key; splitting
  ``Ev`` is valid but never better than a head split, so omitted.
- Partial passes through ``v`` (the output is linear in it) when there is no dropout.

A mask dim of size 1 (broadcast) stays whole.
"""

from __future__ import annotations

import torch
from torch import fx

from autoshard.capture.meta import META_CAUSAL_MASK, META_KV_REPEATS
from autoshard.placement import Replicate, Shard
from autoshard.strategies.dimmap import DimMap, Letters, fresh_letters, strategies_from_map
from autoshard.strategies.local import LocalCall, LocalContext, bind, default_call
from autoshard.strategies.registry import register
from autoshard.strategies.strategy import AxisChoice, OpStrategy, expand, tensor_meta

aten = torch.ops.aten


def _shape(node: object) -> tuple[int, ...]:
    val = tensor_meta(node) if isinstance(node, fx.Node) else None
    assert val is not None, f"{node} must be a tensor"
    return tuple(int(s) for s in val.shape)


def _lead(shape: tuple[int, ...], lead: Letters, full: tuple[int, ...], enable_gqa: bool) -> Letters:
    """Letters of a tensor's leading dims against the query's (right-aligned; heads may differ under GQA)."""
    offset = len(full) - len(shape)
    out: list[str | None] = []
    for d, size in enumerate(shape):
        ref = full[offset + d]
        is_head = offset + d == len(full) - 1
        same = size == ref or (enable_gqa and is_head and size > 1 and ref % size == 0)
        out.append(lead[offset + d] if same else None)
    return tuple(out)


def ring_axis(node: fx.Node, strategy: OpStrategy) -> int | None:
    """The mesh axis a ring (context-parallel) strategy of this SDPA node rotates K/V over, else None."""
    k = bind(node.target, node.args, node.kwargs)["key"]
    if not isinstance(k, fx.Node) or k not in node.all_input_nodes:
        return None
    spec = strategy.inputs[node.all_input_nodes.index(k)]
    seq = len(_shape(k)) - 2
    if spec is None:
        return None
    return next((a for a, p in enumerate(spec.placements) if isinstance(p, Shard) and p.dim == seq), None)


def _local(ctx: LocalContext) -> LocalCall:
    axis = ring_axis(ctx.node, ctx.strategy)
    if axis is None:
        from autoshard.codegen.causal import causal_call

        return causal_call(ctx) or default_call(ctx)  # a proven causal mask dropped for is_causal
    from autoshard.codegen.context import context_sdpa

    b = bind(ctx.target, ctx.args, ctx.kwargs)
    q, k, v, mask = b["query"], b["key"], b["value"], b["attn_mask"]
    causal = bool(b["is_causal"])
    if ctx.node.meta.get(META_CAUSAL_MASK):  # proven causal at capture: each chunk pair's mask from positions
        mask, causal = None, True
    repeats = int(ctx.node.meta.get(META_KV_REPEATS, 1))  # grouped-query copies: the ring rotates originals
    kwargs = {"axis": axis, "scale": b["scale"], "is_causal": causal, "kv_repeats": repeats}
    return LocalCall(context_sdpa, (q, k, v, mask), kwargs)


def _ring_choice(letters: tuple[Letters | None, ...], out_l: Letters) -> AxisChoice:
    seq = ("l", "s", "s", "l")  # the sequence letter of q, k, v and the mask's query rows
    return AxisChoice(
        tuple(
            None if ls is None else Shard(ls.index(c)) if c in ls else Replicate()
            for ls, c in zip(letters, seq, strict=True)
        ),
        (Shard(out_l.index("l")),),
        splits_work=True,
    )


def _one_ring(node: fx.Node, strategy: OpStrategy) -> bool:
    """At most one ring axis, and then the queries split along the sequence on no other axis."""
    axis = ring_axis(node, strategy)
    if axis is None:
        return True
    k = bind(node.target, node.args, node.kwargs)["key"]
    k_spec, out = strategy.inputs[node.all_input_nodes.index(k)], strategy.outputs[0]
    assert k_spec is not None and out is not None
    k_seq, q_seq = len(_shape(k)) - 2, len(_shape(node)) - 2  # (..., S, E) and the output's (..., L, Ev)
    rings = [a for a, p in enumerate(k_spec.placements) if isinstance(p, Shard) and p.dim == k_seq]
    queries = [a for a, p in enumerate(out.placements) if isinstance(p, Shard) and p.dim == q_seq]
    return rings == [axis] and queries == [axis]


@register(aten.scaled_dot_product_attention.default, local_args=_local)
def sdpa(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    b = bind(node.target, node.args, node.kwargs)
    q, k, v, mask = b["query"], b["key"], b["value"], b["attn_mask"]
    qs = _shape(q)
    gqa = bool(b["enable_gqa"])
    lead_shape = qs[:-2]
    lead = tuple(fresh_letters(len(lead_shape), avoid="lsde"))
    q_l: Letters = (*lead, "l", "d")
    k_l: Letters = (*_lead(_shape(k)[:-2], lead, lead_shape, gqa), "s", "d")
    v_l: Letters = (*_lead(_shape(v)[:-2], lead, lead_shape, gqa), "s", "e")
    out_l: Letters = (*lead, "l", "e")
    mask_l: Letters | None = None
    if isinstance(mask, fx.Node):
        full = (*lead_shape, qs[-2], _shape(k)[-2])
        ms = _shape(mask)
        mask_l = tuple(
            (*lead, "l", "s")[len(full) - len(ms) + d] if size == full[len(full) - len(ms) + d] else None
            for d, size in enumerate(ms)
        )
    whole = "sde" + ("l" if b["is_causal"] else "")
    dm = DimMap(
        (q_l, k_l, v_l, mask_l),
        (out_l,),
        unsplittable=frozenset(whole),
        linear_in=(frozenset({2}),) if not b["dropout_p"] else (),
    )
    roles = (q, k, v, mask if isinstance(mask, fx.Node) else None)
    mask_ok = mask_l is None or tensor_meta(mask).dtype == torch.bool  # type: ignore[union-attr]
    if b["dropout_p"] or not mask_ok:
        return strategies_from_map(node, roles, dm, mesh_shape)
    strategies_from_map(node, roles, dm, (1,))  # checks the map against the operands
    choices = [*dm.choices(), _ring_choice((q_l, k_l, v_l, mask_l), out_l)]
    return [s for s in expand(node, roles, choices, mesh_shape) if _one_ring(node, s)]
