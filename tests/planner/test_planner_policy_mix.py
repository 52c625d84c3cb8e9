"""The per-block search's step floor (planner_policy.mix_step_floor) and the skip it allows
(problem/mix.mix_policies(unwanted=)): the floor is below the lower-bound problem of every count that may
fit, and skipping leaves the search's answer unchanged wherever the rule applies."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import numpy as np
import pytest

import autoshard
import autoshard.planner as planner
from autoshard.errors import InfeasibleError
from autoshard.planner_policy import _ends, mix_cannot_win, mix_step_floor
from autoshard.planner_rerank import lower_bound_problem
from autoshard.problem.build import BuiltProblem
from autoshard.problem.costs import Recompute
from autoshard.problem.mix import least_fitting, mix_policies, share_problem
from autoshard.search import BoundExceeded, solve
from tests.problem.test_memory_budget import DATA_PARALLEL, LAYERS, _built, _case
from tests.problem.test_memory_budget import _halfway as _limit  # nothing fits without recomputation


def _pair(policy: Recompute) -> tuple[BuiltProblem, BuiltProblem]:
    return _built(policy, 0.0, _limit()), _built(policy, 1.0, _limit())


@pytest.mark.parametrize("policy", [Recompute.SELECTIVE, Recompute.FULL])
def test_the_floor_is_below_every_counts_lower_bound_problem(policy: Recompute) -> None:
    """From the least count that may fit to N, every term of the lower-bound problem at that count is at
    least the termwise minimum of the two ends (each term is monotone or concave in the count), so the
    floor is below every count's lower-bound optimum under the budget, and that is below its plans' steps
    (planner_rerank)."""
    zero, whole = _pair(policy)
    ends = _ends(zero, whole)
    floor = mix_step_floor(zero, whole)
    assert ends is not None and np.isfinite(floor)
    first = least_fitting(zero.problem, whole.problem, LAYERS)
    assert 1 <= first < LAYERS
    fitted = 0
    for k in range(first, LAYERS + 1):
        lower = lower_bound_problem(share_problem(zero, whole, k))
        assert lower is not None
        for a, b in zip(lower.node_costs, ends.node_costs, strict=True):
            assert np.all(a >= b)
        for e, f in zip(lower.edges, ends.edges, strict=True):
            assert np.all(e.cost >= f.cost)
        try:
            optimum = solve(lower).lower_bound
        except InfeasibleError:
            continue
        fitted += 1
        assert floor <= optimum
    assert fitted >= 2
    assert mix_cannot_win(zero, whole, floor * 0.999)  # a step below the floor: no count can be kept
    assert not mix_cannot_win(zero, whole, floor * 1.001)
    assert not mix_cannot_win(zero, whole, float("inf"))


def _uniform(*policies: Recompute) -> dict[Recompute, tuple[BuiltProblem, BuiltProblem, float]]:
    out = {}
    for policy in policies:
        whole = _built(policy, 1.0, _limit())
        try:
            objective = solve(whole.problem).objective
        except InfeasibleError:
            objective = float("inf")
        out[policy] = (whole, whole, objective)
    return out


def _zero(policy: Recompute) -> tuple[BuiltProblem, BuiltProblem]:
    zero = _built(policy, 0.0, _limit())
    return zero, zero


def test_only_the_last_policy_is_skipped_and_only_when_nothing_was_found_before_it() -> None:
    """Selective's counts find a plan here: full, the last policy, is then searched even when called
    unwanted (a find of it would replace selective's), and the answer is the one without the skip.  With
    full the only policy, an unwanted full is not searched at all."""
    asked: list[Recompute] = []

    def unwanted(zero: BuiltProblem, whole: BuiltProblem) -> bool:
        asked.append(whole.options.recompute)
        return True

    both = _uniform(Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL)
    plain = mix_policies(both, _zero, solve)
    skipping = mix_policies(both, _zero, solve, unwanted=unwanted)
    assert plain is not None and skipping is not None
    assert (skipping[3], skipping[0].choice, skipping[0].objective) == (
        plain[3],
        plain[0].choice,
        plain[0].objective,
    )
    assert asked == []  # selective is not the last policy; full came after a find
    alone = _uniform(Recompute.NONE, Recompute.FULL)
    assert mix_policies(alone, _zero, solve) is not None  # full's counts alone would find a plan
    assert mix_policies(alone, _zero, solve, unwanted=unwanted) is None
    assert asked == [Recompute.FULL]


class _Stop(Exception):
    pass


@pytest.mark.slow  # ~10 s on the shared 2-core machine: the budgeted builds, each policy solved under the budget
def test_a_policy_the_ceiling_prunes_still_has_its_counts_searched(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ceiling prunes a policy by its lower bound at share 1 (planner_rerank.by_step); fewer blocks
    recomputed cost less, so that is no bound on the policy's k-of-N counts (here full recomputation's is
    above the lower-bound optimum of a count that fits).  The planner hands such a policy to the per-block
    search, which bounds its counts soundly (mix_cannot_win), instead of dropping them with it."""
    zero, whole = _pair(Recompute.FULL)
    lower = lower_bound_problem(whole)
    assert lower is not None
    pruned_at = solve(dataclasses.replace(lower, memory_limit=None)).lower_bound
    counts = []
    for k in range(least_fitting(zero.problem, whole.problem, LAYERS), LAYERS):  # up to the first that fits
        count = lower_bound_problem(share_problem(zero, whole, k))
        assert count is not None
        with contextlib.suppress(InfeasibleError):
            counts.append(solve(count).lower_bound)
            break
    assert counts and min(counts) < pruned_at  # the share-1 bound does not bound the counts

    case, captured, cluster = _case()
    seen: dict[str, Any] = {"pruned": []}

    def by_step(*a: Any) -> Any:
        try:
            return planner.by_step.__wrapped__(*a)
        except BoundExceeded:
            seen["pruned"].append(a[2].options.recompute)
            raise

    def search_counts(uniform: Any, *a: Any, **k: Any) -> None:
        seen["searched"] = set(uniform)
        raise _Stop  # what follows (the counts' search, the ranking) is not what this test checks

    by_step.__wrapped__ = planner.by_step  # type: ignore[attr-defined]
    monkeypatch.setattr(planner, "by_step", by_step)
    monkeypatch.setattr(planner, "search_counts", search_counts)
    ceiling = min(counts) + 0.4 * (pruned_at - min(counts))  # a count may beat it, full's share 1 may not
    with pytest.raises(_Stop):
        autoshard.plan(case.model, cluster, case.args, case.kwargs, captured=captured,
                       annotations=DATA_PARALLEL, memory_limit=_limit(), ceiling=ceiling)  # fmt: skip
    assert seen["pruned"] == [Recompute.FULL] and Recompute.FULL in seen["searched"]
