"""Coverage models end to end: a ResNet-style CNN and a torchtitan-style LLaMA, planned and verified on gloo.

- The CNN (conv, batch norm, pooling, fc; :class:`autoshard.zoo_extra.ResNetCNN`) planned on 8 x 8 A100s with
  a large batch splits the batch over both axes and synchronises every batch norm's statistics (a forward
  all-reduce at each ``bn`` module); a batch-split plan on 2 gloo ranks matches one device, forward and
  backward, with the statistics of every batch norm (stem and blocks) all-reduced.
- The torchtitan-style LLaMA (ModuleDict of blocks, complex RoPE) verifies on 4 gloo ranks with Megatron
  tensor parallelism forced on ``wq/wk/wv/wo`` and ``w1/w2/w3``.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import autoshard
from autoshard.capture import capture
from autoshard.runtime.verify import cluster_for, verify
from autoshard.strategies import UnsupportedOpWarning
from autoshard.zoo_extra import ResNetCNN, TitanConfig, TitanLlama


def test_cnn_plans_batch_split_with_synchronised_batch_norm_on_8x8() -> None:
    with torch.device("meta"):
        model = ResNetCNN(channels=64, depth=4).train()
    x = torch.empty(4096, 3, 64, 64, device="meta")
    cluster = autoshard.load_cluster("a100x8", nodes=8, mesh=(8, 8))
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnsupportedOpWarning)  # every op of the CNN has a rule
        plan = autoshard.plan(model, cluster, (x,))
    convs = [n for n in plan.nodes if "conv2d" in n.target]
    assert convs and all(n.strategy.startswith("(S(0), S(0))") for n in convs), [n.strategy for n in convs]
    synced = {c.module for c in plan.collectives if c.phase == "forward" and c.kind == "all_reduce"}
    assert {f"layers.{i}.bn{j}" for i in range(4) for j in (1, 2)} <= synced, synced
    assert any("batch norm" in note for note in plan.notes)


@pytest.mark.slow
def test_cnn_batch_split_verifies_on_2_ranks() -> None:
    """Every batch norm, the stem's and both blocks' two, normalises by statistics all-reduced over the ranks
    (2: a synchronised statistic is one all-reduce whatever the rank count; 8 images per rank, as on 4 ranks).
    With 128 x 128 images the activations (8 MiB per block at float64) cost more to gather than the 2C
    per-channel sums cost to all-reduce, so the planner synchronises the statistics in every block (at 64 x 64
    it gathered the blocks' activations and synchronised only the stem)."""
    torch.manual_seed(0)
    model = ResNetCNN(channels=8, depth=2).train().double()
    x = torch.randn(16, 3, 128, 128, dtype=torch.float64)
    batch_split = {"x": ("S(0)",), "*conv*": ((2, 1, 1, 1), (1, 1, 1, 1))}
    plan = autoshard.plan(model, cluster_for("a100x8", 2), (x,), annotations=batch_split)
    synced = [c for c in plan.collectives if c.phase == "forward" and c.kind == "all_reduce"]
    norms = ["bn1", *(f"layers.{i}.bn{j}" for i in range(2) for j in (1, 2))]
    assert sorted(c.module for c in synced) == sorted(norms), synced  # one all-reduce of the sums per norm
    assert all(c.nbytes == 2 * 8 * 8 for c in synced)  # sum and sum of squares of 8 channels, float64
    assert not [c for c in plan.collectives if c.kind == "all_gather" and c.nbytes > 2**20]  # no activation
    report = verify(model, (x,), plan=plan, captured=capture(model, (x,), blocks="full"), name="cnn")
    assert report.ok, str(report)
    assert report.emitted == report.planned and report.ranks_agree
    assert report.emitted["forward all_reduce"] == len(norms)  # the ranks ran one per norm


TITAN_TP = {
    **{f"*.{m}": ((1, 1, 1), (4, 1)) for m in ("wq", "wk", "wv", "w1", "w3")},
    **{f"*.{m}": ((1, 1, 4), (1, 4)) for m in ("wo", "w2")},
}


@pytest.mark.slow
def test_titan_llama_tensor_parallel_verifies_on_4_ranks() -> None:
    torch.manual_seed(0)
    model = TitanLlama(TitanConfig(dim=32, n_layers=2, n_heads=4, n_kv_heads=4, ffn_dim=64)).double()
    model.freqs_cis = model.freqs_cis.to(torch.complex128)  # .double() leaves complex buffers as they are
    ids = torch.randint(0, 128, (2, 8))
    plan = autoshard.plan(model, cluster_for("cpu", 4), (ids,), annotations=TITAN_TP)
    report = verify(model, (ids,), plan=plan, captured=capture(model, (ids,), blocks="full"), name="titan")
    assert report.ok, str(report)
    assert report.emitted == report.planned and report.ranks_agree
    assert {"forward all_reduce", "backward all_reduce"} <= set(report.emitted)
