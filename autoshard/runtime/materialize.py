"""Shard-only materialisation: each rank builds only its own pieces of a model planned on the ``meta`` device.

Input: the model (parameters and buffers on ``meta``; nothing allocated) and, for every tensor the emitted
module holds (an :class:`~autoshard.codegen.lower.AttrSpec`: FQN, spec, global shape), this rank's mesh
coordinate.  Output: the local piece, on the CPU.  Two sources, both passed to
``autoshard.parallelize(meta_model, plan, args, weights=...)``:

- :class:`InitWeights` -- the model's own initialisation, reproducible per global tensor.  For each module
  that owns a tensor, a CPU copy of *that module only* (its direct parameters and buffers) is built, seeded
  with ``(seed, module path)``, initialised by the model's own rule (Hugging Face ``_init_weights``, else the
  module's ``reset_parameters``), sliced, and dropped.  The values therefore do not depend on the plan or the
  world size: a rank's shards equal the same slices of :func:`init_full` (one process, same seed).  Memory:
  the largest module's direct tensors, transiently (an embedding or LM head), on top of the shards.
  We chose per-module seeding over reproducing the eager construction's RNG stream because the latter
  depends on construction order and on torch's default inits that Hugging Face then overwrites; a
  per-module seed is the same on every rank, whatever each rank holds.
- :class:`SafetensorsWeights` -- a Hugging Face checkpoint directory (``model.safetensors``, or shards with
  ``model.safetensors.index.json``).  Each piece is read with ``safe_open(...).get_slice(name)[...]``:
  only the slice is copied, and the file is opened per tensor so at most one tensor's pages are mapped at a
  time.  Tensors that are never in a checkpoint (non-persistent buffers such as rotary ``inv_freq``) come
  from the model's init (:class:`InitWeights`); a *persistent* tensor missing from the checkpoint, a wrong
  shape or a wrong dtype is a :class:`WeightsError` naming the tensor and the file.

Example (every rank)::

    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    module = autoshard.parallelize(model, plan, (ids,), weights=SafetensorsWeights("ckpt/", model))
"""

from __future__ import annotations

import copy
import json
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import nn

from autoshard.codegen.lower import AttrSpec
from autoshard.errors import AutoshardError
from autoshard.strategies.local import shard_range

__all__ = [
    "InitWeights",
    "SafetensorsWeights",
    "WeightsError",
    "init_full",
    "init_model",
    "module_seed",
    "piece_slices",
]

InitFn = Callable[[nn.Module], None]


class WeightsError(AutoshardError, ValueError):
    """A checkpoint lacks a tensor, holds one of the wrong shape or dtype, or the model cannot be initialised."""


def module_seed(seed: int, path: str) -> int:
    """The RNG seed of module ``path``: the same on every rank and for every plan."""
    return (seed * 1_000_003 + zlib.crc32(path.encode())) % (2**63)


def piece_slices(attr: AttrSpec, mesh_shape: Sequence[int], coord: Sequence[int]) -> tuple[slice, ...]:
    """The index of this rank's piece of ``attr`` in the global tensor (one slice per dim)."""
    out = []
    for dim, size in enumerate(attr.global_shape):
        start, length = shard_range(attr.spec, dim, size, mesh_shape, coord)
        out.append(slice(start, start + length))
    return tuple(out)


def _default_init(model: nn.Module) -> InitFn:
    hf_init = getattr(model, "_init_weights", None)
    if callable(hf_init):
        return hf_init

    def reset(module: nn.Module) -> None:
        reset_parameters = getattr(module, "reset_parameters", None)
        if callable(reset_parameters):
            reset_parameters()

    return reset


class InitWeights:
    """Pieces initialised by the model's own rule, seeded per module (module doc)."""

    def __init__(self, model: nn.Module, seed: int = 0, init_fn: InitFn | None = None) -> None:
        self.model, self.seed = model, seed
        self.init_fn = init_fn or _default_init(model)
        self._cached: tuple[str, dict[str, torch.Tensor]] | None = None

    def module_tensors(self, path: str) -> dict[str, torch.Tensor]:
        """Every direct parameter and buffer of module ``path``, initialised on the CPU (the last one cached)."""
        if self._cached is not None and self._cached[0] == path:
            return self._cached[1]
        try:
            owner = self.model.get_submodule(path)
        except AttributeError as e:
            raise WeightsError(f"no module {path!r} in {type(self.model).__name__}: {e}") from e
        clone = copy.copy(owner)  # shallow: the same class and config, its own tensor tables, no children
        clone._parameters = dict(owner._parameters)
        clone._buffers = dict(owner._buffers)
        clone._modules = {}
        clone.to_empty(device="cpu", recurse=False)
        with torch.random.fork_rng(devices=[]), torch.no_grad():
            torch.manual_seed(module_seed(self.seed, path))
            self.init_fn(clone)
        tensors = {
            n: t.detach() for n, t in (*clone._parameters.items(), *clone._buffers.items()) if t is not None
        }
        self._cached = (path, tensors)
        return tensors

    def full(self, fqn: str) -> torch.Tensor:
        """The whole tensor ``fqn`` (what one process holds)."""
        path, _, name = fqn.rpartition(".")
        tensors = self.module_tensors(path)
        if name not in tensors:
            raise WeightsError(
                f"{fqn}: module {path or type(self.model).__name__} has no tensor {name!r} to initialise (a "
                "constant created in forward cannot be rebuilt on the meta device): build the model on the CPU"
            )
        return tensors[name]

    def local(self, attr: AttrSpec, mesh_shape: Sequence[int], coord: Sequence[int]) -> torch.Tensor:
        whole = self.full(attr.fqn)
        return whole[piece_slices(attr, mesh_shape, coord)].clone(memory_format=torch.contiguous_format)


def init_full(model: nn.Module, seed: int = 0, init_fn: InitFn | None = None) -> dict[str, torch.Tensor]:
    """The state dict (with non-persistent buffers) one process gets from :class:`InitWeights`: the reference
    a rank's shards are slices of.  Load it with ``model.load_state_dict(state, assign=True, strict=False)``."""
    source = InitWeights(model, seed, init_fn)
    names = [n for n, _ in model.named_parameters()] + [n for n, _ in model.named_buffers()]
    return {n: source.full(n).clone() for n in names}


def init_model(model: nn.Module, seed: int = 0, init_fn: InitFn | None = None) -> nn.Module:
    """Materialise ``model`` (on ``meta``) whole on the CPU, in place, with :func:`init_full`'s values: the
    single-process reference of a shard-only run.  Tied weights stay tied."""
    state = init_full(model, seed, init_fn)
    model.to_empty(device="cpu")
    with torch.no_grad():
        for name, value in state.items():
            path, _, leaf = name.rpartition(".")
            owner = model.get_submodule(path)
            target = owner._parameters.get(leaf)
            (target if target is not None else owner._buffers[leaf]).copy_(value)  # type: ignore[union-attr]
    tie = getattr(model, "tie_weights", None)
    if callable(tie):
        tie()
    return model


_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


class SafetensorsWeights:
    """Pieces read from a Hugging Face safetensors directory, slice by slice (module doc)."""

    def __init__(self, directory: str | Path, model: nn.Module, seed: int = 0) -> None:
        self.directory = Path(directory)
        self.files = _weight_map(self.directory)
        self.fallback = InitWeights(model, seed)
        self.model = model
        self.persistent = frozenset(model.state_dict(keep_vars=True))

    def local(self, attr: AttrSpec, mesh_shape: Sequence[int], coord: Sequence[int]) -> torch.Tensor:
        from safetensors import safe_open

        names = (attr.fqn, *attr.aliases)
        name = next((n for n in names if n in self.files), None)
        if name is None:
            if not any(n in self.persistent for n in names):  # never saved: rebuilt by the model's init
                return self.fallback.local(attr, mesh_shape, coord)
            raise WeightsError(
                f"{attr.fqn}: not in the checkpoint {self.directory} (none of {list(names)} is in its "
                "weight map): the checkpoint is for another model or incomplete; re-export it"
            )
        path = self.directory / self.files[name]
        with safe_open(str(path), framework="pt") as f:
            sliced = f.get_slice(name)
            shape, dtype = tuple(sliced.get_shape()), _DTYPES.get(sliced.get_dtype())
            want = self._dtype(attr)
            if shape != attr.global_shape:
                raise WeightsError(
                    f"{name} in {path} has shape {shape}, the model's is {attr.global_shape}: the checkpoint "
                    "is for another model configuration"
                )
            if dtype != want:
                raise WeightsError(
                    f"{name} in {path} is {sliced.get_dtype()}, the model's is {want}: build the model with "
                    "that dtype or convert the checkpoint"
                )
            piece = sliced[piece_slices(attr, mesh_shape, coord)] if shape else f.get_tensor(name)
        return piece.contiguous()

    def _dtype(self, attr: AttrSpec) -> torch.dtype:
        kind = "get_parameter" if attr.kind == "parameter" else "get_buffer"
        return getattr(self.model, kind)(attr.fqn).dtype


def _weight_map(directory: Path) -> dict[str, str]:
    """``{tensor name: file name}`` of a safetensors directory (index file, or every ``*.safetensors``)."""
    from safetensors import safe_open

    if not directory.is_dir():
        raise WeightsError(f"checkpoint directory {directory} does not exist")
    index = directory / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError) as e:
            raise WeightsError(f"{index} is not a safetensors index (no weight_map): {e}") from e
        missing = sorted({f for f in weight_map.values() if not (directory / f).exists()})
        if missing:
            raise WeightsError(
                f"{index} names {missing[0]}, which is not in {directory}: copy the whole checkpoint"
            )
        return dict(weight_map)
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise WeightsError(f"no *.safetensors file in {directory}: pass a Hugging Face checkpoint directory")
    found: dict[str, str] = {}
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            found.update(dict.fromkeys(f.keys(), path.name))
    return found
