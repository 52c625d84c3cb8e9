"""Nodes alike in all that mesh expansion reads share one expansion; nodes differing in any of it do not."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import autoshard.strategies.strategy as strategy
from autoshard.strategies import OpStrategy, strategies_for
from autoshard.strategies.validate import build_node

aten = torch.ops.aten


def _expansions(op: Any, args: tuple[Any, ...], mesh: tuple[int, ...]) -> tuple[list[OpStrategy], int]:
    """A fresh node's strategies and how many expansions were computed (not found) making them."""
    node, _ = build_node(op, args)
    before = strategy._combinations.cache_info().misses
    got = strategies_for(node, mesh, drop_dominated=False)
    return got, strategy._combinations.cache_info().misses - before


def _unshared(op: Any, args: tuple[Any, ...], mesh: tuple[int, ...]) -> list[OpStrategy]:
    node, _ = build_node(op, args)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(strategy, "_combinations", strategy._combinations.__wrapped__)
        return strategies_for(node, mesh, drop_dominated=False)


BASE = (aten.add.Tensor, (torch.randn(4, 8), torch.randn(4, 8)), (2, 2))
# one variant per field the expansion reads: an input's shape, an input's dtype (float or not: also whether it
# takes a gradient), the output's shape (broadcast), the choices (another op's rule), the mesh; the input
# slots below (one node feeding both roles)
VARIANTS = {
    "input shape": (aten.add.Tensor, (torch.randn(4, 6), torch.randn(4, 6)), (2, 2)),
    "input dtype": (aten.add.Tensor, (torch.arange(32).view(4, 8), torch.arange(32).view(4, 8)), (2, 2)),
    "output shape": (aten.add.Tensor, (torch.randn(2, 4, 8), torch.randn(4, 8)), (2, 2)),
    "choices": (aten.mm.default, (torch.randn(4, 8), torch.randn(8, 8)), (2, 2)),
    "mesh": (aten.add.Tensor, (torch.randn(4, 8), torch.randn(4, 8)), (2, 4)),
}


def test_alike_nodes_share_one_expansion() -> None:
    first, _ = _expansions(*BASE)
    again, computed = _expansions(*BASE)  # another node, the same op on the same shapes
    assert computed == 0
    assert all(a is b for a, b in zip(first, again, strict=True))
    assert again == _unshared(*BASE)
    again.clear()  # callers get their own list
    assert _expansions(*BASE)[0] == first


@pytest.mark.parametrize("field", sorted(VARIANTS))
def test_nodes_differing_in_a_read_field_do_not_share(field: str) -> None:
    base, _ = _expansions(*BASE)
    got, _ = _expansions(*VARIANTS[field])
    assert got == _unshared(*VARIANTS[field])
    assert got != base


def test_one_node_in_two_roles_is_not_two_nodes() -> None:
    x = torch.randn(4, 8)
    base, _ = _expansions(*BASE)  # add(a, b): two input slots
    got, _ = _expansions(aten.add.Tensor, (x, x), (2, 2))  # add(x, x): one slot, one spec
    assert got == _unshared(aten.add.Tensor, (x, x), (2, 2))
    assert got != base
