"""FSDP's "reshard after forward" for an emitted module: gathered weights are freed after use, re-gathered
in backward.

Input: a module from :func:`autoshard.parallelize` whose plan stores parameters sharded (``S(d)``) and
all-gathers them before use (the FSDP / ZeRO-3 pattern).  Without this, autograd keeps every gathered weight
alive from its forward use until its backward: the whole model per rank at the end of forward.  Output: the
same module, where (:func:`reshard_after_forward`)

- each parameter edge whose forward runs an ``all_gather`` calls :func:`gather_param`, which remembers which
  tensor is a gathered weight (weakly: nothing is kept alive);
- a ``saved_tensors_hooks`` pair is active during ``forward``: when autograd saves a gathered weight (or a view
  of one, e.g. ``weight.t()`` inside ``linear``), it stores the parameter's *local* shard instead, and in
  backward re-runs the edge's forward steps to gather it again, then re-applies the view
  (``as_strided`` on the fresh contiguous copy: same sizes, strides and offset).

Memory: at most the weights of the ops being run, plus their gradients, instead of all gathered weights.
Cost: one more all-gather per gathered parameter in backward (logged with phase ``"regather"``), as FSDP2's
default ``reshard_after_forward=True`` pays, and as the plan prices it (``Plan.collectives``, phase
``"regather"``).  With :mod:`autoshard.runtime.prefetch` the re-gathers are issued layers ahead.

Example::

    module = autoshard.parallelize(meta_model, fsdp_plan, (ids,), weights=SafetensorsWeights(...))
    reshard_after_forward(module)
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx
from torch.utils.weak import WeakTensorKeyDictionary

from autoshard.codegen.collectives import MeshComm, parse_steps, redistribute, run_steps
from autoshard.codegen.parallelize import parallel_info

__all__ = ["gather_param", "remember_gathered", "reshard_after_forward"]

_GATHERED: Any = WeakTensorKeyDictionary()  # gathered weight -> (local shard, comm, forward steps)


def remember_gathered(
    out: torch.Tensor, local: torch.Tensor, comm: MeshComm, forward: str, source: Any = None
) -> None:
    """Save ``out`` (a gathered weight) as a re-gather of ``local`` when autograd keeps it (weakly keyed).

    ``source``: ``(prefetcher, fqn)`` when :mod:`autoshard.runtime.prefetch` re-gathers it ahead of use."""
    if out.is_contiguous():  # keyed by the storage's root tensor: every view of it saves as a regather
        _GATHERED[out if out._base is None else out._base] = (local, comm, forward, source)


def gather_param(x: torch.Tensor, comm: MeshComm, forward: str, backward: str = "") -> torch.Tensor:
    """:func:`~autoshard.codegen.collectives.redistribute`, remembering the output as a gathered weight."""
    out = redistribute(x, comm, forward, backward)
    remember_gathered(out, x, comm, forward)
    return out


def _pack(t: torch.Tensor) -> Any:
    base = t if t._base is None else t._base
    if base not in _GATHERED:
        return t
    local, comm, forward, source = _GATHERED[base]
    if source is not None:
        source[0].packed(source[1])
    return ("regather", local, comm, forward, source, tuple(t.shape), t.stride(), t.storage_offset(), t.dtype)


def _unpack(saved: Any) -> torch.Tensor:
    if not (isinstance(saved, tuple) and saved and saved[0] == "regather"):
        return saved
    _, local, comm, forward, source, shape, stride, offset, dtype = saved
    if source is not None:
        whole = source[0].regather(source[1])
    else:  # in the dtype it was gathered in (amp: autocast's, gather_dtype)
        with torch.no_grad():
            whole = run_steps(local.detach().to(dtype), parse_steps(forward), comm, "regather")
    return whole.as_strided(shape, stride, offset)  # offsets count from the storage: same layout as before


def reshard_after_forward(module: fx.GraphModule) -> int:
    """Free gathered weights after use and re-gather them in backward (module doc); returns how many
    parameter edges now do so."""
    info = parallel_info(module)
    params = {a.fqn for a in info.attrs if a.kind == "parameter"}
    count = 0
    prefetcher = getattr(module, "_autoshard_prefetch", None)
    if prefetcher is not None:  # prefetch_gathers ran first: its edges save re-gathers too
        prefetcher.reshard = True
        count += len(prefetcher.layer_of)
    for node in module.graph.nodes:
        if node.op != "get_attr" or node.target not in params:
            continue
        for user in node.users:
            steps = parse_steps(str(user.args[2])) if user.target is redistribute else ()
            if any(s.kind == "all_gather" for s in steps):
                user.target = gather_param
                count += 1
    if count and not getattr(module, "_autoshard_reshard", False):
        module.recompile()
        hooks = torch.autograd.graph.saved_tensors_hooks(_pack, _unpack)
        module.register_forward_pre_hook(lambda *_: hooks.__enter__())
        module.register_forward_hook(lambda *_: hooks.__exit__(None, None, None), always_call=True)
        module._autoshard_reshard = True  # type: ignore[assignment]
    return count
