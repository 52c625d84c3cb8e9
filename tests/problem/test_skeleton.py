"""Layout-graph skeletons: shapes that divide alike share one, and it rebuilds each graph move for move."""

from __future__ import annotations

import itertools

import pytest

from autoshard.problem.skeleton import signature, skeleton
from autoshard.redistribute_steps import _P, _R, _moves, _targets

MESH = (2, 1, 4)


def _direct(
    shape: tuple[int, ...], itemsize: int
) -> list[tuple[tuple[int, ...], tuple[int, ...], str, int, int]]:
    """Every move of ``shape``'s layout graph enumerated from scratch: (from, to, kind, bytes, axis)."""
    targets = _targets((_P,) * len(MESH), len(shape), MESH)
    out: list[tuple[tuple[int, ...], tuple[int, ...], str, int, int]] = []
    for lay in itertools.product(*[t or (_R,) for t in targets]):
        counts = [1] * len(shape)
        for p, n in zip(lay, MESH, strict=True):
            if p >= 0:
                counts[p] *= n
        if all(s % c == 0 for s, c in zip(shape, counts, strict=True)):
            out += [(lay, nxt, m[0], m[3], a) for a, m, nxt in _moves(lay, shape, itemsize, MESH, targets)]
    return out


@pytest.mark.parametrize("shape", [(8, 12), (24, 20), (6, 8), (2, 3), (3, 5, 16)])
def test_skeleton_rebuilds_the_graph_move_for_move(shape: tuple[int, ...]) -> None:
    sk = skeleton(shape, MESH)
    layouts = {k: lay for lay, k in sk.index.items()}
    got = [
        (layouts[u], layouts[v], kind, nbytes, a)
        for u, v, kind, nbytes, a in zip(
            sk.u.tolist(), sk.v.tolist(), sk.kinds, sk.nbytes(shape, 2), sk.axis.tolist(), strict=True
        )
    ]
    assert got == _direct(shape, 2)
    assert all(
        e == -1 or layouts[v][e] == _P for v, e in zip(sk.v.tolist(), sk.enters_p.tolist(), strict=True)
    )


def test_shapes_that_divide_alike_share_and_others_do_not() -> None:
    assert signature((8, 12), MESH) == signature((24, 20), MESH)
    assert skeleton((8, 12), MESH) is skeleton((24, 20), MESH)
    for other in [(6, 8), (8, 6), (8, 12, 4), (4, 12)]:  # a dim 2 divides but 4 not, the order, the rank, 8
        assert signature(other, MESH) != signature((8, 12), MESH)
        assert skeleton(other, MESH) is not skeleton((8, 12), MESH)
