"""Scaled-down copies of a model: what ``verify --plan`` runs a big model's plan on.

A copy keeps the layer structure of its original (GQA stays GQA, MoE stays MoE, tied embeddings stay tied),
has two repeated layers, and makes every dim a plan may split divisible by 8 (three mesh axes of 2): hidden
128, 16 attention heads (8 key/value heads), vocabulary 512, 8 experts; batch 8, sequence 16.  It is built on
the CPU with real weights, in float32 unless asked otherwise (bfloat16 for Mixtral, whose float32 graph
differs).  :func:`build_scaled` builds the zoo's architectures; :func:`scale_hf` rebuilds a user's Hugging
Face model (built on meta from its config) the same way: its own class, from a copy of its config with those
sizes and its dropout (and router jitter) off, as in the zoo's copies: verify reproduces dropout and attention
dropout draw for draw (:mod:`autoshard.runtime.rng`), but refuses a plan that splits any other random op (router
jitter among them), so the copies check every plan's arithmetic with draws off.  A plain ``nn.Module`` on meta has no
config to rebuild from: the user returns a small copy instead.

Example::

    case = build_scaled("llama3-70b")    # LlamaForCausalLM, 128 hidden x 2 layers, input ids (8, 16)
    case = scale_hf(zoo.load_spec("my_model.py:build"))   # the user's HF model, the same sizes
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from autoshard import zoo
from autoshard.errors import AutoshardError
from autoshard.zoo import MLP, ModelCase, UnknownModelError

__all__ = ["build_scaled", "refuse_float64_experts", "scalable", "scale_hf"]


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


def _no_float64(name: str, dtype: torch.dtype | None) -> None:
    """Experts run aten._grouped_mm, which has no float64 kernel (bfloat16 only on the CPU, float32 falls back
    to an opaque op): refuse --float64 in one line instead of failing deep in the forward."""
    if dtype == torch.float64:
        raise AutoshardError(
            f"verify --float64 cannot run {name}: its experts are one aten._grouped_mm, which has no float64 "
            "kernel; verify without --float64 (bfloat16, the experts' native dtype, to its tolerance)"
        )


def refuse_float64_experts(name: str, model: torch.nn.Module) -> None:
    """:func:`_no_float64` for a model given as it is: one whose experts hold 3-D (stacked) weights runs them
    as aten._grouped_mm."""
    if any(p.dim() == 3 and "experts" in k for k, p in model.named_parameters()):
        _no_float64(name, torch.float64)


def build_scaled(name: str, *, batch: int = 8, seq: int = 16, dtype: torch.dtype | None = None) -> ModelCase:
    """The scaled-down copy of zoo model ``name`` (module doc); ``dtype`` default float32 (bfloat16 for
    Mixtral)."""
    if name in _NATIVE_DTYPE:
        _no_float64(name, dtype)
    dtype = dtype or _NATIVE_DTYPE.get(name, torch.float32)
    builder = _SCALED.get(name)
    if builder is None:
        raise UnknownModelError(
            f"no scaled-down copy of {name!r}: verify --plan rebuilds zoo models ({', '.join(_SCALED)}); for "
            "your own model pass --model path/to/file.py:function returning a small copy"
        )
    layers = None if name == "seed" else 2
    return builder(zoo._Options(batch=batch, seq=seq, device="cpu", dtype=dtype, layers=layers))


# The config fields a Hugging Face architecture sizes itself by (aliases across families), and the size each
# takes in a scaled copy: the zoo's scaled sizes above.  Key/value heads keep the original's kind (below).
_SIZES: tuple[tuple[tuple[str, ...], int], ...] = (
    (("num_hidden_layers", "n_layer", "num_layers", "num_decoder_layers"), 2),
    (("hidden_size", "n_embd", "d_model"), 128),
    (("num_attention_heads", "n_head", "num_heads"), 16),
    (("intermediate_size", "n_inner", "ffn_dim", "d_ff"), 256),
    (("moe_intermediate_size",), 64),
    (("vocab_size",), 512),
    (("num_local_experts", "num_experts", "n_routed_experts"), 8),
)
_HEADS = 16


def scale_hf(
    case: ModelCase, *, batch: int = 8, seq: int = 16, dtype: torch.dtype | None = None
) -> ModelCase:
    """A scaled-down copy (module doc) of ``case``'s Hugging Face model, rebuilt on the CPU from its config.

    Every input must be a (batch, sequence) tensor (ids, masks, labels): each becomes a zero tensor of the same
    dtype at (``batch``, ``seq``).  ``dtype``: default float32, bfloat16 for a model with experts (their float32
    graph is an opaque op, as Mixtral's).  Raises :class:`AutoshardError` saying what to pass instead when the
    model has no config to rebuild from or its inputs are not token-shaped."""
    model = case.model
    config = getattr(model, "config", None)
    if config is None or not callable(getattr(config, "to_dict", None)):
        raise AutoshardError(
            f"{case.name} builds a {type(model).__name__} on the meta device and has no Hugging Face config to "
            "rebuild it small from: pass --model path/to/file.py:function returning a small copy with real "
            "weights (same class and module names, 2 repeated layers, dims divisible by 8) and its inputs"
        )
    small = copy.deepcopy(config)
    for names, size in _SIZES:
        for name in names:
            if isinstance(getattr(small, name, None), int) and not isinstance(getattr(small, name), bool):
                setattr(small, name, min(size, getattr(small, name)) if "experts" in name else size)
    heads, kv = _HEADS, getattr(config, "num_key_value_heads", None)
    if isinstance(
        kv, int
    ):  # multi-head stays multi-head, multi-query stays multi-query, grouped stays grouped
        small.num_key_value_heads = heads if kv == _config_heads(config) else 1 if kv == 1 else heads // 2
    for name in ("head_dim", "d_kv"):  # where the config states the head size (else hidden / heads)
        if isinstance(getattr(small, name, None), int):
            setattr(small, name, 128 // heads)
    for name, value in small.to_dict().items():  # random draws off, as in the zoo's copies (module doc)
        if (
            isinstance(value, float)
            and value > 0
            and ("dropout" in name or "pdrop" in name or "jitter" in name)
        ):
            setattr(small, name, 0.0)
    experts = any(isinstance(getattr(small, n, None), int) for n in _SIZES[-1][0])
    if experts:
        _no_float64(type(model).__name__, dtype)
    chosen = dtype or (torch.bfloat16 if experts else torch.float32)
    args, kwargs = _token_inputs(case, batch, seq)
    torch.manual_seed(0)
    try:
        with torch.device("cpu"):
            copy_model = type(model)(small).to(chosen).train(model.training)
    except Exception as e:
        raise AutoshardError(
            f"rebuilding {type(model).__name__} from its config at scaled-down sizes failed ({type(e).__name__}: "
            f"{e}); return a small copy with real weights from --model path/to/file.py:function"
        ) from e
    return ModelCase(
        f"{case.name} (scaled)", copy_model, args, kwargs, f"{type(model).__name__} rebuilt small"
    )


def _config_heads(config: Any) -> int | None:
    for name in _SIZES[2][0]:
        if isinstance(getattr(config, name, None), int):
            return int(getattr(config, name))
    return None


def _token_inputs(case: ModelCase, batch: int, seq: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Every (B, S) input of ``case`` as zeros of shape (``batch``, ``seq``); anything else is refused."""
    tensors = [v for v in (*case.args, *case.kwargs.values()) if isinstance(v, torch.Tensor)]
    shape = tensors[0].shape if tensors else None

    def small(name: str, v: Any) -> Any:
        if not isinstance(v, torch.Tensor):
            return v
        if v.dim() != 2 or v.shape != shape or v.is_floating_point():
            raise AutoshardError(
                f"{case.name}: input {name} of shape {tuple(v.shape)} is not a (batch, sequence) tensor of "
                "token ids, masks or labels, so it cannot be shrunk with the model: return a small copy and its "
                "inputs from --model path/to/file.py:function"
            )
        return torch.zeros((batch, seq), dtype=v.dtype)

    args = tuple(small(f"#{k}", v) for k, v in enumerate(case.args))
    return args, {k: small(k, v) for k, v in case.kwargs.items()}
