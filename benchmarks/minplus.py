"""CPU seconds of the min-plus kernel (``search/minplus.py:reduced``) over every call one plan makes (issue 17).

Run: ``OMP_NUM_THREADS=1 python -m benchmarks.minplus [8|70 ...] [--slab N ...]``.

The plan runs once with each kernel call's arguments recorded (its inputs are kept alive: ~0.2 GB for
LLaMA-3-70B on 16 x 8 x 8); then the calls are replayed three times and the least CPU time printed, split by
table size, with the entries summed and minimised, with the recall of repeated tables across solves
(search/recall.py) and without.  Each replay's tables are checked against the plan's, bit
for bit.  ``--slab``: replay with these slab sizes as well (:data:`autoshard.search.minplus.SLAB`).  Wall time
on a shared machine says little; the figures are ``time.process_time``.
"""

from __future__ import annotations

import math
import sys
import time
from collections import defaultdict
from typing import Any

import numpy as np

from benchmarks.plan_phases import CASES
from benchmarks.plan_scale import plan_case

__all__ = ["record", "replay"]

_Call = tuple[tuple[int, ...], int, list[tuple[tuple[int, ...], np.ndarray]], tuple[int, ...], np.ndarray]


def record(which: str) -> tuple[list[_Call], dict[str, Any]]:
    """Plan case ``which`` with every kernel call's (sizes, var, parts, keep, answer) kept."""
    from autoshard.search import exact, minplus

    calls: list[_Call] = []
    kernel = minplus.reduced

    def kept(sizes: Any, var: int, parts: Any, keep: Any) -> np.ndarray:
        out = kernel(sizes, var, parts, keep)
        calls.append((tuple(sizes), var, list(parts), tuple(keep), out))
        return out

    exact.reduced = kept  # ExactSolver.reduced calls it by this name
    try:
        r = plan_case(*CASES[which])
    finally:
        exact.reduced = kernel
    return calls, r


def replay(calls: list[_Call], repeats: int = 3) -> dict[int, tuple[int, int, float]]:
    """Least CPU seconds over ``repeats`` replays, by table size (a power of ten): (calls, entries, CPU)."""
    from autoshard.search.minplus import reduced
    from autoshard.search.recall import recall

    best: dict[int, list[float]] = defaultdict(lambda: [math.inf])
    count: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    for rep in range(repeats):
        recall.clear()  # each replay recalls what the plan would: the repeats after their first call
        spent: dict[int, float] = defaultdict(float)
        for sizes, var, parts, keep, want in calls:
            entries = math.prod(sizes[w] for w in {w for f, _ in parts for w in f} | set(keep))
            band = 10 ** int(math.log10(max(entries, 1)))
            c0 = time.process_time()
            got = reduced(sizes, var, parts, keep)
            spent[band] += time.process_time() - c0
            assert np.asarray(got).tobytes() == np.asarray(want).tobytes(), "a table changed"
            if rep == 0:
                count[band][0] += 1
                count[band][1] += entries
        for band, cpu in spent.items():
            best[band][0] = min(best[band][0], cpu)
    return {band: (count[band][0], count[band][1], best[band][0]) for band in sorted(best)}


def run(which: list[str], slabs: list[int], log: Any = print) -> None:
    from autoshard.search import minplus
    from autoshard.search.recall import recall

    for case in which:
        calls, r = record(case)
        log(f"{' '.join(map(str, CASES[case][:3]))}: {r['cpu_s']:.2f} s CPU, objective {r['objective']!r}")
        default = minplus.SLAB
        budget = recall.budget
        for slab, held in [(default, budget), (default, 0)] + [(s, budget) for s in slabs]:
            minplus.SLAB, recall.budget = slab, held
            rows = replay(calls)
            total = sum(cpu for _, _, cpu in rows.values())
            entries = sum(e for _, e, _ in rows.values())
            log(
                f"  slab {slab}, recall {held >> 20} MiB: {len(calls)} calls, {entries:.3g} entries, "
                f"{total:.3f} s CPU"
            )
            for band, (n, e, cpu) in rows.items():
                log(
                    f"    tables ~{band:.0e}: {n:5d} calls {e:.3g} entries {cpu:.3f} s ({cpu / e * 1e9:.2f} ns each)"
                )
        minplus.SLAB, recall.budget = default, budget


if __name__ == "__main__":
    args = sys.argv[1:]
    slabs = [int(a) for a in args[args.index("--slab") + 1 :]] if "--slab" in args else []
    cases = args[: args.index("--slab")] if "--slab" in args else args
    run(cases or ["70"], slabs)
    sys.exit(0)
