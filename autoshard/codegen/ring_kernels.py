"""What the ring (:mod:`autoshard.codegen.context`) computes for one (query chunk, key chunk) block: torch's fused
attention where one applies, explicit math otherwise; and the log-sum-exp merge of the blocks' partial results.

Which path runs, per block (:func:`kernel` picks once per ring call, the block's visibility does the rest):

- **fused** -- the block is wholly visible (``"all"``: below a causal ring's diagonal, any block of a ring
  with neither mask nor causality -- no mask is built for it --, or an explicit mask's all-true block) or is
  the lower triangle (``"causal"``: a causal ring's diagonal block, or an explicit mask's block equal to it,
  e.g. a model's own causal mask), and an op takes the inputs:

  - CPU: ``aten._scaled_dot_product_flash_attention_for_cpu`` and its ``_backward``: float64, float32, bfloat16,
    float16, with q, k and v of one head size; 16-bit blocks computed in float32 (:func:`block_dtype` says why);
  - CUDA: ``aten._scaled_dot_product_flash_attention`` and its ``_backward``: float16 / bfloat16 where torch's
    own check (``torch.backends.cuda.can_use_flash_attention``) accepts them.

  The block runs with ``is_causal`` when ``"causal"`` (top-left aligned: the chunks are square), in full when
  ``"all"``; a block with nothing visible is never asked for (:func:`autoshard.codegen.context._blocks`).
  :func:`fused_calls` folds one ring step's chunk pairs into as few calls as torch's context parallelism makes
  (one per step on a causal zigzag ring).
- **math** -- scores materialised, softmax by hand, in float32 for 16-bit inputs: a block an explicit mask
  shows only in part (and not as the triangle), v of another head size than q on the CPU, float32/float64 on
  CUDA (flash takes 16-bit only; the memory-efficient kernel pads its lse to 32 rows and cuDNN's keeps a
  trailing dim -- neither is wired here), any other device.

Forward: each block returns ``(out, lse)``; :func:`merge` folds it into the running ``(out, lse)`` of its query
rows in float32 (float64 for float64) -- torch's context parallelism merges by the same rule
(``_SDPAMerger``), written here as ``logaddexp`` so that rows no block has reached yet (``lse = -inf``) stay 0.
Backward: each block's fused backward is given the *global* ``out`` and ``lse`` of its query rows (as ring
flash attention does): ``exp(scores - lse)`` are then the final probabilities, and ``rowsum(dout * out)`` the
final correction, so the per-block ``dq, dk, dv`` sum to the exact gradient.  The caller accumulates them in
float32.

Grouped-query K/V reach these functions already expanded to the query heads (neither flash op takes
``enable_gqa``); the caller folds ``dk, dv`` back.
"""

from __future__ import annotations

import warnings
from typing import Literal

import torch

__all__ = [
    "Block",
    "Kernel",
    "Visibility",
    "block_backward",
    "block_dtype",
    "block_forward",
    "fused_calls",
    "kernel",
    "merge",
    "visibility",
]

aten = torch.ops.aten

Kernel = Literal["cpu", "cuda"]
"""Which fused op runs a block (None: math everywhere)."""
Visibility = Literal["all", "causal"] | torch.Tensor
"""Of a block: every key, the lower triangle, or a boolean ``(..., Lq, Lk)`` (True = attend)."""
Block = tuple[slice, slice, Visibility]  # local query rows, held key rows, which keys each query sees

_CPU_DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)


def fused_calls(blocks: list[Block], chunk: int) -> list[Block]:
    """The blocks as fewer, larger fused calls, as torch's context parallelism makes them: pairs that tile a
    rectangle of whole (``"all"``) pairs become one ``"all"`` call, and a square of chunk pairs whose diagonal is
    ``"causal"``, below it ``"all"`` and above it absent becomes one ``"causal"`` call (the held chunks' global
    positions increase, so the square's triangle is its own).  A zigzag rank thus makes one call per step.
    Anything else (an explicit mask's partial block) stays as it is."""
    kinds = {(qs.start // chunk, ks.start // chunk): vis for qs, ks, vis in blocks}
    if len(blocks) < 2 or not all(isinstance(v, str) for v in kinds.values()):
        return blocks
    rows, cols = sorted({a for a, _ in kinds}), sorted({b for _, b in kinds})
    span = (slice(rows[0] * chunk, (rows[-1] + 1) * chunk), slice(cols[0] * chunk, (cols[-1] + 1) * chunk))
    if kinds == {(a, b): "all" for a in range(rows[0], rows[-1] + 1) for b in range(cols[0], cols[-1] + 1)}:
        return [(*span, "all")]
    tri = {(a, b): "all" if b < a else "causal" for a in rows for b in rows if b <= a}
    if rows == cols == list(range(rows[0], rows[-1] + 1)) and kinds == tri:
        return [(*span, "causal")]
    return blocks


def visibility(visible: torch.Tensor) -> Visibility:
    """``"all"``, ``"causal"`` (the lower triangle in every leading index) or the mask itself."""
    if bool(visible.all()):
        return "all"
    lq, lk = visible.shape[-2:]
    triangle = torch.ones(lq, lk, dtype=torch.bool, device=visible.device).tril()
    return "causal" if lq == lk and bool((visible == triangle).all()) else visible


def kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Kernel | None:
    """The fused op that runs this ring's blocks (q, k, v as the blocks see them, K/V expanded), or None."""
    if not (q.dtype == k.dtype == v.dtype) or q.shape[-1] != v.shape[-1]:
        return None
    if q.device.type == "cpu":
        return "cpu" if q.dtype in _CPU_DTYPES else None
    if q.device.type != "cuda" or q.dtype not in (torch.float16, torch.bfloat16):
        _slow(q, f"{q.dtype} on {q.device.type} has no fused op wired here")
        return None
    params = torch.backends.cuda.SDPAParams(q, k, v, None, 0.0, False, False)
    if torch.backends.cuda.can_use_flash_attention(params):
        return "cuda"
    _slow(q, "torch's flash attention refuses these inputs")
    return None


_SAID: set[str] = set()


def _slow(q: torch.Tensor, why: str) -> None:
    """No fused op: said once per reason on an accelerator (the plan priced fused attention; the math path
    materialises each block's scores in float32), silent on the CPU (verify, tests) and meta."""
    if q.device.type not in ("cpu", "meta") and why not in _SAID:
        _SAID.add(why)
        warnings.warn(
            f"autoshard ring attention runs explicit math, not a fused kernel ({why}): slower than the plan "
            "priced, and each block's scores are held in float32; use bf16/fp16 inputs for the flash path",
            RuntimeWarning,
            stacklevel=3,
        )


def block_dtype(fused: Kernel | None, visible: Visibility, dtype: torch.dtype) -> torch.dtype:
    """The dtype a block computes in: the inputs' own under CUDA's flash (its tensor cores' bfloat16), else
    float32 for 16-bit inputs (float64 for float64).  On the CPU, float32 block outputs spare each block's
    partial result a rounding to 16 bits before the merge: with them the ring is as close to exact as one
    device's bfloat16 attention (tests/codegen/test_codegen_context_bf16.py; 16-bit blocks were 1.7x further
    off in out and 1.6x in dV), for ~25% more CPU time per step than 16-bit blocks at seq 4096
    (``python -m benchmarks.ring_kernels``).  CUDA keeps 16-bit blocks as torch's context parallelism and ring
    flash attention do: the tensor-core throughput the cost model prices."""
    if fused == "cuda" and isinstance(visible, str):
        return dtype
    return torch.promote_types(dtype, torch.float32)


def block_forward(
    fused: Kernel | None,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    visible: Visibility,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out, lse)`` of one block: ``out (B, H, Lq, Ev)`` in q's dtype (fused) or the math dtype, ``lse (B, H, Lq)``
    in float32 (float64 for float64).  Math: pass q, k, v already in the dtype to compute in."""
    if fused is not None and isinstance(visible, str):
        causal = visible == "causal"
        if fused == "cpu":
            out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, scale=scale)
        else:
            out, lse, *_ = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=scale)
        return out, lse
    scores = _scores(q, k, visible, scale)
    lse = torch.logsumexp(scores, dim=-1)
    return torch.exp(scores - lse[..., None]).nan_to_num(0.0) @ v, lse


def merge(
    out: torch.Tensor, lse: torch.Tensor, rows: slice, part: torch.Tensor, part_lse: torch.Tensor
) -> None:
    """Fold one block's ``(part, part_lse)`` into the running ``out``, ``lse`` of query ``rows`` (in place, in
    their dtype): the softmax over both key sets, weighting each by its share of the new normaliser."""
    old = lse[:, :, rows]
    new = torch.logaddexp(old, part_lse.to(lse.dtype))
    keep = torch.exp(old - new).nan_to_num(0.0)[..., None]  # -inf - -inf: a row nothing has reached yet
    take = torch.exp(part_lse - new).nan_to_num(0.0)[..., None]
    out[:, :, rows] = out[:, :, rows] * keep + part.to(out.dtype) * take
    lse[:, :, rows] = new


def block_backward(
    fused: Kernel | None,
    grad: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    delta: torch.Tensor,
    visible: Visibility,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(dq, dk, dv)`` of one block, K/V expanded, given the global ``out``, ``lse`` of its query rows.

    Fused: grad, q, k, v, out in the inputs' dtype.  Math: all in the dtype to compute in, with ``delta`` the
    rows' ``sum(grad * out)`` (the fused ops compute it from ``out``)."""
    if fused is not None and isinstance(visible, str):
        causal, lse = visible == "causal", lse.contiguous()
        if fused == "cpu":
            dq, dk, dv = aten._scaled_dot_product_flash_attention_for_cpu_backward(
                grad, q, k, v, out, lse, 0.0, causal, scale=scale
            )
        else:  # dense (no cumulative lengths), no dropout: the rng state is not read
            unused = torch.empty((), dtype=torch.int64, device=q.device)
            dq, dk, dv = aten._scaled_dot_product_flash_attention_backward(
                grad, q, k, v, out, lse, None, None, q.shape[2], k.shape[2], 0.0, causal, unused, unused,
                scale=scale,
            )  # fmt: skip
        return dq, dk, dv
    probs = torch.exp(_scores(q, k, visible, scale) - lse[..., None]).nan_to_num(0.0)
    dscores = probs * (grad @ v.transpose(-1, -2) - delta)
    return (dscores @ k) * scale, (dscores.transpose(-1, -2) @ q) * scale, probs.transpose(-1, -2) @ grad


def _scores(q: torch.Tensor, k: torch.Tensor, visible: Visibility, scale: float) -> torch.Tensor:
    scores = (q @ k.transpose(-1, -2)) * scale
    if isinstance(visible, str):
        if visible == "all":
            return scores
        visible = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).tril()
    return scores.masked_fill(~visible, -torch.inf)
