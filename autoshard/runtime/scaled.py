"""Scaled-down copies of the zoo's architectures: what ``verify --plan`` runs a big model's plan on.

A copy keeps the layer structure of its original (GQA stays GQA, MoE stays MoE, tied embeddings stay tied),
has two repeated layers, and makes every dim a plan may split divisible by 8 (three mesh axes of 2): hidden
128, 16 attention heads (8 key/value heads), vocabulary 512, 8 experts; batch 8, sequence 16.  It is built on
the CPU with real weights, in float32 unless asked otherwise (bfloat16 for Mixtral, whose float32 graph
differs).

Example::

    case = build_scaled("llama3-70b")    # LlamaForCausalLM, 128 hidden x 2 layers, input ids (8, 16)
"""

from __future__ import annotations

import torch

from autoshard import zoo
from autoshard.zoo import MLP, ModelCase, UnknownModelError

__all__ = ["build_scaled", "scalable"]


def _mlp(o: zoo._Options) -> ModelCase:
    model = zoo._build_on(o, lambda: MLP(64, 256))
    return ModelCase("mlp (scaled)", model, (torch.zeros((o.batch, o.seq, 64), dtype=o.dtype),), {}, "")


_GPT2 = zoo._gpt2("gpt2 (scaled)", 128, 2, 8, vocab=512, positions=64)
_LLAMA = zoo._llama("llama (scaled)", 128, 2, 16, 8, 256, vocab=512)
_BERT = zoo._bert("bert (scaled)", 128, 2, 8, 256, vocab=512)
_MIXTRAL = zoo._mixtral("mixtral (scaled)", 128, 2, 16, 8, 64, 8, 512)
_SCALED: dict[str, zoo.Builder] = {
    "seed": zoo._seed,
    "mlp": _mlp,
    "mlp-deep": zoo._mlp_deep,
    **dict.fromkeys(("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "gpt2-tiny"), _GPT2),
    **dict.fromkeys(("llama3-8b", "llama3-70b", "llama-tiny"), _LLAMA),
    **dict.fromkeys(("bert-base", "bert-large", "bert-tiny"), _BERT),
    **dict.fromkeys(("mixtral-8x7b", "mixtral-tiny"), _MIXTRAL),
}


def scalable(name: str) -> bool:
    """Whether zoo model ``name`` has a scaled-down copy."""
    return name in _SCALED


# Where float32 changes the graph, the copy keeps the original's dtype: Mixtral's experts are one
# aten._grouped_mm in bfloat16 but an opaque fallback op in float32, which no plan decision maps onto.
_NATIVE_DTYPE = dict.fromkeys(("mixtral-8x7b", "mixtral-tiny"), torch.bfloat16)


def build_scaled(name: str, *, batch: int = 8, seq: int = 16, dtype: torch.dtype | None = None) -> ModelCase:
    """The scaled-down copy of zoo model ``name`` (module doc); ``dtype`` default float32 (bfloat16 for
    Mixtral)."""
    dtype = dtype or _NATIVE_DTYPE.get(name, torch.float32)
    builder = _SCALED.get(name)
    if builder is None:
        raise UnknownModelError(
            f"no scaled-down copy of {name!r}: verify --plan rebuilds zoo models ({', '.join(_SCALED)}); for "
            "your own model pass --model path/to/file.py:function returning a small copy"
        )
    layers = None if name == "seed" else 2
    return builder(zoo._Options(batch=batch, seq=seq, device="cpu", dtype=dtype, layers=layers))
