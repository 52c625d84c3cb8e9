"""Which gradient syncs leave the backward (run once per step): a hand-built graph, no process group."""

from __future__ import annotations

import torch
from torch import fx, nn

from autoshard.codegen.collectives import parse_steps, redistribute
from autoshard.runtime.grad_sync import DeferredSync, defer_gradient_sync, sum_axes

ALL_REDUCE = "all_reduce(axis=0, 128 B)"
TWO_AXES = "reduce_scatter(axis=1, dim=0, 128 B); all_reduce(axis=0, 64 B); all_gather(axis=1, dim=0, 128 B)"


def _module() -> fx.GraphModule:
    root = nn.Module()
    for name in ("dp", "dp2", "fsdp", "twice", "local"):
        root.register_parameter(name, nn.Parameter(torch.ones(4, 4)))
    g = fx.Graph()
    x, comm = g.placeholder("x"), g.placeholder("comm")
    out = x
    edges = {
        "dp": ("", ALL_REDUCE),  # data parallel: identity forward, all-reduce backward -> deferred
        "dp2": ("", TWO_AXES),  # replicated over two axes: same shape in, same shape out -> deferred
        "fsdp": ("all_gather(axis=0, dim=0, 64 B)", "reduce_scatter(axis=0, dim=0, 128 B)"),  # shape changes
        "local": ("", ""),  # nothing to synchronise
    }
    for name, (forward, backward) in edges.items():
        w = g.call_function(redistribute, (g.get_attr(name), comm, forward, backward))
        out = g.call_function(torch.add, (out, w))
    twice = g.get_attr("twice")  # read by two edges: its other edge's gradient must not be reduced
    out = g.call_function(torch.add, (out, g.call_function(redistribute, (twice, comm, "", ALL_REDUCE))))
    out = g.call_function(torch.mul, (out, twice))
    g.output(out)
    return fx.GraphModule(root, g)


def test_only_single_use_same_layout_weights_are_deferred() -> None:
    module = _module()
    deferred = defer_gradient_sync(module)
    assert deferred == (DeferredSync("dp", ALL_REDUCE), DeferredSync("dp2", TWO_AXES))
    backward = {n.args[0].target: n.args[3] for n in module.graph.nodes if n.target is redistribute}
    assert backward == {
        "dp": "",
        "dp2": "",
        "fsdp": "reduce_scatter(axis=0, dim=0, 128 B)",
        "local": "",
        "twice": ALL_REDUCE,
    }
    assert "redistribute(dp, comm, '', '')" in module.code
    code = module.code
    assert defer_gradient_sync(module) == deferred  # idempotent: the module keeps one record
    assert module.code == code
    assert [d.axes for d in deferred] == [(0,), (0, 1)]  # both are pure sums (ZeRO can reduce-scatter them)


def test_pipelines_defer_the_fsdp_reduce_scatter_too() -> None:
    module = _module()
    deferred = defer_gradient_sync(module, gathered=True)
    fsdp = DeferredSync("fsdp", "reduce_scatter(axis=0, dim=0, 128 B)", gathered=True)
    assert deferred == (DeferredSync("dp", ALL_REDUCE), DeferredSync("dp2", TWO_AXES), fsdp)
    assert fsdp.axes is None  # its gradient arrives whole: held over the microbatches, reduce-scattered once
    assert "gather_later(fsdp, comm" in module.code


def test_sum_axes_accepts_only_sums() -> None:
    assert sum_axes(parse_steps(TWO_AXES)) == (0, 1)
    assert sum_axes(parse_steps("all_gather(axis=0, dim=0)")) is None
    assert sum_axes(parse_steps("reduce_scatter(axis=0, dim=0)")) is None  # leaves the gradient split
