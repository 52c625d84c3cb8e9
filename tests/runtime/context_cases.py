"""Shared by the context-parallel runtime tests: count the K/V ring's hops across forked gloo ranks."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from autoshard.codegen import context
from autoshard.plans import Plan


def count_hops(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A file that gains one line per ring hop of any rank, ``hop <bytes sent>`` (the ranks are forked: they
    append to one file)."""
    hops = tmp_path / "hops"
    rotate = context._rotate

    def counted(tensors, nxt, prv, group):  # type: ignore[no-untyped-def]
        with hops.open("a") as f:
            f.write(f"hop {sum(t.numel() * t.element_size() for t in tensors)}\n")
        return rotate(tensors, nxt, prv, group)

    monkeypatch.setattr(context, "_rotate", counted)
    return hops


def sent_per_hop(hops: Path) -> Counter[int]:
    """How many hops of each size the run sent (all ranks), from :func:`count_hops`'s file."""
    return Counter(int(line.split()[1]) for line in hops.read_text().splitlines())


def planned_per_hop(plan: Plan, ranks: int) -> Counter[int]:
    """The same, as the plan lists them (``Plan.ring_transfers``: hops per device)."""
    out: Counter[int] = Counter()
    for r in plan.ring_transfers:
        out[r.nbytes] += r.hops * ranks
    return out
