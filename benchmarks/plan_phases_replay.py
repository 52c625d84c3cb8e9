"""Replays of one plan's hot small calls, the code before and after (issue 17): CPU seconds that a whole plan's
noise on a shared machine (+-20 % between runs under load) cannot resolve.

Run: ``OMP_NUM_THREADS=1 python -m benchmarks.plan_phases_replay [70|8 ...]`` (each case in a fresh process).

One plan of the case (:mod:`benchmarks.plan_phases`) records every dominance test's inputs
(:func:`autoshard.search.dominance.dominators`), every spec comparison that reached
``ShardingSpec.__eq__`` and every ``StepCache.intern``; then each is replayed, alternating the code before
(written out below) and now, and the least and median CPU seconds of several rounds printed, with whether
the answers are the same.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks.isolate import run_isolated

__all__ = ["replay_case"]


def _pair_differences_before(mat: np.ndarray, s: np.ndarray, t: np.ndarray) -> np.ndarray:
    from autoshard.search.dominance import _BLOCK_ENTRIES, _skip_forbidden_min

    out = np.empty(s.size)
    block = max(1, _BLOCK_ENTRIES // max(1, mat.shape[1]))
    for lo in range(0, s.size, block):
        with np.errstate(invalid="ignore"):
            diff = mat[s[lo : lo + block]] - mat[t[lo : lo + block]]
        out[lo : lo + block] = _skip_forbidden_min(diff)
    return out


def _rounds(before: Callable[[], Any], after: Callable[[], Any], n: int = 9) -> str:
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(n):
        for run, acc in zip((before, after), times, strict=True):
            c0 = time.process_time()
            run()
            acc.append(time.process_time() - c0)
    a, b = sorted(times[0]), sorted(times[1])
    return f"{a[0]:.3f} (median {a[n // 2]:.3f}) -> {b[0]:.3f} (median {b[n // 2]:.3f}) s CPU"


def replay_case(which: str) -> dict[str, Any]:
    import autoshard
    import autoshard.search.dominance as dominance
    import autoshard.search.reduce as reduce
    from autoshard.placement import ShardingSpec
    from autoshard.problem.moves import StepCache
    from benchmarks.plan_phases import CASES
    from benchmarks.plan_scale import plan_case

    tests: list[tuple] = []
    pairs: list[tuple[ShardingSpec, ShardingSpec]] = []
    interned: list[tuple[int, ShardingSpec | None]] = []
    dominators, eq, intern = reduce.dominators, ShardingSpec.__eq__, StepCache.intern

    def record_test(*args: Any) -> np.ndarray:
        tests.append(args)
        return dominators(*args)

    def record_eq(a: ShardingSpec, b: object) -> bool:
        if isinstance(b, ShardingSpec):
            pairs.append((a, b))
        return eq(a, b)

    def record_intern(cache: StepCache, spec: ShardingSpec | None) -> int:
        interned.append((id(cache), spec))
        return intern(cache, spec)

    reduce.dominators, ShardingSpec.__eq__, StepCache.intern = record_test, record_eq, record_intern  # type: ignore[method-assign,assignment]
    objective = plan_case(*CASES[which])["objective"]
    reduce.dominators, ShardingSpec.__eq__, StepCache.intern = dominators, eq, intern  # type: ignore[method-assign]

    def tests_with(pair_differences: Callable[..., np.ndarray]) -> list[np.ndarray]:
        now = dominance._pair_differences
        dominance._pair_differences = pair_differences
        try:
            return [dominators(*a) for a in tests]
        finally:
            dominance._pair_differences = now

    same = all(
        map(np.array_equal, tests_with(_pair_differences_before), tests_with(dominance._pair_differences))
    )
    out: dict[str, Any] = {"objective": objective, "dominance tests": len(tests), "same dominators": same}
    out["dominators"] = _rounds(
        lambda: tests_with(_pair_differences_before), lambda: tests_with(dominance._pair_differences)
    )

    def old_eq(a: ShardingSpec, b: ShardingSpec) -> bool:  # the dataclass's comparison before
        return a.placements == b.placements

    out["spec comparisons"] = len(pairs)
    out["ShardingSpec.__eq__"] = _rounds(
        lambda: [old_eq(a, b) for a, b in pairs], lambda: [eq(a, b) for a, b in pairs]
    )
    case = CASES[which]
    cluster = autoshard.load_cluster(case[1], nodes=case[3], mesh=tuple(case[2]))

    def intern_before(cache: StepCache, spec: ShardingSpec | None) -> int:
        if spec is None:
            return -1
        found = cache._ids.get(spec)
        if found is None:
            found = cache._ids[spec] = len(cache._specs)
            cache._specs.append(spec)
        return found

    def interning(fn: Callable[[StepCache, ShardingSpec | None], int], spec_eq: Callable[..., Any]) -> None:
        ShardingSpec.__eq__ = spec_eq  # type: ignore[method-assign]
        try:
            caches: dict[int, StepCache] = {}
            for key, spec in interned:
                fn(caches[key] if key in caches else caches.setdefault(key, StepCache(cluster)), spec)
        finally:
            ShardingSpec.__eq__ = eq  # type: ignore[method-assign]

    out["interns"] = len(interned)
    out["StepCache.intern"] = _rounds(lambda: interning(intern_before, old_eq), lambda: interning(intern, eq))
    return out


if __name__ == "__main__":
    for which in sys.argv[1:] or ["70", "8"]:
        print(which, run_isolated("benchmarks.plan_phases_replay:replay_case", {"which": which}, timeout=900))
