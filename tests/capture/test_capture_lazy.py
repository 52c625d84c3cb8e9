"""Export's speed-ups change nothing the planner, codegen or verify read: lazy graph modules inside export, and
no Python stacks recorded for the 3-block check export (capture/export.py)."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch.fx._lazy_graph_module import _LazyGraphModule

from autoshard import zoo
from autoshard.capture import META_TENSOR, Captured, capture
from autoshard.capture import export as export_module


def _facts(cap: Captured) -> list[tuple[object, ...]]:
    """Per node what any later stage may read: name, op, target, arguments, every meta key, tensor metadata,
    module stack and Python stack."""
    return [
        (
            n.name,
            n.op,
            str(n.target),
            str(n.args),
            str(n.kwargs),
            sorted(n.meta),
            str(n.meta.get(META_TENSOR)),
            str(n.meta.get("nn_module_stack")),
            n.meta.get("stack_trace"),
        )
        for n in cap.graph_module.graph.nodes
    ]


@pytest.mark.parametrize("name", ["llama-tiny", "mixtral-tiny"])  # RoPE in a set-grad region; experts
def test_lazy_graph_modules_and_the_quiet_check_export_change_no_captured_graph(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    case = zoo.build(name, layers=4)  # 4 blocks: the 2-block graph and its 3-block check export
    fast = capture(case.model, case.args, case.kwargs)
    assert fast.blocks is not None and fast.blocks.captured_blocks == 2, fast.notes
    assert not torch.fx.config.do_not_emit_stack_traces  # restored after the check export
    assert any(
        n.meta.get("stack_trace") for n in fast.graph_module.graph.nodes
    )  # the planned graph keeps them
    monkeypatch.setattr(export_module, "_lazy_graph_modules", contextlib.nullcontext)
    monkeypatch.setattr(export_module, "_no_stack_traces", contextlib.nullcontext)
    plain = capture(case.model, case.args, case.kwargs)
    assert not isinstance(fast.graph_module, _LazyGraphModule)  # an ordinary graph module comes out
    assert fast.graph_module.code == plain.graph_module.code
    assert _facts(fast) == _facts(plain)
    assert fast.notes == plain.notes and fast.blocks == plain.blocks
