"""Messages kept between eliminations (search/messages.py): the same plans and values, bit for bit, as a fresh
solver's at every multiplier; memory-free subtrees' messages are reused, changed ones are not."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from search_cases import transformer_problem

from autoshard.search.exact import ExactSolver
from autoshard.search.problem import pairwise_form


@pytest.mark.parametrize("seed", range(4))
def test_kept_messages_change_nothing_along_a_sweep(seed: int) -> None:
    p = transformer_problem(seed, 5, memory=True)
    assert p.memory is not None
    # a third of the nodes hold no memory: their unary cost is the same at every multiplier
    memory = tuple(np.zeros_like(m) if i % 3 == 0 else m for i, m in enumerate(p.memory))
    p = dataclasses.replace(p, memory=memory)
    kept = ExactSolver(pairwise_form(p))
    assert kept.plan is not None and not kept.conditioned
    reused = 0
    for lam in (0.0, 1e-3, 1e-2, 1e-2, 0.1, 0.0):
        unary = [c + lam * m for c, m in zip(kept.form.unary, memory, strict=True)]
        before = {k: out for k, (_, out) in kept.memo.items()}
        got = kept.solve(unary)
        reused += sum(kept.memo[k][1] is out for k, out in before.items())
        want = ExactSolver(pairwise_form(p)).solve(unary)
        assert got == want  # plan and value, to the bit
    assert reused > 0
    # the same multiplier twice: every message is the last one
    unary = [c + 0.5 * m for c, m in zip(kept.form.unary, memory, strict=True)]
    kept.solve(unary)
    first = {k: out for k, (_, out) in kept.memo.items()}
    kept.solve([u.copy() for u in unary])
    assert all(kept.memo[k][1] is out for k, out in first.items())
