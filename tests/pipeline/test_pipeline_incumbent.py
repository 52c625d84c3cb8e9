"""The pipeline search hands each policy's stage solve the previous policy's plan as its incumbent.

Under a binding budget the exact solver's Lagrangian sweep starts from ``incumbent`` (``hint`` reaches only
CP-SAT): started from the least-memory plan, LLaMA-3-70B's pp 4 x 128 selective stage solve stopped with no
probe and priced a plan 10x its bound (176.9 s among 21-27 s candidates).  So a later policy's stage plan is
never dearer than the previous policy's plan, where that plan fits its budget.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

import autoshard
import autoshard.pipeline.search as pipeline_search
from autoshard.search import Solution
from autoshard.search.problem import SearchProblem, evaluate, memory_of
from tests.pipeline.test_pipeline_pricing import _llama

pytest.importorskip("transformers")


def test_each_policy_starts_from_the_previous_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    model, ids = _llama(layers=4, hidden=512, batch=32, seq=512)
    cluster = autoshard.load_cluster("a100x8", nodes=2, mesh=(2, 8))
    pins: dict[str, Any] = {"pipeline": 2, "microbatches": 4}
    none = autoshard.plan(model, cluster, (ids,), recompute="none", **pins)
    calls: list[tuple[SearchProblem, dict[str, Any], Solution]] = []
    solve = pipeline_search.solve

    def recorded(problem: SearchProblem, **kwargs: Any) -> Solution:
        found = solve(problem, **kwargs)
        calls.append((problem, kwargs, found))
        return found

    monkeypatch.setattr(pipeline_search, "solve", recorded)
    budget = 0.99 * none.memory_per_device
    autoshard.plan(model, cluster, (ids,), recompute="auto", memory_limit=budget, **pins)
    hinted = [(p, k, s) for p, k, s in calls if k.get("hint") is not None]
    assert hinted  # a second policy was priced from the first one's plan
    for problem, kwargs, found in hinted:
        assert kwargs["incumbent"] == kwargs["hint"]
        start = kwargs["incumbent"]
        limit = problem.memory_limit if problem.memory_limit is not None else math.inf
        if memory_of(problem, start) <= limit:
            assert found.objective <= evaluate(problem, start) * (1 + 1e-12)
