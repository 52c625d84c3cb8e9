"""A Megatron TP x DP plan exported to DTensor styles + fully_shard trains like the emitted module."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest
import torch
import torch.distributed as dist
from runtime_cases import model, plan

from autoshard.codegen import gather_outputs, parallel_info, parallelize, shard_inputs
from autoshard.codegen.shard import local_piece
from autoshard.plans import Plan
from autoshard.runtime.export import ExportError, dtensor_styles, export_to_dtensor
from autoshard.runtime.launch import launch

COL, ROW = ("R", "S(0)"), ("R", "S(1)")
TP_DP = (
    ("input_ids", ("S(0)", "R")),
    *((f"*.{m}.weight", COL) for m in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")),
    *((f"*.{m}.weight", ROW) for m in ("o_proj", "down_proj")),
)
STEPS = 3


def _data() -> tuple[list[torch.Tensor], torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    batches = [torch.randint(0, 512, (4, 8), generator=gen) for _ in range(STEPS)]
    return batches, torch.randn(4, 8, 512, generator=gen, dtype=torch.float64)


def _emitted(p: Plan) -> list[float]:
    m = model("llama")
    module = parallelize(m.model, p, m.args, captured=m.captured)
    opt = torch.optim.AdamW(module.parameters(), lr=1e-2)
    batches, weight = _data()
    losses = []
    for ids in batches:
        opt.zero_grad()
        local = module(*shard_inputs(p, ids))
        info = parallel_info(module)
        (local * local_piece(weight, info.outputs[0][0], p.mesh_shape, info.comm.coord)).sum().backward()
        opt.step()
        losses.append((gather_outputs(module, local.detach()) * weight).sum().item())
    return losses


def _exported(p: Plan) -> tuple[list[float], int]:
    from torch.distributed.tensor import DTensor

    net = copy.deepcopy(model("llama").model)
    export_to_dtensor(net, p)
    dtensors = sum(isinstance(q, DTensor) for q in net.parameters())
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    batches, weight = _data()
    data_rank, data_ways, tp_ways = dist.get_rank() // 2, 2, 2  # mesh (2, 2): axis 0 data, axis 1 TP
    rows = slice(data_rank * 2, data_rank * 2 + 2)
    losses = []
    for ids in batches:
        opt.zero_grad()
        local = (net(ids[rows]).logits * weight[rows]).sum()
        (local * data_ways).backward()  # FSDP2 averages gradients over the data axis: undo it for a sum
        opt.step()
        total = local.detach().clone()
        dist.all_reduce(total)
        losses.append(total.item() / tp_ways)
    return losses, dtensors


@pytest.mark.slow
def test_exported_tp_dp_trains_like_the_emitted_module() -> None:
    p = plan("llama", 4, (2, 2), TP_DP)
    styles = dict(dtensor_styles(model("llama").model, p).styles)
    assert styles["model.layers.0.self_attn.q_proj"] == "colwise"
    assert styles["model.layers.1.mlp.down_proj"] == "rowwise"
    emitted = launch(_emitted, 4, p)
    exported = launch(_exported, 4, p)
    for (losses, dtensors), reference in zip(exported, emitted, strict=True):
        assert losses == pytest.approx(reference, rel=1e-9)
        assert dtensors == sum(
            1 for _ in model("llama").model.parameters()
        )  # all of them DTensors: TP/FSDP ran
    assert len(set(emitted[0])) == STEPS  # the weights moved between steps


def test_a_norm_split_on_the_tensor_parallel_axis_is_named() -> None:
    p = plan("llama", 4, (2, 2), TP_DP)
    bad: dict[str, Any] = dict(p.param_placements)
    bad["model.norm.weight"] = ("R", "S(0)")
    with pytest.raises(ExportError, match=r"model\.norm\.weight \(LlamaRMSNorm\) is \(R, S\(0\)\)"):
        dtensor_styles(model("llama").model, dataclasses.replace(p, param_placements=bad))
