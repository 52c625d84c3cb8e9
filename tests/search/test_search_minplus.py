"""The min-plus kernel (search/minplus.py) against the whole table summed in the parts' order and minimised
in one go: the same table bit for bit, for every layout of scopes, kept variables and slab sizes."""

from __future__ import annotations

import numpy as np
import pytest

from autoshard.search import minplus
from autoshard.search.minplus import reduced


def _whole(sizes: list[int], var: int, parts: list, keep: tuple[int, ...]) -> np.ndarray:
    """The reference: every part broadcast over all the variables (sorted), added in order, minimised."""
    names = sorted({w for f, _ in parts for w in f} | set(keep))
    total = None
    for scope, table in parts:
        shaped = table.reshape([sizes[w] if w in scope else 1 for w in names])
        total = shaped if total is None else total + shaped
    assert total is not None
    total = np.broadcast_to(total, [sizes[w] for w in names])
    drop = tuple(k for k, w in enumerate(names) if w not in keep)
    return total.min(axis=drop) if drop else np.array(total)


def _draw(rng: np.random.Generator, sizes: list[int], var: int) -> list:
    """A bucket: a unary cost of ``var`` first (usually), then factors over ``var`` and 1-3 others, some
    entries inf, a part without ``var`` now and then (the marginals' outside tables)."""
    others = [w for w in range(len(sizes)) if w != var]
    parts = []
    if rng.random() < 0.8:
        parts.append(((var,), rng.random(sizes[var])))
    for _ in range(int(rng.integers(1, 4))):
        chosen = rng.choice(others, size=int(rng.integers(1, min(3, len(others)) + 1)), replace=False)
        scope = tuple(sorted({int(w) for w in chosen} | ({var} if rng.random() < 0.9 else set())))
        table = rng.random([sizes[w] for w in scope]).round(2)  # ties
        table[rng.random(table.shape) < 0.05] = np.inf
        parts.append((scope, table))
    return parts


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("slab", [1, 7, 64, 1 << 16])
def test_the_kernel_is_the_whole_table_to_the_bit(
    seed: int, slab: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(seed)
    sizes = [int(s) for s in rng.integers(1, 9, size=5)]
    var = int(rng.integers(5))
    parts = _draw(rng, sizes, var)
    named = sorted({w for f, _ in parts for w in f} - {var})
    monkeypatch.setattr(minplus, "SLAB", slab)
    for keep in (tuple(named), tuple(named[:1]), (), tuple(sorted({var, *named[1:]})), (var,)):
        got = reduced(sizes, var, parts, keep)
        want = _whole(sizes, var, parts, keep)
        assert np.shape(got) == want.shape
        assert np.asarray(got).tobytes() == want.tobytes(), (keep, [f for f, _ in parts])


def test_the_largest_domain_runs_last_and_the_table_keeps_its_order() -> None:
    """A small domain sorted last (the 405B stage's 4-strategy node) is computed with the largest domain last
    instead (:func:`~autoshard.search.minplus._inner_last`); the table comes back over ``keep`` in increasing
    order, the same bits as the whole table."""
    assert minplus._inner_last([1, 2, 3], [9, 5, 40, 2]) == [1, 3, 2]
    assert minplus._inner_last([1, 2], [9, 5, 40]) == [1, 2]  # already last: unchanged
    rng = np.random.default_rng(1)
    sizes = [6, 5, 40, 2]
    parts = [
        ((1,), rng.random(5)),
        ((0, 1, 3), rng.random((6, 5, 2)).round(2)),
        ((1, 2), rng.random((5, 40))),
    ]
    for keep in ((0, 2, 3), (2, 3), (0, 3), (1, 2, 3), (3,)):
        got = reduced(sizes, 1, parts, keep)
        assert got.tobytes() == _whole(sizes, 1, parts, keep).tobytes(), keep


def test_a_large_table_is_recalled_only_for_the_same_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Another solver's bucket with the same parts (other arrays, same bytes) gets the kept table; one that
    differs anywhere, even where the key samples nothing, is computed afresh; the held bytes stay bounded."""
    from autoshard.search import recall as module
    from autoshard.search.recall import Recall

    monkeypatch.setattr(module, "LEAST", 1)
    monkeypatch.setattr(minplus, "LEAST", 1)
    store = Recall(budget=1 << 20)
    monkeypatch.setattr(minplus, "recall", store)
    rng = np.random.default_rng(0)
    sizes = [30, 40, 50]
    parts = [((1,), rng.random(40)), ((0, 1), rng.random((30, 40))), ((1, 2), rng.random((40, 50)))]
    first = reduced(sizes, 1, parts, (0, 2))
    again = reduced(sizes, 1, [(f, t.copy()) for f, t in parts], (0, 2))
    assert again is first  # recalled
    changed = [(f, t.copy()) for f, t in parts]
    changed[1][1][7, 3] = -1.0  # not a sampled entry (every 75th)
    fresh = reduced(sizes, 1, changed, (0, 2))
    assert fresh is not first and fresh.tobytes() == _whole(sizes, 1, changed, (0, 2)).tobytes()
    parts[0][1][:] = 5.0  # the caller's unary array changes after the call: the kept copy does not
    assert reduced(sizes, 1, parts, (0, 2)) is not first
    for seed in range(40):  # many other tables: the oldest go, the held bytes stay within the budget
        other = [(f, np.random.default_rng(seed).random(t.shape)) for f, t in parts]
        reduced(sizes, 1, other, (0, 2))
        assert store.held <= store.budget
    assert reduced(sizes, 1, [(f, t.copy()) for f, t in changed], (0, 2)) is not fresh  # evicted by now
