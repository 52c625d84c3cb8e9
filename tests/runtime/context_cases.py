"""Shared by the context-parallel runtime tests: count the K/V ring's hops across forked gloo ranks."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoshard.codegen import context


def count_hops(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A file that gains one line per ring hop of any rank (the ranks are forked: they append to one file)."""
    hops = tmp_path / "hops"
    rotate = context._rotate

    def counted(tensors, nxt, prv, group):  # type: ignore[no-untyped-def]
        with hops.open("a") as f:
            f.write("hop\n")
        return rotate(tensors, nxt, prv, group)

    monkeypatch.setattr(context, "_rotate", counted)
    return hops
