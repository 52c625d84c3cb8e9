"""``embedding(weight[V, h], indices[...]) -> out[..., h]``: the dim map ``"vh,...->...h"``.

Per mesh axis:

- split an index dim: indices ``S(d)``, weight ``R``, output ``S(d)`` (data parallel);
- split ``h``: weight ``S(1)`` (column split), output ``S(-1)``;
- split ``v``: weight ``S(0)``, output ``P`` -- Megatron's vocab-parallel embedding.  ``v`` is contracted in the
  dim map's sense (a lookup is a one-hot matmul), and the ``local_args`` hook makes it true: each device looks up
  only ids in its vocab range and yields zeros elsewhere (:func:`vocab_parallel_embedding`);
- pass Partial through the weight (the lookup is linear in it).

Example on mesh (2,) with weight (8, 4) and indices (2, 3): ``R, R -> R``, ``R, S(0) -> S(0)``,
``R, S(1) -> S(1)``, ``S(1), R -> S(2)``, ``S(0), R -> P``, ``P, R -> P``.
"""

from __future__ import annotations

import torch
from torch import fx

from autoshard.strategies.dimmap import DimMap, fresh_letters, strategies_from_map
from autoshard.strategies.local import LocalCall, LocalContext, bind, default_call
from autoshard.strategies.registry import register
from autoshard.strategies.strategy import OpStrategy, tensor_meta

aten = torch.ops.aten


def vocab_parallel_embedding(
    weight: torch.Tensor,
    indices: torch.Tensor,
    vocab_start: int,
    padding_idx: int = -1,
    scale_grad_by_freq: bool = False,
    sparse: bool = False,
) -> torch.Tensor:
    """Look up the ids that fall in rows ``vocab_start : vocab_start + len(weight)``; zeros for the others.

    ``padding_idx`` is global.  (``scale_grad_by_freq`` counts the masked ids as id 0 of the shard.)
    """
    local = indices - vocab_start
    mask = (local >= 0) & (local < weight.shape[0])
    local_pad = padding_idx - vocab_start if 0 <= padding_idx - vocab_start < weight.shape[0] else -1
    out = aten.embedding.default(weight, local.masked_fill(~mask, 0), local_pad, scale_grad_by_freq, sparse)
    return out * mask.unsqueeze(-1).to(out.dtype)


def _embedding_local(ctx: LocalContext) -> LocalCall:
    b = ctx.bound()
    weight = ctx.node.args[0]
    assert isinstance(weight, fx.Node)
    spec = ctx.input_spec(weight)
    assert spec is not None
    if not any(getattr(p, "dim", None) == 0 for p in spec.placements):
        return default_call(ctx)
    vocab_start, _ = ctx.in_range(weight, 0)
    padding = b["padding_idx"]
    vocab = int(weight.meta["val"].shape[0])
    padding = padding % vocab if padding is not None and padding < -1 else padding
    return LocalCall(
        vocab_parallel_embedding,
        (b["weight"], b["indices"], vocab_start, padding, b["scale_grad_by_freq"], b["sparse"]),
    )


@register(aten.embedding.default, local_args=_embedding_local)
def embedding(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    b = bind(node.target, node.args, node.kwargs)
    weight, indices = b["weight"], b["indices"]
    ids = tensor_meta(indices)
    assert ids is not None
    batch = tuple(fresh_letters(ids.dim(), avoid="vh"))
    dm = DimMap((("v", "h"), batch), ((*batch, "h"),), linear_in=(frozenset({0}),))
    return strategies_from_map(node, (weight, indices), dm, mesh_shape)
