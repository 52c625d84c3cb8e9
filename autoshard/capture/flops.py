"""Forward FLOPs of one graph node, by op family.

Input: a node whose arguments and result carry ``META_TENSOR`` records. Output: an ``int`` (the value of
``META_FLOPS``). A multiply-add counts as 2 FLOPs, as in ``torch.utils.flop_counter``.

Families (the op's base name: ``aten.linear.default`` -> ``linear``):

- contractions (``mm``, ``addmm``, ``bmm``, ``baddbmm``, ``matmul``, ``linear``, ``_grouped_mm``,
  ``transformers.grouped_mm_fallback``): ``2 * numel(out) * K`` with ``K`` the contracted size, the last
  dim of the first operand. That is ``2·M·N·K`` for ``mm`` and ``2·B·M·N·K`` for ``bmm``; bias adds are
  not counted (``FlopCounterMode`` does not count them either).
- ``scaled_dot_product_attention``: ``2·B·H·Sq·Sk·D`` for ``Q Kᵀ`` plus ``2·B·H·Sq·Sk·Dv`` for ``P V``,
  halved when ``is_causal`` (an explicit mask counts the full square; one proven causal is priced at the
  triangle where it runs causal: :mod:`autoshard.problem.attention`).
- convolution: ``2 * numel(out) * (C_in / groups) * prod(kernel)``.
- data movement, views, indexing, creation (``view``, ``expand``, ``cat``, ``embedding``, ``index``,
  ``arange``, ``to``, ...): 0. They cost bytes, which the memory roofline prices, not FLOPs.
- normalisations and softmax: ``5 * numel`` (mean, variance, normalise, scale, shift).
- reductions (``sum``, ``mean``, ``amax``, ``cumsum``, ``topk``, ...): ``numel`` of the input.
- everything else (elementwise ops, unknown ops): ``numel`` of the largest output.

``FlopCounterMode`` agrees on the contractions and convolutions (tests check it on real tensors); it counts
nothing for CPU SDPA, ``_grouped_mm`` and non-matmul ops, which is why we keep our own formulas.

Example::

    flops = node_flops(node)            # node.meta[META_TENSOR] must be set for the node and its inputs
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import fx, nn

from autoshard.capture.meta import META_TENSOR, TensorMeta, op_set

__all__ = ["family", "node_flops"]

CONTRACTIONS = op_set("mm addmm bmm baddbmm matmul linear _grouped_mm grouped_mm grouped_mm_fallback")
ATTENTION = op_set(
    """scaled_dot_product_attention _scaled_dot_product_flash_attention
    _scaled_dot_product_efficient_attention _scaled_dot_product_flash_attention_for_cpu
    _scaled_dot_product_cudnn_attention"""
)
CONVOLUTIONS = op_set(
    "convolution _convolution conv1d conv2d conv3d conv_transpose1d conv_transpose2d conv_transpose3d"
)
ZERO = op_set(
    """
    view _unsafe_view reshape expand expand_as transpose t permute unsqueeze squeeze slice select narrow
    split split_with_sizes chunk unbind flatten unflatten movedim as_strided alias detach view_as contiguous
    getitem size sym_size dim numel
    clone to _to_copy type_as copy_ copy lift_fresh_copy cat stack repeat repeat_interleave float half
    bfloat16 type
    embedding index index_select gather scatter index_put index_put_ masked_select take index_copy
    arange zeros ones full empty new_ones new_zeros new_empty new_full zeros_like ones_like empty_like
    full_like scalar_tensor tensor
    dropout _assert_tensor_metadata _assert_scalar
    """
)
"""Views and layout; copies, casts and concatenation; indexing; creation; dropout and asserts."""
NORMS = op_set(
    """layer_norm native_layer_norm rms_norm group_norm batch_norm native_batch_norm instance_norm
    softmax _softmax log_softmax _log_softmax"""
)
NORM_FLOPS_PER_ELEMENT = 5
REDUCTIONS = op_set(
    """sum mean amax amin max min prod var std var_mean norm argmax argmin cumsum cumprod logsumexp any all
    topk sort histc diff"""
)
# Leaf modules of a symbolic_trace graph, mapped to the family of the ATen op they run.
MODULE_FAMILIES: tuple[tuple[type[nn.Module], str], ...] = (
    (nn.Linear, "linear"),
    (nn.modules.conv._ConvNd, "convolution"),
    (nn.Embedding, "embedding"),
    (nn.LayerNorm, "layer_norm"),
    (nn.GroupNorm, "group_norm"),
    (nn.modules.batchnorm._BatchNorm, "batch_norm"),
    (nn.Softmax, "softmax"),
    (nn.Dropout, "dropout"),
    (nn.Identity, "alias"),
    (nn.Flatten, "flatten"),
)


def family(node: fx.Node, root: nn.Module | None = None) -> str:
    """The op family name: ``aten.linear.default`` -> ``"linear"``; ``module.Linear`` -> ``"linear"``."""
    if node.op == "call_function":
        target = node.target
        if isinstance(target, torch._ops.OpOverload):
            return str(target.overloadpacket.__name__)
        return str(getattr(target, "__name__", target))
    if node.op == "call_method":
        return str(node.target)
    if node.op == "call_module" and root is not None:
        module = root.get_submodule(str(node.target))
        return next((fam for cls, fam in MODULE_FAMILIES if isinstance(module, cls)), type(module).__name__)
    return node.op


def node_flops(node: fx.Node, root: nn.Module | None = None) -> int:
    """Forward FLOPs of ``node`` (``root`` resolves ``call_module`` targets of a ``symbolic_trace`` graph)."""
    if node.op not in ("call_function", "call_method", "call_module"):
        return 0
    fam = family(node, root)
    ins = _input_metas(node)
    outs = _tensors(node.meta.get(META_TENSOR))
    if fam in ZERO or not outs:
        return 0
    out_numel = max(t.numel for t in outs)
    if fam in CONTRACTIONS and ins:
        return _contraction(fam, ins, out_numel)
    if fam == "expert_mlp" and len(ins) >= 3:  # capture.experts: two grouped matmuls around the activation
        x, gate_up = ins[0], ins[1]
        return 2 * x.numel * gate_up.shape[-1] + 2 * out_numel * (gate_up.shape[-1] // 2) + gate_up.shape[-1]
    if fam == "routed_experts" and len(ins) >= 4:  # capture.dispatch: the expert MLP of T*k rows, weighted
        hidden, gate_up, index = ins[0], ins[1], ins[3]
        rows = index.numel * hidden.shape[-1]  # elements of the T*k routed rows
        return 2 * rows * gate_up.shape[-1] + 2 * rows * (gate_up.shape[-1] // 2) + 2 * rows
    if fam in ATTENTION and len(ins) >= 3:
        return _attention(node, ins)
    if fam in CONVOLUTIONS:
        return _convolution(node, root, ins, out_numel)
    if fam in NORMS:
        return NORM_FLOPS_PER_ELEMENT * max([out_numel, *(t.numel for t in ins[:1])])
    if fam in REDUCTIONS and ins:
        return ins[0].numel
    return out_numel


def _contraction(fam: str, ins: list[TensorMeta], out_numel: int) -> int:
    # addmm(bias, a, b) / baddbmm(bias, a, b): the contracted operand is the second one.
    first = ins[1] if fam in ("addmm", "baddbmm") and len(ins) >= 3 else ins[0]
    k = first.shape[-1] if first.ndim >= 1 else 1
    return 2 * out_numel * k


def _attention(node: fx.Node, ins: list[TensorMeta]) -> int:
    q, k, v = ins[:3]
    if q.ndim < 2 or k.ndim < 2:
        return q.numel
    sk = k.shape[-2]
    dv = v.shape[-1]
    flops = 2 * q.numel * sk + 2 * (q.numel // max(q.shape[-1], 1)) * sk * dv
    return flops // 2 if _is_causal(node) else flops


# Position of ``is_causal`` in each attention op's schema, e.g.
# scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, ...).
_IS_CAUSAL_POSITION = {
    "scaled_dot_product_attention": 5,
    "_scaled_dot_product_flash_attention": 4,
    "_scaled_dot_product_flash_attention_for_cpu": 4,
    "_scaled_dot_product_efficient_attention": 6,
    "_scaled_dot_product_cudnn_attention": 6,
}


def _is_causal(node: fx.Node) -> bool:
    if "is_causal" in node.kwargs:
        return bool(node.kwargs["is_causal"])
    position = _IS_CAUSAL_POSITION.get(family(node), len(node.args))
    return len(node.args) > position and node.args[position] is True


def _convolution(node: fx.Node, root: nn.Module | None, ins: list[TensorMeta], out_numel: int) -> int:
    if node.op == "call_module" and root is not None:
        weight = root.get_submodule(str(node.target)).weight
        assert isinstance(weight, torch.Tensor)
        weight_shape = tuple(weight.shape)
    elif len(ins) >= 2:
        weight_shape = ins[1].shape
    else:
        return out_numel
    transposed = "transpose" in family(node, root) or (len(node.args) > 6 and node.args[6] is True)
    if transposed:
        # (C_in, C_out / groups, *k): every input element is scattered over C_out / groups * prod(k) outputs.
        return 2 * ins[0].numel * math.prod(weight_shape[1:])
    return 2 * out_numel * math.prod(weight_shape[1:])


def _tensors(meta: Any) -> list[TensorMeta]:
    if isinstance(meta, TensorMeta):
        return [meta]
    if isinstance(meta, tuple):
        return [m for m in meta if isinstance(m, TensorMeta)]
    return []


def _input_metas(node: fx.Node) -> list[TensorMeta]:
    """``TensorMeta`` of the node's tensor arguments in argument order (lists such as ``cat``'s flattened)."""
    metas: list[TensorMeta] = []

    def visit(arg: Any) -> None:
        if isinstance(arg, fx.Node):
            meta = arg.meta.get(META_TENSOR)
            if isinstance(meta, TensorMeta):
                metas.append(meta)
        elif isinstance(arg, (list, tuple)):
            for a in arg:
                visit(a)

    for a in node.args:
        visit(a)
    for a in node.kwargs.values():
        visit(a)
    return metas
