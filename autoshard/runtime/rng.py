"""Randomness of an emitted module equal to the single-device model's: dropout masks cut from the global mask.

Input: a lowered graph (:func:`~autoshard.codegen.lower.lower_graph`), the plan's strategy per node and this
rank's mesh coordinate.  Output: the same graph, where every training-mode ``aten.dropout`` /
``aten.native_dropout`` and every ``aten.scaled_dot_product_attention`` with ``dropout_p > 0`` call
:func:`seeded_dropout` / :func:`seeded_native_dropout` / :func:`seeded_sdpa` instead
(:func:`reproducible_randomness`, run by ``autoshard.parallelize``).  Any other random op runs as captured:
exact while its strategy is replicated (every rank draws it whole), not once split;
:func:`unreproduced` names those, and ``verify`` refuses them in one line rather than report a MISMATCH.

How: the single-device model draws each dropout mask from the default CPU generator, in graph order, as
``empty_like(x).bernoulli_(1 - p)`` (ATen's ``_dropout``; the CPU SDPA takes its math path when
``dropout_p > 0`` and draws the attention-probability mask the same way).  Every rank draws the *global*
mask the same way, in the same order, and keeps its own piece: in sharded regions the values are the
single-device ones, in replicated regions every rank holds the same mask, and the generator advances
identically on every rank, so later random ops stay in step.  The cost is one global mask per dropout,
transiently (CPU generators have no counter offset to jump to a piece, as CUDA's Philox does for DTensor).
The attention takes its probabilities from ATen's math op and applies the mask as the math path's dropout
does (bitwise eager's); a boolean ``attn_mask`` (Hugging Face GPT-2 and LLaMA under export) is first made
``0 / -inf`` as ``scaled_dot_product_attention`` does, since the math op adds its mask as given.
Condition: every rank seeds alike (``torch.manual_seed(s)`` before the step, as the single-device run).
The inputs are assumed contiguous (``empty_like`` keeps strides; a transposed input would draw in another
order) -- the outputs of linear, softmax and attention are.

Example (what the emitted code shows)::

    dropout = autoshard.runtime.rng.seeded_dropout(add, 0.1, True, '(S(0), R)', (2, 2), (1, 0))
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence

import torch
from torch import fx

from autoshard.codegen.shard import local_piece
from autoshard.placement import ShardingSpec
from autoshard.strategies import OpStrategy
from autoshard.strategies.local import bind, shard_range

__all__ = [
    "reproducible_randomness",
    "seeded_dropout",
    "seeded_native_dropout",
    "seeded_sdpa",
    "unreproduced",
]

aten = torch.ops.aten


@functools.lru_cache(maxsize=256)
def _spec(text: str) -> ShardingSpec:
    return ShardingSpec.parse(text)


def _global_mask(
    local_shape: Sequence[int],
    p: float,
    spec: ShardingSpec,
    mesh: Sequence[int],
    coord: Sequence[int],
    zigzag_axis: int | None = None,
) -> torch.Tensor:
    """This rank's piece of a Bernoulli(1 - p) mask drawn for the whole tensor, scaled by 1 / (1 - p)
    (``zigzag_axis``: context parallelism's load-balanced layout, :func:`~autoshard.codegen.shard.local_piece`)."""
    shape = [n * spec.shard_count(d, mesh) for d, n in enumerate(local_shape)]
    noise = torch.empty(shape).bernoulli_(1 - p)
    if zigzag_axis is not None:
        return local_piece(noise, spec, mesh, coord, zigzag_axis)
    index = tuple(
        slice(start, start + length)
        for d, size in enumerate(shape)
        for start, length in (shard_range(spec, d, size, mesh, coord),)
    )
    return noise[index]


def seeded_dropout(
    x: torch.Tensor,
    p: float,
    train: bool | None,
    spec: str,
    mesh: tuple[int, ...],
    coord: tuple[int, ...],
    zigzag_axis: int | None = None,
) -> torch.Tensor:
    """``dropout(x, p, train)`` on this rank's piece ``x`` of a tensor placed ``spec`` (module doc)."""
    if not train or p == 0:
        return x
    if p == 1:
        return x * 0.0
    noise = _global_mask(x.shape, p, _spec(spec), mesh, coord, zigzag_axis).to(dtype=x.dtype, device=x.device)
    return x * noise.div_(1 - p)


def seeded_native_dropout(
    x: torch.Tensor,
    p: float,
    train: bool | None,
    spec: str,
    mesh: tuple[int, ...],
    coord: tuple[int, ...],
    zigzag_axis: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``native_dropout(x, p, train)`` (train not False, ``0 < p``) on this rank's piece: ``(x * keep * scale,
    keep)`` as ATen computes it, ``keep`` this rank's piece of the global mask."""
    keep = _global_mask(x.shape, p, _spec(spec), mesh, coord, zigzag_axis).to(device=x.device).bool()
    return x.mul(keep).mul_(0.0 if p == 1 else 1 / (1 - p)), keep


def seeded_sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    *,
    spec: str,
    mesh: tuple[int, ...],
    coord: tuple[int, ...],
    zigzag_axis: int | None = None,
) -> torch.Tensor:
    """``scaled_dot_product_attention`` with dropout as the CPU math path computes it (the attention
    probabilities times the mask scaled by ``1 / (1 - p)``, then times ``v``), with this rank's piece of the
    global probability mask ``(B, H, S, L)``; ``spec`` places that mask (q's dims 0-2, k's dim 2)."""
    if attn_mask is not None and attn_mask.dtype == torch.bool:  # the math op adds its mask as given
        attn_mask = torch.where(attn_mask, 0.0, float("-inf")).to(q.dtype)
    _, probs = aten._scaled_dot_product_attention_math(
        q, k, v, attn_mask, 0.0, is_causal, scale=scale, enable_gqa=enable_gqa
    )  # (B, H, S, L); its output, without dropout, is not used
    if enable_gqa and v.shape[-3] != probs.shape[-3]:  # the math path repeats each key/value head
        v = v.repeat_interleave(probs.shape[-3] // v.shape[-3], dim=-3)
    if dropout_p == 1:  # ATen's dropout draws nothing then
        return torch.matmul(probs * 0.0, v)
    noise = _global_mask(probs.shape, dropout_p, _spec(spec), mesh, coord, zigzag_axis)
    return torch.matmul(probs * noise.to(dtype=probs.dtype, device=probs.device).div_(1 - dropout_p), v)


_REPRODUCED = (aten.dropout.default, aten.native_dropout.default, aten.scaled_dot_product_attention.default)


def unreproduced(graph: fx.Graph, strategies: Mapping[str, OpStrategy]) -> tuple[str, ...]:
    """The random ops of ``graph`` whose pieces cannot be the single-device draws: each rank would draw its
    piece's shape from the same generator state.  Those other than dropout and attention dropout
    (:func:`reproducible_randomness`) whose strategy splits an output, as ``"name (op, strategy)"``."""
    found = []
    for node in graph.nodes:
        strategy = strategies.get(node.name)
        target = node.target
        if node.op != "call_function" or strategy is None or not isinstance(target, torch._ops.OpOverload):
            continue
        if target in _REPRODUCED or torch.Tag.nondeterministic_seeded not in target.tags:
            continue
        bound = bind(target, node.args, node.kwargs)
        if bound.get("train", bound.get("training")) is False or bound.get("p") == 0:
            continue
        if any(s is not None and not s.is_replicated() for s in strategy.outputs):
            found.append(f"{node.name} ({target}, {strategy})")
    return tuple(found)


def _mask_spec_of_sdpa(strategy: OpStrategy) -> ShardingSpec:
    out, key = strategy.outputs[0], strategy.inputs[1]
    assert out is not None and key is not None, "SDPA strategies place q's output and k"
    placements = []
    for p_out, p_key in zip(out.placements, key.placements, strict=True):
        dim = getattr(p_out, "dim", None)
        key_dim = getattr(p_key, "dim", None)
        if dim is not None and dim < 3:
            placements.append(str(p_out))
        elif key_dim == 2:
            placements.append("S(3)")
        else:
            placements.append("R")
    return ShardingSpec.parse(tuple(placements))


def reproducible_randomness(
    graph: fx.Graph,
    strategies: Mapping[str, OpStrategy],
    mesh: tuple[int, ...],
    coord: tuple[int, ...],
    zigzag_axis: int | None = None,
) -> int:
    """Rewrite every random op of ``graph`` to draw the single-device values (module doc); returns how many."""
    count = 0
    for node in graph.nodes:
        strategy = strategies.get(node.name)
        if node.op != "call_function" or strategy is None:
            continue
        if node.target is aten.dropout.default or node.target is aten.native_dropout.default:
            x = node.args[0]
            p = node.args[1] if len(node.args) > 1 else node.kwargs.get("p")
            train = node.args[2] if len(node.args) > 2 else node.kwargs.get("train")
            native = node.target is aten.native_dropout.default
            if train is False or not p or not (train or native):  # native_dropout's train=None trains
                continue
            out = strategy.outputs[0]
            assert out is not None
            args = (x, p, train, str(out), mesh, coord, zigzag_axis)
            node.target, node.args, node.kwargs = (
                seeded_native_dropout if native else seeded_dropout,
                args,
                {},
            )
            count += 1
        elif node.target is aten.scaled_dot_product_attention.default:
            names = ("attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
            bound = dict(zip(("q", "k", "v", *names), node.args, strict=False))
            bound.update(node.kwargs)
            if not bound.get("dropout_p"):
                continue
            spec = str(_mask_spec_of_sdpa(strategy))
            node.target = seeded_sdpa
            node.args = (bound["q"], bound["k"], bound["v"])
            node.kwargs = {n: bound[n] for n in names if n in bound} | {
                "spec": spec,
                "mesh": mesh,
                "coord": coord,
                "zigzag_axis": zigzag_axis,
            }
            count += 1
    return count
