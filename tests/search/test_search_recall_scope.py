"""The recall's tables live as long as the outermost scoped call (one plan), never between plans."""

from __future__ import annotations

import numpy as np
import pytest

from autoshard.search.recall import recall, scoped


def test_scoped_empties_the_recall_when_the_outermost_call_returns() -> None:
    parts = (np.arange(4.0), np.ones((4, 4)))
    seen: list[int] = []

    @scoped
    def inner() -> None:
        recall.keep(("k",), parts, np.zeros((1 << 20,)))
        seen.append(recall.held)

    @scoped
    def outer() -> None:
        inner()
        seen.append(recall.held)  # still held: the inner call is nested

    outer()
    assert seen[0] > 0 and seen[1] == seen[0]
    assert recall.held == 0 and not recall.entries and recall.depth == 0


def test_scoped_empties_the_recall_when_the_call_raises() -> None:
    @scoped
    def failing() -> None:
        recall.keep(("k",), (np.arange(2.0),), np.zeros((1 << 20,)))
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        failing()
    assert recall.held == 0 and recall.depth == 0
