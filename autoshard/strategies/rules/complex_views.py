"""Complex views: ``view_as_complex`` and ``view_as_real`` (RoPE written with complex numbers).

``view_as_complex(x[..., 2])`` pairs the last dim (size 2: real, imaginary) into one complex element;
``view_as_real`` splits it back out.  Every other dim is batch-like; the pair dim stays whole.  Both are
linear views (a complex Partial sums real and imaginary parts alike), so Partial passes through.
Complex arithmetic itself (``mul``, ``add`` of complex tensors) goes through the pointwise rules: a complex
tensor counts as floating for Partial and gradients, and is priced as a pair of floats (its itemsize).

Example: ``view_as_complex(x[B, S, H, D/2, 2])`` on mesh (2,) splits ``B``, ``S``, ``H`` or ``D/2``.
"""

from __future__ import annotations

import torch
from torch import fx

from autoshard.strategies.dimmap import DimMap, fresh_letters, strategies_from_map
from autoshard.strategies.registry import register
from autoshard.strategies.strategy import OpStrategy, tensor_meta

aten = torch.ops.aten


@register(aten.view_as_complex.default, aten.view_as_real.default)
def complex_view(node: fx.Node, mesh_shape: tuple[int, ...]) -> list[OpStrategy]:
    """Shared leading letters; the (real, imaginary) pair dim whole."""
    x = node.args[0]
    val = tensor_meta(x)
    assert isinstance(x, fx.Node) and val is not None
    to_complex = node.target is aten.view_as_complex.default
    lead = tuple(fresh_letters(val.dim() - 1 if to_complex else val.dim()))
    pair = (*lead, None)
    dm = DimMap((pair if to_complex else lead,), (lead if to_complex else pair,), linear_in=(frozenset({0}),))
    return strategies_from_map(node, (x,), dm, mesh_shape)
