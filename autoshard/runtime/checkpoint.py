"""Checkpoints of an emitted module: ``torch.distributed.checkpoint`` (DCP) in and out, safetensors out.

Input: a module from :func:`autoshard.parallelize` (and optionally its
:class:`~autoshard.runtime.zero.ZeroOptimizer`) on every rank.  Output: a DCP directory, or a plain Hugging
Face safetensors directory that one process loads.

- :func:`save_checkpoint` writes every parameter and persistent buffer as a ``DTensor`` over the module's
  device mesh, placed as the plan places it, so DCP records each tensor's *global* shape and every rank's
  chunk of it.  Optimizer state goes in the same way under ``optim.<fqn>.<name>``: a ZeRO rank's flat chunk
  is first all-gathered back to the parameter's local piece (one piece at a time while DCP writes -- memory:
  the optimizer state of one rank's pieces, transiently), scalars (``step``) as plain tensors.
- :func:`load_checkpoint` builds the same state dict for *this* module -- any plan, any world size -- and lets
  DCP's resharding read each rank's new pieces, then re-cuts the ZeRO chunks.  Before reading, every expected
  tensor is checked against the checkpoint's metadata: a missing tensor, another shape or another dtype is a
  one-line :class:`CheckpointError` naming the tensor and the directory.
- :func:`export_safetensors` gathers one tensor at a time on rank 0 and writes ``model.safetensors`` (or
  numbered shards of at most ``max_shard_bytes`` plus ``model.safetensors.index.json``) and, for a Hugging
  Face model, its ``config.json``: ``AutoModelForCausalLM.from_pretrained(directory)`` loads it.  Other
  models get the weights only (``safetensors.torch.load_file`` reads them).

Every write goes to a hidden sibling directory that is renamed into place only when complete: a failed save
leaves the previous checkpoint, if any, untouched and no half-written directory behind.

Example (every rank)::

    save_checkpoint(module, "ckpt/step-100", optimizer)
    # later, under another plan or world size:
    load_checkpoint(other_module, "ckpt/step-100", other_optimizer)
    export_safetensors(module, "hf-out/")            # then: AutoModelForCausalLM.from_pretrained("hf-out")
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import fx

from autoshard.codegen.lower import AttrSpec
from autoshard.codegen.parallelize import ParallelInfo, parallel_info
from autoshard.codegen.shard import gather_full
from autoshard.errors import AutoshardError
from autoshard.runtime.zero import ZeroOptimizer

__all__ = [
    "CheckpointError",
    "check_checkpoint",
    "export_safetensors",
    "load_checkpoint",
    "save_checkpoint",
    "save_safetensors",
]

OPTIM = "optim."


class CheckpointError(AutoshardError, ValueError):
    """A checkpoint cannot be written, or does not hold what the module needs."""


def _dtensor(info: ParallelInfo, local: torch.Tensor, attr: AttrSpec) -> Any:
    from torch.distributed.tensor import DTensor

    if info.mesh is None:
        raise CheckpointError(
            f"{attr.fqn}: the module has no device mesh; build it with autoshard.parallelize"
        )
    return DTensor.from_local(
        local, info.mesh, list(attr.spec.placements), run_check=False, shape=torch.Size(attr.global_shape),
        stride=torch.empty(attr.global_shape, device="meta").stride(),
    )  # fmt: skip


def _state(module: fx.GraphModule, optimizer: ZeroOptimizer | None, for_load: bool) -> dict[str, Any]:
    """The DCP state dict of ``module``: DTensors viewing its tensors (model) or the optimizer's state."""
    info = parallel_info(module)
    state: dict[str, Any] = {}
    attrs = {a.fqn: a for a in info.attrs}
    for attr in info.attrs:
        if info.in_state(attr):
            local = (
                module.get_parameter(attr.fqn) if attr.kind == "parameter" else module.get_buffer(attr.fqn)
            )
            state[attr.fqn] = _dtensor(info, local.data, attr)
    if optimizer is None:
        return state
    for fqn, (param, flat, master) in _optimizer_entries(optimizer):
        per = optimizer.inner.state.get(master, {})
        for name, value in per.items():
            if not isinstance(value, torch.Tensor):
                continue
            key = f"{OPTIM}{fqn}.{name}"
            if value.dim() == 0:
                state[key] = value
            else:
                piece = flat.gather(value, info.comm).view_as(param) if flat.axes else value.view_as(param)
                state[key] = _dtensor(info, piece if not for_load else piece.clone(), attrs[fqn])
    return state


def _optimizer_entries(optimizer: ZeroOptimizer) -> Iterator[tuple[str, tuple[Any, Any, Any]]]:
    for entry in optimizer.params:
        yield entry[1].fqn, entry


def _atomic(directory: Path, write: Callable[[Path], None]) -> Path:
    """Run ``write(tmp)`` on every rank, then rename ``tmp`` to ``directory`` (rank 0) when all succeeded."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    tmp = directory.parent / f".{directory.name}.partial"
    if rank == 0:
        directory.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    _barrier()
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException: Exception misses it

    try:
        write(tmp)
    except (Exception, CheckpointException) as e:
        _barrier()  # DCP raises on every rank when one fails: clean up once all have stopped writing
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(
            f"writing {directory} failed ({type(e).__name__}: {e}); nothing was replaced"
        ) from e
    _barrier()
    if rank == 0:
        old = directory.parent / f".{directory.name}.old"
        shutil.rmtree(old, ignore_errors=True)
        if directory.exists():
            directory.rename(old)
        tmp.rename(directory)
        shutil.rmtree(old, ignore_errors=True)
    _barrier()
    return directory


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def save_checkpoint(
    module: fx.GraphModule, directory: str | Path, optimizer: ZeroOptimizer | None = None
) -> Path:
    """Save ``module`` (and ``optimizer``) with DCP from every rank (a collective; module doc)."""
    import torch.distributed.checkpoint as dcp

    state = _state(module, optimizer, for_load=False)
    return _atomic(Path(directory), lambda tmp: dcp.save(state, checkpoint_id=str(tmp)))


def check_checkpoint(
    directory: str | Path, expected: Mapping[str, tuple[tuple[int, ...], torch.dtype]]
) -> None:
    """Raise :class:`CheckpointError` unless the DCP checkpoint holds every ``name: (global shape, dtype)``."""
    import torch.distributed.checkpoint as dcp

    path = Path(directory)
    if not (path / ".metadata").exists():
        raise CheckpointError(
            f"{path} is not a DCP checkpoint (no .metadata file): pass a save_checkpoint directory"
        )
    held = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
    for name, (shape, dtype) in expected.items():
        meta = held.get(name)
        if meta is None:
            raise CheckpointError(
                f"{name}: not in the checkpoint {path} ({len(held)} entries): it was saved from another "
                "model (or without the optimizer); load a checkpoint of this model"
            )
        size = tuple(getattr(meta, "size", ()))
        got = getattr(getattr(meta, "properties", None), "dtype", None)
        if size != tuple(shape):
            raise CheckpointError(f"{name} in {path} has shape {size}, the module's is {tuple(shape)}")
        if got is not None and got != dtype:
            raise CheckpointError(
                f"{name} in {path} is {got}, the module's is {dtype}: cast the model or re-save"
            )


def load_checkpoint(
    module: fx.GraphModule, directory: str | Path, optimizer: ZeroOptimizer | None = None
) -> None:
    """Load a :func:`save_checkpoint` directory into ``module`` (and ``optimizer``) under this module's plan,
    whatever plan and world size saved it (a collective; module doc)."""
    import torch.distributed.checkpoint as dcp

    path = Path(directory)
    info = parallel_info(module)
    state = _state(module, None, for_load=True)
    expected = {k: (tuple(v.shape), v.dtype) for k, v in state.items()}
    if optimizer is not None:
        state.update(_optimizer_skeleton(optimizer, info, path))
    check_checkpoint(path, expected)
    dcp.load(state, checkpoint_id=str(path))
    if optimizer is not None:
        _fill_optimizer(optimizer, state)


def _optimizer_skeleton(optimizer: ZeroOptimizer, info: ParallelInfo, path: Path) -> dict[str, Any]:
    """Empty DTensors / scalars for every optimizer entry the checkpoint holds, placed as this plan wants."""
    import torch.distributed.checkpoint as dcp

    held = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
    attrs = {a.fqn: a for a in info.attrs}
    skeleton: dict[str, Any] = {}
    for fqn, (param, _, _) in _optimizer_entries(optimizer):
        prefix = f"{OPTIM}{fqn}."
        names = [k for k in held if k.startswith(prefix)]
        if not names:
            raise CheckpointError(f"{fqn}: no optimizer state in {path}: it was saved without the optimizer")
        for key in names:
            size = tuple(getattr(held[key], "size", ()))
            dtype = held[key].properties.dtype  # type: ignore[union-attr]
            if size == ():
                skeleton[key] = torch.zeros((), dtype=dtype)
            else:
                skeleton[key] = _dtensor(info, torch.zeros(param.shape, dtype=dtype), attrs[fqn])
    return skeleton


def _fill_optimizer(optimizer: ZeroOptimizer, state: dict[str, Any]) -> None:
    for fqn, (_, flat, master) in _optimizer_entries(optimizer):
        prefix = f"{OPTIM}{fqn}."
        per: dict[str, torch.Tensor] = {}
        for key, value in state.items():
            if not key.startswith(prefix):
                continue
            local = value.to_local() if hasattr(value, "to_local") else value
            per[key[len(prefix) :]] = local if local.dim() == 0 else flat.take(local.reshape(-1))
        optimizer.inner.state[master] = per


def export_safetensors(
    module: fx.GraphModule, directory: str | Path, max_shard_bytes: int = 2 << 30, config: Any = None
) -> Path:
    """Write every parameter and persistent buffer whole, as ``model.state_dict()`` names them, to a Hugging
    Face safetensors directory (a collective: rank 0 writes; module doc), with the model's ``config.json``.

    ``config``: what ``config.json`` is written from (anything with ``save_pretrained``); default the config
    of the model :func:`autoshard.parallelize` was given (``model.config`` of a Hugging Face model).  A model
    without one gets the weights only, and ``from_pretrained`` needs the config written beside them."""
    info = parallel_info(module)
    config = info.config if config is None else config
    if config is not None and not callable(getattr(config, "save_pretrained", None)):
        raise CheckpointError(
            f"export_safetensors(config={type(config).__name__}): a config needs save_pretrained (a Hugging "
            "Face PretrainedConfig); pass the model's .config or leave it out"
        )
    rank = dist.get_rank() if dist.is_initialized() else 0

    def write(tmp: Path) -> None:
        if rank == 0:
            tmp.mkdir(parents=True)
        shards: list[dict[str, torch.Tensor]] = [{}]
        size = 0
        for attr in info.attrs:
            if not info.in_state(attr):
                continue
            local = (
                module.get_parameter(attr.fqn) if attr.kind == "parameter" else module.get_buffer(attr.fqn)
            )
            whole = gather_full(local.detach(), attr.spec, attr.global_shape, info.comm).cpu()
            if rank != 0:
                continue
            for name in (attr.fqn, *attr.aliases):
                nbytes = whole.numel() * whole.element_size()
                if shards[-1] and size + nbytes > max_shard_bytes:
                    _write_shard(tmp, shards)
                    shards.append({})
                    size = 0
                shards[-1][name] = whole.clone() if name != attr.fqn else whole
                size += nbytes
        if rank == 0:
            _write_shard(tmp, shards)
            _name_shards(tmp, len(shards))
            if config is not None:
                config.save_pretrained(tmp)  # config.json: from_pretrained(directory) loads the export

    return _atomic(Path(directory), write)


def _write_shard(tmp: Path, shards: list[dict[str, torch.Tensor]]) -> None:
    save_safetensors(shards[-1], tmp / f"shard-{len(shards):05d}.safetensors", metadata={"format": "pt"})
    shards[-1] = {name: torch.empty(0) for name in shards[-1]}  # keep the names for the index, free the data


def save_safetensors(
    tensors: dict[str, torch.Tensor], path: str | Path, metadata: dict[str, str] | None = None
) -> None:
    """``safetensors.torch.save_file``, leaving the file readable as the user's umask says (0644 under 022).

    safetensors 0.8 writes through a temporary file that is created 0600 and renamed into place
    (safetensors/safetensors#782), so a checkpoint would be private where ``config.json`` beside it is not."""
    from safetensors.torch import save_file

    save_file(tensors, str(path), metadata=metadata)
    os.chmod(path, 0o666 & ~_umask())


def _umask() -> int:
    """The process umask, read without changing it (``/proc``: ``os.umask`` can only read it by setting it)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o077)  # no /proc: set a strict mask for the instant it takes to read the real one
    os.umask(mask)
    return mask


def _name_shards(tmp: Path, count: int) -> None:
    if count == 1:
        (tmp / "shard-00001.safetensors").rename(tmp / "model.safetensors")
        return
    weight_map: dict[str, str] = {}
    from safetensors import safe_open

    for k in range(1, count + 1):
        final = f"model-{k:05d}-of-{count:05d}.safetensors"
        (tmp / f"shard-{k:05d}.safetensors").rename(tmp / final)
        with safe_open(str(tmp / final), framework="pt") as f:
            weight_map.update(dict.fromkeys(f.keys(), final))
    (tmp / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map}, indent=1)
    )
