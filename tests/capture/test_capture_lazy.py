"""Export's speed-ups change nothing the planner, codegen or verify read: lazy graph modules inside export, and
no Python stacks recorded for the two exports of the 2-block shortcut (capture/export.py); a capture of every
layer, the one codegen emits, keeps them."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch.fx._lazy_graph_module import _LazyGraphModule

from autoshard import zoo
from autoshard.capture import META_TENSOR, Captured, capture
from autoshard.capture import export as export_module


def _facts(cap: Captured) -> list[tuple[object, ...]]:
    """Per node what the planner may read: name, op, target, arguments, every meta key but the Python stack,
    tensor metadata and module stack."""
    return [
        (
            n.name,
            n.op,
            str(n.target),
            str(n.args),
            str(n.kwargs),
            sorted(k for k in n.meta if k != "stack_trace"),
            str(n.meta.get(META_TENSOR)),
            str(n.meta.get("nn_module_stack")),
        )
        for n in cap.graph_module.graph.nodes
    ]


def _code(cap: Captured) -> list[str]:
    """The graph's Python code without the ``# File:`` comments quoting the stacks."""
    return [line for line in cap.graph_module.code.splitlines() if not line.strip().startswith("#")]


@pytest.mark.parametrize("name", ["llama-tiny", "mixtral-tiny"])  # RoPE in a set-grad region; experts
def test_lazy_graph_modules_and_the_quiet_check_export_change_no_captured_graph(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    case = zoo.build(name, layers=4)  # 4 blocks: the 2-block graph and its 3-block check export
    fast = capture(case.model, case.args, case.kwargs)
    assert fast.blocks is not None and fast.blocks.captured_blocks == 2, fast.notes
    assert not torch.fx.config.do_not_emit_stack_traces  # restored after the exports
    assert not any(n.meta.get("stack_trace") for n in fast.graph_module.graph.nodes)  # planned, not emitted
    full = capture(case.model, case.args, case.kwargs, blocks="full")  # what codegen emits keeps its stacks
    assert any(n.meta.get("stack_trace") for n in full.graph_module.graph.nodes)
    monkeypatch.setattr(export_module, "_lazy_graph_modules", contextlib.nullcontext)
    monkeypatch.setattr(export_module, "_no_stack_traces", contextlib.nullcontext)
    plain = capture(case.model, case.args, case.kwargs)
    assert any(n.meta.get("stack_trace") for n in plain.graph_module.graph.nodes)
    assert not isinstance(fast.graph_module, _LazyGraphModule)  # an ordinary graph module comes out
    assert _code(fast) == _code(plain)
    assert _facts(fast) == _facts(plain)
    assert fast.notes == plain.notes and fast.blocks == plain.blocks
