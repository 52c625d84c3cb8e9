"""The built-in model zoo: named models and example inputs, built from configs (random weights, no downloads).

Input: a name from :func:`names` (or a ``path/to/file.py:function`` spec for :func:`load_spec`).
Output: a :class:`ModelCase` — the model, its example ``args``/``kwargs`` and a one-line description.

Large models default to the ``meta`` device (no memory, built in a fraction of a second), tiny ones and the
small plain models to ``cpu`` so tests can run them.  Each model uses its published dtype by default:
float32 for the plain models, GPT-2 and BERT; bfloat16 for LLaMA-3 and Mixtral (for Mixtral this also
makes its grouped-GEMM experts export as ``aten._grouped_mm``; in float32 they export as the opaque custom
op ``transformers.grouped_mm_fallback``).  ``transformers`` is imported inside the builders only: it costs
~5 s, and the core of autoshard must not pay it.

Hugging Face models are built with ``attn_implementation="sdpa"`` (attention stays one
``scaled_dot_product_attention`` op), ``use_cache=False`` (no KV-cache objects in the graph), every dropout
probability 0 and ``eval()`` mode.  Why: dropout changes no shape and no sharding decision, but in the
graph it is a random op that makes a captured graph impossible to compare with eager numerically; with
p = 0 / eval it is an identity that capture's clean pass removes.

Example::

    case = build("llama3-8b", batch=4, seq=2048)      # meta device, bfloat16
    out = case.model(*case.args, **case.kwargs)
    case = load_spec("my_models.py:make_model")        # returns (model, args) or (model, args, kwargs)
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from autoshard.errors import AutoshardError
from autoshard.zoo_extra import MLP, DeepMLP, DeepMLPBlock, SeedTextModel

__all__ = [
    "MLP", "DeepMLP", "DeepMLPBlock", "ModelCase", "SeedTextModel", "UnknownModelError", "build", "default_dtype",
    "load_spec", "names",
]  # fmt: skip

Device = Literal["meta", "cpu"]
Builder = Callable[["_Options"], "ModelCase"]


class UnknownModelError(AutoshardError, ValueError):
    """A model name or spec that the zoo cannot resolve."""


@dataclass(frozen=True)
class ModelCase:
    """A model and the example inputs to capture it with."""

    name: str
    model: nn.Module
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    description: str = ""

    def __str__(self) -> str:
        return f"{self.name}: {self.description}"


@dataclass(frozen=True, slots=True)
class _Options:
    batch: int
    seq: int
    device: Device
    dtype: torch.dtype
    layers: int | None


@dataclass(frozen=True, slots=True)
class _Entry:
    builder: Builder
    batch: int
    seq: int
    device: Device
    dtype: torch.dtype


def _ids(o: _Options) -> torch.Tensor:
    # Zeros, not random ids: valid for any vocabulary, free on the meta device, deterministic on cpu.
    return torch.zeros((o.batch, o.seq), dtype=torch.long, device=o.device)


def _finish(model: nn.Module, o: _Options) -> nn.Module:
    return model.to(dtype=o.dtype).eval()


def _build_on(o: _Options, make: Callable[[], nn.Module]) -> nn.Module:
    """Build on ``o.device`` (on meta: no allocation, no random init work) with a fixed seed on cpu."""
    torch.manual_seed(0)
    with torch.device(o.device):
        return _finish(make(), o)


def _seed(o: _Options) -> ModelCase:
    model = _build_on(o, SeedTextModel)
    return ModelCase("seed", model, (_ids(o),), {}, "Embedding(30522, 64) -> Linear(64, 64) -> Linear(64, 1)")


def _mlp(o: _Options) -> ModelCase:
    model = _build_on(o, lambda: MLP(8192, 32768))
    x = torch.zeros((o.batch, o.seq, 8192), dtype=o.dtype, device=o.device)
    return ModelCase("mlp", model, (x,), {}, "Megatron MLP 8192 -> 32768 -> 8192")


def _mlp_deep(o: _Options) -> ModelCase:
    depth = o.layers or 8
    model = _build_on(o, lambda: DeepMLP(256, depth))
    x = torch.zeros((o.batch, 256), dtype=o.dtype, device=o.device)
    return ModelCase("mlp-deep", model, (x,), {}, f"{depth} x Linear(256, 256) + ReLU")


class MissingDependencyError(AutoshardError, ImportError):
    """A zoo model needs an optional package that is not installed."""


def _require_transformers() -> Any:
    try:
        import transformers
    except ImportError as e:
        raise MissingDependencyError(
            "this zoo model is built with Hugging Face transformers, which is not installed: "
            "pip install 'autoshard[models]' (or pip install transformers)"
        ) from e
    return transformers


def _positions(name: str, positions: int, seq: int) -> int:
    """The model's position limit; a longer sequence is refused, never silently given a bigger table."""
    if seq > positions:
        raise UnknownModelError(
            f"--seq {seq} is beyond the {positions} positions of {name}: use --seq {positions} or less"
        )
    return positions


def _hf_common(vocab: int) -> dict[str, Any]:
    # bos/eos ids inside the vocabulary: transformers warns about tiny vocabularies otherwise.
    return {"use_cache": False, "attn_implementation": "sdpa", "bos_token_id": 0, "eos_token_id": vocab - 1}


def _gpt2(
    name: str, hidden: int, layers: int, heads: int, vocab: int = 50257, positions: int = 1024
) -> Builder:
    def build(o: _Options) -> ModelCase:
        transformers = _require_transformers()

        n = o.layers or layers
        config: dict[str, Any] = {
            "n_embd": hidden,
            "n_layer": n,
            "n_head": heads,
            "vocab_size": vocab,
            "n_positions": _positions(name, positions, o.seq),
            "resid_pdrop": 0.0,
            "embd_pdrop": 0.0,
            "attn_pdrop": 0.0,
        }
        cfg = transformers.GPT2Config(**config, **_hf_common(vocab))
        model = _build_on(o, lambda: transformers.GPT2LMHeadModel(cfg))
        return ModelCase(name, model, (_ids(o),), {}, f"GPT-2 {hidden}h x {n} layers, {heads} heads")

    return build


def _llama(
    name: str,
    hidden: int,
    layers: int,
    heads: int,
    kv: int,
    ffn: int,
    vocab: int = 128256,
    positions: int = 8192,
) -> Builder:
    def build(o: _Options) -> ModelCase:
        transformers = _require_transformers()

        n = o.layers or layers
        config: dict[str, Any] = {
            "hidden_size": hidden,
            "intermediate_size": ffn,
            "num_hidden_layers": n,
            "num_attention_heads": heads,
            "num_key_value_heads": kv,
            "vocab_size": vocab,
            "max_position_embeddings": _positions(name, positions, o.seq),
            "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0},
            "rms_norm_eps": 1e-5,
            "attention_dropout": 0.0,
        }
        cfg = transformers.LlamaConfig(**config, **_hf_common(vocab))
        model = _build_on(o, lambda: transformers.LlamaForCausalLM(cfg))
        desc = f"LLaMA-3 {hidden}h x {n} layers, {heads} heads ({kv} kv), FFN {ffn}"
        return ModelCase(name, model, (_ids(o),), {}, desc)

    return build


def _bert(name: str, hidden: int, layers: int, heads: int, ffn: int, vocab: int = 30522) -> Builder:
    def build(o: _Options) -> ModelCase:
        transformers = _require_transformers()

        n = o.layers or layers
        config: dict[str, Any] = {
            "hidden_size": hidden,
            "num_hidden_layers": n,
            "num_attention_heads": heads,
            "intermediate_size": ffn,
            "vocab_size": vocab,
            "max_position_embeddings": _positions(name, 512, o.seq),
            "hidden_dropout_prob": 0.0,
            "attention_probs_dropout_prob": 0.0,
            "attn_implementation": "sdpa",
        }
        cfg = transformers.BertConfig(**config)
        model = _build_on(o, lambda: transformers.BertForMaskedLM(cfg))
        desc = f"BERT (masked LM) {hidden}h x {n} layers, {heads} heads, FFN {ffn}"
        return ModelCase(name, model, (_ids(o),), {}, desc)

    return build


def _mixtral(
    name: str, hidden: int, layers: int, heads: int, kv: int, ffn: int, experts: int, vocab: int
) -> Builder:
    def build(o: _Options) -> ModelCase:
        transformers = _require_transformers()

        n = o.layers or layers
        config: dict[str, Any] = {
            "hidden_size": hidden,
            "intermediate_size": ffn,
            "num_hidden_layers": n,
            "num_attention_heads": heads,
            "num_key_value_heads": kv,
            "vocab_size": vocab,
            "num_local_experts": experts,
            "num_experts_per_tok": 2,
            "max_position_embeddings": _positions(name, 32768, o.seq),
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
            "attention_dropout": 0.0,
            "router_jitter_noise": 0.0,
            # grouped_mm is the default and the only implementation that exports without materialising
            # every expert's weights per token; naming it turns a silent fallback to "eager" (which
            # fails to export) into an error.
            "experts_implementation": "grouped_mm",
        }
        cfg = transformers.MixtralConfig(**config, **_hf_common(vocab))
        model = _build_on(o, lambda: transformers.MixtralForCausalLM(cfg))
        desc = (
            f"Mixtral {hidden}h x {n} layers, {experts} experts top-2 of FFN {ffn}, {heads} heads ({kv} kv)"
        )
        return ModelCase(name, model, (_ids(o),), {}, desc)

    return build


F32, BF16 = torch.float32, torch.bfloat16
_ZOO: dict[str, _Entry] = {
    "seed": _Entry(_seed, 2048, 512, "cpu", F32),
    "mlp": _Entry(_mlp, 1, 1024, "meta", F32),
    "mlp-deep": _Entry(_mlp_deep, 32, 1, "cpu", F32),
    "gpt2": _Entry(_gpt2("gpt2", 768, 12, 12), 8, 1024, "meta", F32),
    "gpt2-medium": _Entry(_gpt2("gpt2-medium", 1024, 24, 16), 8, 1024, "meta", F32),
    "gpt2-large": _Entry(_gpt2("gpt2-large", 1280, 36, 20), 8, 1024, "meta", F32),
    "gpt2-xl": _Entry(_gpt2("gpt2-xl", 1600, 48, 25), 8, 1024, "meta", F32),
    "llama3-8b": _Entry(_llama("llama3-8b", 4096, 32, 32, 8, 14336), 8, 4096, "meta", BF16),
    "llama3-70b": _Entry(_llama("llama3-70b", 8192, 80, 64, 8, 28672), 8, 4096, "meta", BF16),
    # Llama 3.1 405B's shape and 128K context
    "llama3-405b": _Entry(
        _llama("llama3-405b", 16384, 126, 128, 8, 53248, positions=131072), 8, 4096, "meta", BF16
    ),
    "bert-base": _Entry(_bert("bert-base", 768, 12, 12, 3072), 32, 512, "meta", F32),
    "bert-large": _Entry(_bert("bert-large", 1024, 24, 16, 4096), 32, 512, "meta", F32),
    "mixtral-8x7b": _Entry(_mixtral("mixtral-8x7b", 4096, 32, 32, 8, 14336, 8, 32000), 8, 4096, "meta", BF16),
    "gpt2-tiny": _Entry(_gpt2("gpt2-tiny", 64, 2, 4, vocab=512, positions=64), 2, 16, "cpu", F32),
    "llama-tiny": _Entry(_llama("llama-tiny", 64, 2, 4, 2, 128, vocab=512), 2, 16, "cpu", F32),
    "bert-tiny": _Entry(_bert("bert-tiny", 64, 2, 4, 128, vocab=512), 2, 16, "cpu", F32),
    "mixtral-tiny": _Entry(_mixtral("mixtral-tiny", 64, 2, 4, 2, 128, 4, 512), 2, 16, "cpu", BF16),
}
"""name -> builder and defaults (batch, sequence length, device, dtype)."""


def names() -> tuple[str, ...]:
    """Every zoo name, in a stable order."""
    return tuple(_ZOO)


def default_dtype(name: str) -> torch.dtype:
    """The dtype zoo model ``name`` is built in by default (``bfloat16`` for LLaMA-3 and Mixtral)."""
    entry = _ZOO.get(name)
    if entry is None:
        raise UnknownModelError(f"unknown zoo model {name!r}; valid names: {', '.join(names())}")
    return entry.dtype


def build(
    name: str,
    *,
    batch: int | None = None,
    seq: int | None = None,
    device: Device | None = None,
    dtype: torch.dtype | None = None,
    layers: int | None = None,
) -> ModelCase:
    """Build zoo model ``name``; ``None`` keeps the entry's default.

    ``layers`` overrides the depth: the number of blocks of ``mlp-deep`` (default 8) or of a transformer.
    ``seq`` is ignored by ``mlp-deep`` (its input is ``(batch, 256)``).
    """
    entry = _ZOO.get(name)
    if entry is None:
        raise UnknownModelError(f"unknown zoo model {name!r}; valid names: {', '.join(names())}")
    options = _Options(
        batch=batch if batch is not None else entry.batch,
        seq=seq if seq is not None else entry.seq,
        device=device if device is not None else entry.device,
        dtype=dtype if dtype is not None else entry.dtype,
        layers=layers,
    )
    if options.batch <= 0 or options.seq <= 0 or (layers is not None and layers <= 0):
        raise ValueError(f"build({name!r}): batch, seq and layers must be positive, got {options}")
    if options.device not in ("meta", "cpu"):
        raise ValueError(f"build({name!r}): device must be 'meta' or 'cpu', got {options.device!r}")
    return entry.builder(options)


def load_spec(spec: str) -> ModelCase:
    """A zoo name, or ``path/to/file.py:function`` where ``function()`` returns ``(model, args[, kwargs])``.

    ``args`` may be a single tensor; unknown names and bad files raise :class:`UnknownModelError`.
    """
    path, sep, func_name = spec.rpartition(":")
    if not sep or not path.endswith(".py"):
        return build(spec)
    module = _import_file(Path(path), spec)
    func = getattr(module, func_name, None)
    if not callable(func):
        raise UnknownModelError(f"{spec}: {path} defines no function {func_name!r}")
    result = func()
    if not isinstance(result, tuple) or len(result) not in (2, 3) or not isinstance(result[0], nn.Module):
        raise UnknownModelError(
            f"{spec}: {func_name}() must return (model, example_args) or "
            f"(model, example_args, example_kwargs) with model an nn.Module; got {type(result).__name__}"
        )
    args = result[1] if isinstance(result[1], tuple) else (result[1],)
    kwargs = dict(result[2]) if len(result) == 3 else {}
    return ModelCase(spec, result[0], args, kwargs, f"{func_name}() from {path}")


def _import_file(path: Path, spec: str) -> Any:
    if not path.is_file():
        raise UnknownModelError(f"{spec}: no such file {path}; valid zoo names: {', '.join(names())}")
    module_name = f"autoshard_user_model_{abs(hash(str(path.resolve())))}"
    module_spec = importlib.util.spec_from_file_location(module_name, path)
    if module_spec is None or module_spec.loader is None:
        raise UnknownModelError(f"{spec}: cannot import {path} as a Python module")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_name] = module  # dataclasses and pickling look the module up by name
    module_spec.loader.exec_module(module)
    return module
