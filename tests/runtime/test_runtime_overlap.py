"""Plan.overlap at run time: DP all-reduces and ZeRO-2 reduce-scatters run in the plan's buckets
(Plan.grad_buckets), issued in its order during backward; FSDP gathers prefetched a layer ahead in forward and
backward -- checked structurally (what ran, its order and bytes, against the plan) and against single-device
AdamW."""

from __future__ import annotations

import copy
import dataclasses
import functools
import itertools
import warnings
from collections import Counter
from typing import Any

import pytest
import torch
from runtime_cases import LLAMA_FSDP as FSDP
from runtime_cases import model, plan
from test_runtime_zero import DP, STEPS, _batches, _reference

import autoshard
from autoshard.codegen import full_state_dict, parallel_info, parallelize, shard_inputs
from autoshard.codegen.assign import PlanMismatchWarning
from autoshard.runtime.launch import launch
from autoshard.runtime.overlap import apply_overlap
from autoshard.runtime.verify import cluster_for
from autoshard.runtime.zero import ZeroOptimizer
from cost_models.overlap import OverlapPolicy


def _equal(state: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> None:
    for name, value in reference.items():
        torch.testing.assert_close(state[name], value, rtol=1e-9, atol=1e-12, msg=name)


def _counts(module: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for rec in parallel_info(module).comm.log or []:
        counts[f"{rec.phase}:{rec.kind}"] = counts.get(f"{rec.phase}:{rec.kind}", 0) + 1
    return counts


def _ran(module: Any) -> list[tuple[str, int, int]]:
    """(kind, axis, bytes) of every bucketed gradient collective that ran, in order."""
    log = parallel_info(module).comm.log or []
    return [(r.kind, r.mesh_axis, r.nbytes) for r in log if r.phase == "backward"]


def _planned(p: Any, kind: str) -> list[tuple[str, int, int]]:
    return [(kind, b.mesh_axis, b.nbytes) for b in p.grad_buckets]


def _train_dp() -> tuple[
    dict[str, torch.Tensor], list[tuple[str, int, int]], list[tuple[int, int]], Any, str
]:
    m, p = model("llama"), _priced("llama", DP, 64 << 10)
    module = parallelize(m.model, p, m.args, captured=m.captured, record=True)
    opt = torch.optim.AdamW(module.parameters(), lr=1e-2, weight_decay=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PlanMismatchWarning)  # the plan's buckets, nothing said
        sync, prefetcher = apply_overlap(module, opt)
    assert prefetcher is None  # nothing gathered under DP
    for ids in _batches():
        opt.zero_grad()
        (module(*shard_inputs(p, ids)).square().sum() / (4 * 8 * 512)).backward()
        opt.step()  # its pre-hook waits for the buckets
    names = [tuple(b.names) for b in sync.buckets]
    return full_state_dict(module), _ran(module), sync.events, (p, names), module.code


@pytest.mark.slow
def test_dp_runs_the_plans_buckets_in_its_order_during_backward() -> None:
    """The all-reduces that ran are the plan's buckets -- count, order, axis, bytes, members -- each issued
    while gradients were still to come but the last; the weights equal single-device AdamW's."""
    reference, _ = _reference(), _priced("llama", DP, 64 << 10)  # planned once: the ranks fork with it
    for state, ran, events, (p, names), code in launch(_train_dp, 2):
        _equal(state, reference)
        buckets = len(p.grad_buckets)
        # 64 KiB over the tiny LLaMA's ~1.1 MiB: lm_head, layer 1 (with the final norm), layer 0, embedding
        assert [b.unit for b in p.grad_buckets] == ["linear_14", "layer 1", "layer 0", "embedding"]
        assert "model.norm.weight" in p.grad_buckets[1].params  # ready before layer 1, too small alone
        assert names == [b.params for b in p.grad_buckets]  # the members, in the plan's buffer order
        assert ran == _planned(p, "all_reduce") * STEPS  # one all-reduce per bucket, in order, none per edge
        per_step = [events[i * buckets : (i + 1) * buckets] for i in range(STEPS)]
        # at each issue, every later bucket's gradients were still to come, and no more: each bucket left as
        # its last member arrived, at its unit's end as priced (the embedding's, the last, as backward ends)
        later = [sum(len(b.params) for b in p.grad_buckets[k + 1 :]) for k in range(buckets)]
        assert later == [20, 10, 1, 0]
        for issued in per_step:
            assert issued == list(zip(range(buckets), later, strict=True))  # each once, in the plan's order
        assert "all_reduce" not in code  # the edges' all-reduces left the graph


def _train_zero2() -> tuple[dict[str, torch.Tensor], list[tuple[str, int, int]], Any, list[tuple[str, ...]]]:
    m, p = model("llama"), _priced("llama", DP, 64 << 10)
    module = parallelize(m.model, p, m.args, captured=m.captured, record=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PlanMismatchWarning)
        opt = ZeroOptimizer(module, torch.optim.AdamW, stage=2, overlap=True, lr=1e-2, weight_decay=0.1)
    for ids in _batches():
        opt.zero_grad()
        (module(*shard_inputs(p, ids)).square().sum() / (4 * 8 * 512)).backward()
        opt.step()
    assert opt.buckets is not None
    return full_state_dict(module), _ran(module), p, [tuple(b.names) for b in opt.buckets.buckets]


@pytest.mark.slow
def test_zero2_reduce_scatters_are_the_plans_buckets() -> None:
    """ZeRO-2 runs each priced all-reduce bucket as one reduce-scatter of its bytes (every member's elements
    divide by 2 here: no padding), in the plan's order, and still equals single-device AdamW."""
    reference, _ = _reference(), _priced("llama", DP, 64 << 10)
    for state, ran, p, names in launch(_train_zero2, 2):
        _equal(state, reference)
        assert len(p.grad_buckets) == 4 and names == [b.params for b in p.grad_buckets]
        assert ran == _planned(p, "reduce_scatter") * STEPS


def _train_fsdp_prefetch() -> tuple[
    dict[str, torch.Tensor], dict[str, int], list[tuple[str, str, str]], int, int
]:
    from autoshard.runtime.prefetch import prefetch_gathers
    from autoshard.runtime.reshard import reshard_after_forward

    m, p = model("llama"), plan("llama", 2, None, FSDP)
    module = parallelize(m.model, p, m.args, captured=m.captured, record=True)
    rewired = reshard_after_forward(module)
    prefetcher = prefetch_gathers(module, record=True)
    assert prefetcher is not None and prefetcher.depth == p.overlap.prefetch == 1
    opt = ZeroOptimizer(module, torch.optim.AdamW, stage=3, lr=1e-2, weight_decay=0.1)
    for ids in _batches():
        opt.zero_grad()
        (module(*shard_inputs(p, ids)).square().sum() / (4 * 8 * 512)).backward()
        opt.step()
    assert prefetcher.events is not None
    planned = parallel_info(module).collective_counts("forward")["all_gather"]
    ran = Counter(
        (r.kind, r.mesh_axis, r.nbytes) for r in parallel_info(module).comm.log or () if r.phase == "regather"
    )
    priced = Counter((c.kind, c.mesh_axis, c.nbytes) for c in p.collectives if c.phase == "regather")
    assert ran == Counter({k: n * STEPS for k, n in priced.items()}), (ran, priced)  # priced == emitted
    return full_state_dict(module), _counts(module), prefetcher.events, rewired, planned


def _ahead(events: list[tuple[str, str, str]], phase: str, order: list[str]) -> None:
    """Layer ``order[i + 1]``'s gathers were issued before layer ``order[i]``'s last use."""
    step = [(a, layer) for a, ph, layer in events if ph == phase]
    for now, upcoming in itertools.pairwise(order):
        issued = step.index(("issue", upcoming))
        last_use = max(i for i, e in enumerate(step) if e == ("use", now))
        assert issued < last_use, (phase, now, upcoming, step)


@pytest.mark.slow
def test_fsdp_gathers_are_prefetched_forward_and_backward() -> None:
    reference, _ = _reference(), plan("llama", 2, None, FSDP)  # planned once: the ranks fork with it
    for state, counts, events, rewired, planned in launch(_train_fsdp_prefetch, 2):
        _equal(state, reference)
        assert counts["forward:all_gather"] == planned * STEPS  # prefetch adds no gather
        assert counts["regather:all_gather"] == rewired * STEPS
        per_step = len(events) // STEPS
        last = events[-per_step:]
        layers = list(dict.fromkeys(layer for _, ph, layer in last if ph == "forward"))
        assert layers == ["model.layers.0", "model.layers.1", "lm_head.weight"]
        _ahead(last, "forward", layers)
        _ahead(last, "regather", list(reversed(layers)))


MLP_DP = (("x", ("S(0)",)), ("fc1", ((2, 1), (1, 1))), ("fc2", ((2, 1), (1, 1))))


@functools.cache
def _priced(name: str, annotations: Any, bucket_bytes: int) -> Any:
    """The runtime case ``name``'s plan under ``annotations`` on 2 ranks, priced under ``bucket_bytes``
    (the same strategies: only its buckets and step differ)."""
    import math

    import numpy as np

    from autoshard.planner_steps import reader
    from autoshard.problem.build import build_problem
    from autoshard.problem.costs import CostOptions
    from autoshard.runtime.verify import cluster_for
    from autoshard.search import solve

    m = model(name)
    dp = plan(name, 2, None, annotations)
    opts = CostOptions(overlap=OverlapPolicy(bucket_bytes=bucket_bytes))
    built = build_problem(m.captured, cluster_for("cpu", 2), opts)
    picked = {n.name: n.strategy for n in dp.nodes}  # the same strategies, priced under this policy
    masks: tuple[Any, ...] = tuple(
        np.array([str(s) == picked[v] for s in built.strategies[v]]) for v in built.variables
    )
    masks += (None,) * (built.problem.num_nodes - len(masks))  # fan-out and gather states: the best
    found = solve(dataclasses.replace(built.problem, allowed=masks), method="exact")
    return reader(m.model, m.captured, {}, [], math.inf, ())(built, found)


def _train_mlp_dp() -> tuple[list[list[str]], list[tuple[int, int]], dict[str, int], tuple[str, ...]]:
    m = model("mlp")
    p = _priced(
        "mlp", MLP_DP, 1024
    )  # fc2's bias + weight (64 + 1024 B) fill one bucket, fc1's (128 + 1024 B) one
    assert p.grad_sync is not None
    module = parallelize(m.model, p, m.args, captured=m.captured, record=True)
    opt = torch.optim.SGD(module.parameters(), lr=1e-2)
    sync, _ = apply_overlap(module, opt)
    names = {id(t): n for n, t in module.named_parameters()}
    gen = torch.Generator().manual_seed(3)
    for _ in range(STEPS):
        opt.zero_grad()
        x = torch.randn(8, 8, generator=gen, dtype=torch.float64)
        module(*shard_inputs(p, x)).square().sum().backward()
        opt.step()
    buckets = [[names[id(t)] for t in b.members] for b in sync.buckets]
    return buckets, sync.events, _counts(module), p.grad_sync.last


@pytest.mark.slow
def test_dp_buckets_and_their_issue_are_the_priced_ones() -> None:
    """The runtime's buckets are the cost model's (DDP's rule), fc2's bucket is issued while fc1's gradients
    are still to come (hidden, as priced), and the bucket issued as backward ends is the priced last one."""
    _priced("mlp", MLP_DP, 1024)
    for buckets, events, counts, last in launch(_train_mlp_dp, 2):
        assert buckets == [["fc2.bias", "fc2.weight"], ["fc1.bias", "fc1.weight"]]
        assert set(last) == {"fc1.bias", "fc1.weight"}  # priced: the last bucket, exposed
        assert counts["backward:all_reduce"] == 2 * STEPS  # the buckets' all-reduces ran, one each per step
        per_step = [events[i * 2 : (i + 1) * 2] for i in range(STEPS)]
        for issued in per_step:
            assert issued[0] == (0, 2)  # fc2's bucket: issued with fc1's two gradients still to come
            assert issued[1] == (1, 0) and set(buckets[1]) == set(last)  # issued as backward ends


def _train_mlp_accumulating(
    p: Any,
) -> tuple[list[tuple[str, int]], list[tuple[int, int]], dict[str, torch.Tensor]]:
    m = model("mlp")
    module = parallelize(m.model, p, (m.args[0][:4],), record=True)  # the graph of one microbatch
    opt = torch.optim.SGD(module.parameters(), lr=1e-2)
    sync, _ = apply_overlap(module, opt)
    for _ in range(STEPS):
        opt.zero_grad()
        for half in (m.args[0][:4], m.args[0][4:]):  # the plan's 2 microbatches, gradients accumulated
            module(*shard_inputs(p, half)).square().sum().backward()
        opt.step()
    ran = [(r.kind, r.nbytes) for r in parallel_info(module).comm.log or () if r.phase == "backward"]
    return ran, sync.events, full_state_dict(module)


@pytest.mark.slow
def test_with_microbatches_the_buckets_reduce_once_in_the_last_backward_pass() -> None:
    """Gradient accumulation over the plan's 2 microbatches: each bucket is reduced once per step, in the second
    backward pass (as priced), and the weights equal single-device SGD on the same microbatches."""
    m = model("mlp")
    p = autoshard.plan(m.model, cluster_for("cpu", 2), m.args, annotations=dict(MLP_DP), microbatches=2)
    assert p.microbatches == 2 and len(p.grad_buckets) == 1  # fc2's and fc1's 2.2 KiB: one bucket
    reference = copy.deepcopy(m.model)
    opt = torch.optim.SGD(reference.parameters(), lr=1e-2)
    for _ in range(STEPS):
        opt.zero_grad()
        for half in (m.args[0][:4], m.args[0][4:]):
            reference(half).square().sum().backward()
        opt.step()
    for ran, events, state in launch(_train_mlp_accumulating, 2, p):
        assert ran == [("all_reduce", p.grad_buckets[0].nbytes)] * STEPS  # once a step, not once a pass
        assert events == [(0, 0)] * STEPS  # as the second pass's last gradient arrived
        _equal(state, {k: v.detach() for k, v in reference.state_dict().items()})
