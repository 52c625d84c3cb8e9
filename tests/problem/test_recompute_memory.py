"""Recomputation's working set is what re-running one block re-materialises: the outputs backward did not keep.

A parameter's state (weights, gradients, optimizer state) is held whether or not its block recomputes, so its
memory under recomputation equals its memory without: no working-set term (it was once counted twice, one
block's parameters on top of every copy's: LLaMA-3-8B gate_proj 317.6 vs 308.0 MiB per copy).  An activation
that is dropped adds its kept bytes once, for the one block re-run at a time.
"""

from __future__ import annotations

import dataclasses

import pytest

import autoshard
from autoshard import zoo
from autoshard.capture import capture
from autoshard.problem.build import build_problem
from autoshard.problem.costs import CostOptions, Recompute, node_memory
from autoshard.problem.recompute import node_memory_total


@pytest.fixture(scope="module")
def llama() -> tuple:
    case = zoo.build("llama-tiny", layers=4, batch=8, seq=32, device="meta")
    return capture(case.model, case.args, case.kwargs), autoshard.load_cluster("a100x8", mesh=(2, 2, 2))


@pytest.mark.parametrize("share", [1.0, 0.5])
@pytest.mark.parametrize("policy", [Recompute.SELECTIVE, Recompute.FULL])
def test_parameter_memory_has_no_working_set(llama: tuple, policy: Recompute, share: float) -> None:
    captured, cluster = llama
    opts = CostOptions(recompute=policy, recompute_share=share)
    built = build_problem(captured, cluster, opts)
    plain = dataclasses.replace(opts, recompute=Recompute.NONE)
    params = activations = 0
    for name in built.variables:
        info, count = built.infos[name], built.multiplicity[name]
        keeps = built.keeps[name]
        if info.block is None or keeps:
            continue
        for strat in built.strategies[name]:
            total = node_memory_total(info, strat, cluster, opts, keeps, count)
            if info.kind == "parameter":
                params += 1
                assert total == node_memory_total(info, strat, cluster, plain, True, count)
                assert total == node_memory(info, strat, cluster, opts, True) * count > 0
            elif info.kind == "op":
                activations += 1
                kept = node_memory(info, strat, cluster, opts, True)
                dropped = node_memory(info, strat, cluster, opts, False)
                expected = dropped * count + (kept - dropped) * (count * (1.0 - share) + 1.0)
                assert total == pytest.approx(expected, rel=1e-12)
    assert params and activations  # both kinds were dropped and checked
