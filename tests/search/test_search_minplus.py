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
