"""Prove that an attention node's explicit boolean mask is the causal mask, so context parallelism can treat it so.

Hugging Face models (transformers 5, ``attn_implementation="sdpa"``) hand ``scaled_dot_product_attention`` an
explicit ``(B, 1, S, S)`` boolean mask under ``torch.export`` rather than ``is_causal=True``.  The graph
builds it from positions: ``kv_pos <= q_pos`` (``le`` of two views of one ``arange``), and-ed with an
all-true ones tensor and a packed-sequence check (``cumsum(diff(pos) != 1)`` compared between query and key).
The planner cannot see a mask's values, so a ring strategy priced it as a full square and the load-balanced
zigzag layout was never chosen for these models.

This pass proves causality without building the ``S × S`` mask (131072² booleans would be 16 GiB):

- nodes no larger than a few times their longest dim per batch row (position vectors) and small nodes are
  *evaluated*, on the CPU, from their inputs: they depend on nothing but constants and shapes (a node that
  reads a user input, a parameter or a buffer, or draws random numbers, is unknown, and so is everything
  after it); values the same along a dim (HF's positions, built for one row and expanded over the batch)
  are held and computed once along it (:mod:`autoshard.capture.compact`: LLaMA-3-70B at batch 1024 x 4096,
  0.18 -> 0.002 s CPU per graph), and rows that differ are held, and checked, one by one;
- ``S × S`` nodes are kept *symbolic*, as a conjunction of terms ``op(q_vec[i], k_vec[j])`` (a comparison
  of a query-position vector with a key-position vector), through ``and``, ``expand``, ``unsqueeze`` and
  boolean casts;
- the mask is causal when one term is ``q[i] >= k[j]`` (or ``>``) holding for exactly ``j <= i`` (checked by
  binary search over sorted ``k``: ``O(S log S)``) and every other term holds everywhere (from the vectors'
  extremes).

Output: ``node.meta[META_CAUSAL_MASK] = True`` on each ``scaled_dot_product_attention`` whose mask is proven
causal (query and key lengths equal, no dropout, not already ``is_causal``).  Nothing else changes here: the
mask stays an input of the captured node.  Read by :mod:`autoshard.problem.attention` (such attention is priced
at the causal triangle wherever it runs causal), by :mod:`autoshard.codegen.causal` (emitted as ``is_causal``
without the mask where the query rows stay whole; split query rows keep it), and by the attention rule's ring
hook (:func:`autoshard.codegen.context.context_sdpa` runs it causal, per chunk pair).

Example::

    cap = capture(LlamaForCausalLM(config), (ids,))
    [n for n in cap.op_nodes() if n.meta.get(META_CAUSAL_MASK)]    # every layer's attention
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from torch import fx

from autoshard.capture.compact import Value, evaluate, value_of
from autoshard.capture.meta import META_CAUSAL_MASK, META_KIND

__all__ = ["mark_causal_masks", "proves_causal"]

aten = torch.ops.aten

_SMALL = 4096
"""Elements up to which a node is evaluated whatever its shape (a scalar ``new_ones``, a few-token mask)."""
_WIDE = 64
"""A node of at most ``_WIDE`` times its longest dim per index of its leading (batch) dim is evaluated
(positions per batch row, whatever the batch); a square is not."""
_BATCHED = 1 << 24
"""Elements up to which such a batched node is evaluated (int64: 128 MiB; batch 1024 x sequence 16384)."""

_COMPARE: dict[str, Callable[[Any, Any], Any]] = {
    "eq": operator.eq, "ne": operator.ne, "le": operator.le, "lt": operator.lt, "ge": operator.ge,
    "gt": operator.gt,
}  # fmt: skip
_FLIP = {"eq": "eq", "ne": "ne", "le": "ge", "lt": "gt", "ge": "le", "gt": "lt"}  # op(a, b) = flip(b, a)
_AND = ("__and__", "bitwise_and", "logical_and", "mul")
_PASS = ("expand", "unsqueeze", "view", "reshape", "_to_copy", "to", "clone", "contiguous", "alias")


@dataclass(frozen=True, slots=True)
class _Term:
    """``op(q[i], k[j])`` over query positions ``i`` and key positions ``j``."""

    op: str
    q: np.ndarray
    k: np.ndarray


@dataclass(frozen=True, slots=True)
class _Mask:
    """A ``(..., Lq, Lk)`` boolean tensor, the same for every leading index: the conjunction of ``terms``."""

    lq: int
    lk: int
    terms: tuple[_Term, ...]


_Form = Value | _Mask | None  # a value, a symbolic mask, or unknown


def mark_causal_masks(gm: fx.GraphModule) -> int:
    """Mark each SDPA node whose explicit mask is proven causal (module doc); returns how many."""
    forms: dict[fx.Node, _Form] = {}
    marked = 0
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target is not aten.scaled_dot_product_attention.default:
            continue
        mask = node.args[3] if len(node.args) > 3 else node.kwargs.get("attn_mask")
        dropout = node.args[4] if len(node.args) > 4 else node.kwargs.get("dropout_p", 0.0)
        causal = node.args[5] if len(node.args) > 5 else node.kwargs.get("is_causal", False)
        if not isinstance(mask, fx.Node) or dropout or causal:
            continue
        if proves_causal(_form(mask, forms)):
            node.meta[META_CAUSAL_MASK] = True
            marked += 1
    return marked


def proves_causal(form: _Form | torch.Tensor) -> bool:
    """Whether ``form`` (a value or a symbolic mask) is the causal mask ``j <= i`` on its last two dims."""
    if isinstance(form, torch.Tensor):
        form = value_of(form)
    if isinstance(form, Value):
        shape = form.shape
        if form.dtype != torch.bool or len(shape) < 2 or shape[-1] != shape[-2]:
            return False
        causal = torch.ones(shape[-2:], dtype=torch.bool).tril()
        return bool((form.compact == causal).all())  # the rows held apart, each against the triangle
    if not isinstance(form, _Mask) or form.lq != form.lk:
        return False
    kinds = [_kind(t, form.lq) for t in form.terms]
    return kinds.count("causal") >= 1 and all(k in ("causal", "true") for k in kinds)


def _kind(term: _Term, length: int) -> str:
    """``"true"`` (holds for every pair), ``"causal"`` (holds exactly for ``j <= i``) or ``"other"``."""
    q, k = term.q.astype(np.float64), term.k.astype(np.float64)
    if len(q) != length or len(k) != length:
        return "other"
    everywhere = {
        "ge": q.min() >= k.max(), "gt": q.min() > k.max(), "le": q.max() <= k.min(), "lt": q.max() < k.min(),
        "eq": q.min() == q.max() == k.min() == k.max(), "ne": not np.intersect1d(q, k).size,
    }  # fmt: skip
    if everywhere[term.op]:
        return "true"
    if term.op in ("ge", "gt") and bool(np.all(np.diff(k) > 0)):  # visible keys: a prefix of sorted k
        side: Literal["left", "right"] = "right" if term.op == "ge" else "left"
        visible = np.searchsorted(k, q, side=side)  # how many keys each query sees
        if np.array_equal(visible, np.arange(1, length + 1)):
            return "causal"
    return "other"


def _form(node: fx.Node, forms: dict[fx.Node, _Form]) -> _Form:
    if node not in forms:
        forms[node] = _compute(node, forms)
    return forms[node]


def _compute(node: fx.Node, forms: dict[fx.Node, _Form]) -> _Form:
    if node.op != "call_function" or node.meta.get(META_KIND) in ("parameter", "buffer", "user_input"):
        return None  # a value we cannot know when planning
    if torch.Tag.nondeterministic_seeded in getattr(node.target, "tags", ()):
        return None  # a random draw: one sample proves nothing
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return None
    shape = tuple(int(s) for s in val.shape)
    rows = shape[0] if len(shape) > 1 else 1  # a batch of position vectors: counted per row
    size = val.numel()
    if size <= _SMALL or (size <= _BATCHED and size <= rows * _WIDE * max(shape, default=1)):
        return _evaluate(node, forms)
    name = getattr(node.target, "__name__", "").split(".")[0]
    if len(shape) < 2 or val.dtype != torch.bool:  # a symbolic mask is a boolean (..., Lq, Lk) square
        return None
    if name in _COMPARE and len(node.args) == 2:
        return _compare(name, node.args[0], node.args[1], forms, shape)
    ins = [_form(n, forms) for n in node.all_input_nodes]
    if name in _AND and len(ins) == 2:
        return _conjoin(ins, shape)
    if name in _PASS and len(ins) == 1 and isinstance(ins[0], _Mask):
        mask = ins[0]
        return mask if (shape[-2], shape[-1]) == (mask.lq, mask.lk) else None
    return None


def _evaluate(node: fx.Node, forms: dict[fx.Node, _Form]) -> Value | None:
    """Run the node on the CPU from its inputs' values (None when one is unknown or the op fails); values
    the same along a dim (positions expanded over the batch) are held and computed once along it
    (:mod:`autoshard.capture.compact`)."""
    values: dict[fx.Node, Value] = {}
    for n in node.all_input_nodes:
        form = _form(n, forms)
        if not isinstance(form, Value):
            return None
        values[n] = form
    return evaluate(node, values)


def _vector(value: Any, forms: dict[fx.Node, _Form], shape: tuple[int, ...]) -> tuple[str, np.ndarray] | None:
    """``("q", v)`` for a value varying along the query dim only, ``("k", v)`` along the key dim only."""
    form = _form(value, forms) if isinstance(value, fx.Node) else value_of(torch.as_tensor(value))
    if not isinstance(form, Value) or len(form.shape) > len(shape):
        return None
    pad = (1,) * (len(shape) - len(form.shape))
    full_shape, compact = pad + form.shape, form.compact.reshape(pad + tuple(form.compact.shape))
    rows, cols = full_shape[-2], full_shape[-1]
    # rows and heads: only those held apart are compared (a dim held once is the same along it)
    lead = compact.expand(*compact.shape[:-2], rows, cols).reshape(-1, rows, cols)
    if not bool((lead == lead[:1]).all()):  # positions that differ between batch rows or heads
        return None
    if cols == 1:
        return "q", lead[0, :, 0].expand(shape[-2]).numpy() if rows == 1 else lead[0, :, 0].numpy()
    if rows == 1:
        return "k", lead[0, 0].numpy()
    return None


def _compare(name: str, a: Any, b: Any, forms: dict[fx.Node, _Form], shape: tuple[int, ...]) -> _Form:
    left, right = _vector(a, forms, shape), _vector(b, forms, shape)
    if left is None or right is None:
        return None
    if (left[0], right[0]) == ("k", "q"):
        left, right, name = right, left, _FLIP[name]
    if (left[0], right[0]) != ("q", "k"):
        return None
    return _Mask(shape[-2], shape[-1], (_Term(name, left[1], right[1]),))


def _conjoin(ins: list[_Form], shape: tuple[int, ...]) -> _Form:
    terms: list[_Term] = []
    for form in ins:
        if isinstance(form, _Mask) and (form.lq, form.lk) == shape[-2:]:
            terms.extend(form.terms)
        elif not (isinstance(form, Value) and form.dtype == torch.bool and bool(form.compact.all())):
            return None  # only an all-true operand (a ones tensor) is known without the square
    return _Mask(shape[-2], shape[-1], tuple(terms))
