"""The runtime's bucket layout follows Plan.grad_buckets exactly, issues buckets in the plan's order, and
says once -- never silently -- where it cannot (runtime/overlap.py); no process group needed."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

import autoshard.runtime.overlap as overlap
from autoshard.codegen.assign import PlanMismatchWarning
from autoshard.runtime.overlap import GradSyncError, _Buckets
from cost_models.overlap import GradBucket


def _members(**sizes: tuple[int, int]) -> dict[str, Any]:
    """name -> (tensor, axis, numel, ways 1, chunk) for all-reduces of float64 gradients of ``numel``."""
    return {n: (torch.zeros(k, dtype=torch.float64), axis, k, 1, k) for n, (k, axis) in sizes.items()}


def _bucket(params: tuple[str, ...], index: int, axis: int = 0, size: int = 64) -> GradBucket:
    return GradBucket(axis, "all_reduce", params, 8 * 4 * len(params), f"unit {index}", index, size)


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(overlap, "_SAID", set())  # said once per process: each test starts unsaid


def test_the_plans_buckets_are_laid_out_exactly_and_issued_in_its_order() -> None:
    # fc2 on axis 0, then a bucket holding reductions on two axes (one record each), then fc1: sizes
    # that the runtime's own rule (64 B, reverse registration) would group differently
    members = _members(w2=(4, 0), b2=(4, 0), n=(4, 1), w1=(4, 0), b1=(4, 0))
    planned = (_bucket(("b2", "w2"), 0), _bucket(("n",), 1, axis=1), _bucket(("b1",), 1), _bucket(("w1",), 2))
    buckets = _Buckets("all_reduce", Any, 64)  # type: ignore[arg-type]  # laying out needs no group
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the plan's buckets: nothing to say
        buckets.lay_out(planned, members)
    assert [b.names for b in buckets.buckets] == [["b2", "w2"], ["n"], ["b1"], ["w1"]]
    assert [b.axis for b in buckets.buckets] == [0, 1, 0, 0]
    where = {n: buckets.where[id(m[0])] for n, m in members.items()}
    arrive = {n: m[0] for n, m in members.items()}
    # w1 (the last bucket's) arrives early: nothing is due before every bucket ahead of it is issued
    assert buckets.arrive(arrive["w1"]) == []
    assert buckets.arrive(arrive["w2"]) == []
    assert buckets.arrive(arrive["b2"]) == [where["b2"]]
    assert buckets.arrive(arrive["b1"]) == []  # "n" (bucket 1 on axis 1) is still out
    assert buckets.arrive(arrive["n"]) == [where["n"], where["b1"], where["w1"]]


def test_with_microbatches_buckets_are_due_in_the_last_pass_and_a_late_gradient_is_refused() -> None:
    members = _members(w=(4, 0), b=(4, 0))
    buckets = _Buckets("all_reduce", Any, 64, rounds=2)  # type: ignore[arg-type]  # 2 microbatches a step
    buckets.lay_out((_bucket(("b", "w"), 0),), members)
    w, b = members["w"][0], members["b"][0]
    assert buckets.arrive(w) == [] and buckets.arrive(b) == []  # the first pass: gradients accumulate
    assert buckets.arrive(w) == [] and buckets.arrive(b) == buckets.buckets  # the second: reduced
    buckets.buckets[0].work = object()  # issued (as _Buckets.issue leaves it)
    with pytest.raises(
        GradSyncError, match=r"gradient of w arrived after its bucket was reduced: .* plan's 2"
    ):
        buckets.arrive(w)


def test_without_the_plans_buckets_the_runtime_says_so_once_and_uses_its_own_order() -> None:
    members = _members(a=(8, 0), b=(8, 0), c=(8, 0))  # 64 B each: one bucket each at 64 B
    buckets = _Buckets("all_reduce", Any, 64)  # type: ignore[arg-type]
    with pytest.warns(PlanMismatchWarning, match=r"the plan records none .*own order"):
        buckets.lay_out((), members)
    assert [b.names for b in buckets.buckets] == [["a"], ["b"], ["c"]]
    again = _Buckets("all_reduce", Any, 64)  # type: ignore[arg-type]
    with pytest.warns(PlanMismatchWarning, match=r"buckets of 64 B asked .* the plan's formed for 128 B"):
        again.lay_out((_bucket(("c", "b", "a"), 0, size=128),), members)  # another size: own order too
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _Buckets("all_reduce", Any, 64).lay_out((), members)  # type: ignore[arg-type]  # said already


def test_members_the_run_cannot_follow_are_said() -> None:
    members = _members(a=(4, 0), b=(4, 1), extra=(4, 0))
    buckets = _Buckets("all_reduce", Any, 64)  # type: ignore[arg-type]
    with pytest.warns(PlanMismatchWarning) as said:
        buckets.lay_out((_bucket(("a", "b"), 0), _bucket(("gone",), 1)), members)  # b: on axis 1 here
    text = " ".join(str(w.message) for w in said)
    assert "2 planned member(s) are not reduced here" in text and "e.g. b" in text
    assert "2 gradient(s) outside the plan's buckets (e.g. b)" in text
    assert [bk.names for bk in buckets.buckets] == [["a"], ["b"], ["extra"]]


def test_buckets_of_other_collectives_are_said_not_bucketed() -> None:
    fsdp = GradBucket(0, "reduce_scatter", ("w",), 16, "linear", 0, 64)
    buckets = _Buckets("all_reduce", Any, 64)  # type: ignore[arg-type]
    with pytest.warns(
        PlanMismatchWarning, match=r"1 planned reduce_scatter bucket\(s\) \(e.g. w\) run per parameter"
    ):
        buckets.lay_out((fsdp, _bucket(("n",), 0)), _members(n=(4, 0)))
    assert [b.names for b in buckets.buckets] == [["n"]]  # the all-reduce bucket: as planned
