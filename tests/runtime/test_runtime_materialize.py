"""Shard-only materialisation: a model planned on ``meta`` gets only its shards, from its init or safetensors."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from runtime_cases import LLAMA_MEGATRON
from safetensors.torch import save_file

import autoshard
from autoshard import zoo
from autoshard.capture import Captured, capture
from autoshard.codegen import full_state_dict, gather_outputs, parallel_info, parallelize, shard_inputs
from autoshard.codegen.lower import AttrSpec
from autoshard.placement import ShardingSpec
from autoshard.plans import Plan
from autoshard.runtime.launch import launch
from autoshard.runtime.materialize import (
    InitWeights,
    SafetensorsWeights,
    WeightsError,
    init_full,
    init_model,
)
from autoshard.runtime.verify import cluster_for

IDS = torch.randint(0, 512, (2, 8), generator=torch.Generator().manual_seed(0))


@functools.cache
def _meta_llama() -> tuple[torch.nn.Module, Plan, Captured]:
    config = zoo.build("llama-tiny", batch=2, seq=8).model.config
    with torch.device("meta"):
        model = type(zoo.build("llama-tiny", batch=2, seq=8).model)(config)
    meta_ids = IDS.to("meta")
    plan = autoshard.plan(model, cluster_for("cpu", 2), (meta_ids,), annotations=LLAMA_MEGATRON)
    return model, plan, capture(model, (meta_ids,), {}, blocks="full")


def _reference(seed: int) -> torch.nn.Module:
    meta, _, _ = _meta_llama()
    with torch.device("meta"):
        model = type(meta)(meta.config)
    return init_model(model, seed)


def _run(weights: Any) -> list[tuple[dict[str, torch.Tensor], torch.Tensor, int, dict[str, int]]]:
    model, plan, cap = _meta_llama()

    def work() -> tuple[dict[str, torch.Tensor], torch.Tensor, int, dict[str, int]]:
        module = parallelize(model, plan, (IDS.to("meta"),), captured=cap, weights=weights, record=True)
        held = sum(p.numel() for p in module.parameters())
        out = gather_outputs(module, module(*shard_inputs(plan, IDS)))
        counts: dict[str, int] = {}
        for rec in parallel_info(module).comm.log or []:
            counts[rec.kind] = counts.get(rec.kind, 0) + 1
        return full_state_dict(module), out, held, counts

    return launch(work, 2)


def test_init_shards_equal_single_process_init() -> None:
    model, _, _ = _meta_llama()
    ranks = _run(InitWeights(model, seed=3))
    reference = _reference(3)
    whole = sum(p.numel() for p in reference.parameters())
    for state, out, held, counts in ranks:
        for name, value in reference.state_dict().items():
            assert torch.equal(state[name], value), name
        torch.testing.assert_close(out, reference(IDS).logits.detach())
        assert held < 0.8 * whole  # Megatron splits the projections: each rank holds part of the model
        assert counts.get("all_reduce", 0) > 0  # the row-parallel outputs were reduced across ranks
    assert all(p.device.type == "meta" for p in model.parameters())  # the user's model is untouched


def _save_checkpoint(directory: Path, state: dict[str, torch.Tensor], sharded: bool) -> None:
    directory.mkdir()
    if not sharded:
        save_file(state, str(directory / "model.safetensors"))
        return
    names = sorted(state)
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, part in halves.items():
        save_file({n: state[n] for n in part}, str(directory / file))
    weight_map = {n: file for file, part in halves.items() for n in part}
    (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


@pytest.mark.parametrize("sharded", [False, True])
def test_safetensors_slices_load_the_checkpoint(tmp_path: Path, sharded: bool) -> None:
    reference = _reference(7)
    _save_checkpoint(tmp_path / "ckpt", reference.state_dict(), sharded)
    model, _, _ = _meta_llama()
    ranks = _run(SafetensorsWeights(tmp_path / "ckpt", model))
    for state, out, _, _ in ranks:
        for name, value in reference.state_dict().items():
            assert torch.equal(state[name], value), name
        torch.testing.assert_close(out, reference(IDS).logits.detach())


def _attr(name: str, shape: tuple[int, ...]) -> AttrSpec:
    return AttrSpec(name, "parameter", ShardingSpec.parse(("S(0)",)), shape)


def test_safetensors_reads_only_the_slice(tmp_path: Path) -> None:
    model, _, _ = _meta_llama()
    state = _reference(1).state_dict()
    _save_checkpoint(tmp_path / "ckpt", state, sharded=False)
    name = "model.layers.0.mlp.up_proj.weight"
    piece = SafetensorsWeights(tmp_path / "ckpt", model).local(_attr(name, (128, 64)), (2,), (1,))
    assert torch.equal(piece, state[name][64:])


@pytest.mark.parametrize("fault", ["missing", "shape", "dtype"])
def test_bad_checkpoint_names_tensor_and_file(tmp_path: Path, fault: str) -> None:
    model, _, _ = _meta_llama()
    state = dict(_reference(1).state_dict())
    name = "model.layers.1.self_attn.o_proj.weight"
    if fault == "missing":
        del state[name]
    elif fault == "shape":
        state[name] = state[name][:, :32].contiguous()
    else:
        state[name] = state[name].double()
    _save_checkpoint(tmp_path / "ckpt", state, sharded=False)
    source = SafetensorsWeights(tmp_path / "ckpt", model)
    with pytest.raises(WeightsError) as info:
        source.local(_attr(name, (64, 64)), (2,), (0,))
    message = str(info.value)
    assert name in message and "\n" not in message
    assert ("model.safetensors" if fault != "missing" else "ckpt") in message


def test_meta_model_without_weights_says_how_to_fix() -> None:
    model, plan, cap = _meta_llama()

    def work() -> str:
        try:
            parallelize(model, plan, (IDS.to("meta"),), captured=cap)
        except autoshard.AutoshardError as e:
            return str(e)
        return ""

    messages = launch(work, 2)
    assert all("weights=InitWeights" in m for m in messages)


def test_init_full_is_seeded_per_module() -> None:
    model, _, _ = _meta_llama()
    a, b = init_full(model, seed=0), init_full(model, seed=1)
    q0, q1 = "model.layers.0.self_attn.q_proj.weight", "model.layers.1.self_attn.q_proj.weight"
    assert not torch.equal(a[q0], a[q1])  # same shape, different module: different values
    assert not torch.equal(a[q0], b[q0])
    assert torch.equal(a[q0], init_full(model, seed=0)[q0])
