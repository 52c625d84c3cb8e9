"""The vectorised Bellman-Ford (problem/shortest.py) against a plain one, whichever way its rounds relax."""

from __future__ import annotations

import math

import numpy as np
import pytest

from autoshard.problem import shortest
from autoshard.problem.pricing import _Graph


def _random_graph(seed: int, layouts: int = 30, moves: int = 160) -> _Graph:
    rng = np.random.default_rng(seed)
    u = rng.integers(0, layouts, moves)
    v = (u + rng.integers(1, layouts, moves)) % layouts  # no self-moves
    w = rng.choice([0.0, 1e-6, 3e-5, 0.1, 0.3], moves) + rng.random(moves) * 1e-3  # ties and mixed scales
    enters = rng.integers(-1, 2, moves)  # -1: no P; 0/1: enters P on that axis
    return _Graph({(k,): k for k in range(layouts)}, u, v, w, enters, np.zeros(moves, int), ())


def _reference(graph: _Graph, mask: tuple[bool, ...], starts: list[int]) -> np.ndarray:
    """Move by move until nothing lowers: the least left-to-right float sum over every path."""
    allowed = shortest.allowed_moves(graph, mask)
    out = np.full((len(starts), len(graph.index)), math.inf)
    for row, s in enumerate(starts):
        dist = out[row]
        dist[s] = 0.0
        lowered = True
        while lowered:
            lowered = False
            for a, b, c in zip(graph.u[allowed], graph.v[allowed], graph.w[allowed], strict=True):
                if dist[a] + c < dist[b]:
                    dist[b] = dist[a] + c
                    lowered = True
    return out


@pytest.mark.parametrize("full", [1, 4, 10**9])  # all moves relaxed: only when all active, from 1/4, always
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_relaxation_schedule_gives_the_plain_search_bit_for_bit(
    monkeypatch: pytest.MonkeyPatch, full: int, seed: int
) -> None:
    graph = _random_graph(seed)
    monkeypatch.setattr(shortest, "_FULL", full)
    starts = [0, 3, 7, 11, 29]
    for mask in [(False, False), (True, False), (True, True)]:
        got = shortest.bellman_ford(graph, mask, starts)
        assert got.tobytes() == _reference(graph, mask, starts).tobytes()
    fewer = shortest.bellman_ford(graph, (False, False), starts)  # a warm start from a smaller mask
    warm = shortest.bellman_ford(graph, (False, True), starts, ((False, False), fewer))
    assert warm.tobytes() == _reference(graph, (False, True), starts).tobytes()
