"""CPU seconds of capture on the scale cases (issue 17): where ``autoshard.capture.capture`` spends its time.

Run: ``OMP_NUM_THREADS=1 python -m benchmarks.capture_scale [70|8 ...]`` (each case in a fresh process).

Per case: the first capture in the process (as ``benchmarks.plan_phases`` counts it: the planner imported,
torch.export's own modules not yet), then the best of ``repeats`` further captures, each split into the
planned 2-block export, the 3-block check export and the rest (cleaning, annotation, the causal-mask proof,
block labels).  The first capture pays torch.export's imports and its fake-tensor cache misses once per
process; the rest is autoshard's own work.  CPU time (``time.process_time``): wall time on the shared machine
says more about the load than about the code.  The cyclic collector is paused, as ``autoshard.plan`` pauses it
(:mod:`autoshard.gcpause`): a full pass over the freshly imported heap would land in the first capture (~0.2 s)
and say nothing about capture.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from benchmarks.isolate import run_isolated

__all__ = ["CASES", "capture_case", "run"]

CASES: dict[str, tuple[str, int, int]] = {
    "70": ("llama3-70b", 1024, 4096),  # as benchmarks.plan_phases: batch 1024 x 4096
    "8": ("llama3-8b", 64, 4096),
}


def capture_case(which: str, repeats: int = 4) -> dict[str, Any]:
    """Capture one case ``1 + repeats`` times in this (child) process; CPU seconds of each part."""
    import autoshard.capture.export as export
    import autoshard.planner  # noqa: F401  (imported before planning starts, as plan_phases does)
    from autoshard import zoo
    from autoshard.gcpause import paused_gc

    exports: list[float] = []
    plain = export._export

    def timed(*args: Any, **kwargs: Any) -> Any:
        c0 = time.process_time()
        try:
            return plain(*args, **kwargs)
        finally:
            exports.append(time.process_time() - c0)

    export._export = timed
    model, batch, seq = CASES[which]
    runs = []
    for _ in range(1 + repeats):
        case = zoo.build(model, batch=batch, seq=seq, device="meta")
        exports.clear()
        c0 = time.process_time()
        cap = paused_gc(export.capture)(case.model, case.args, case.kwargs)
        total = time.process_time() - c0
        planned, check = exports  # the 2-block shortcut with its 3-block check
        runs.append({"total": total, "planned": planned, "check": check, "rest": total - planned - check})
    best = min(runs[1:], key=lambda r: r["total"])
    return {"first": runs[0], "best": best, "blocks": str(cap.blocks), "notes": list(cap.notes)}


def _parts(r: dict[str, float]) -> str:
    split = f"planned export {r['planned']:.3f}, check export {r['check']:.3f}, rest {r['rest']:.3f}"
    return f"{r['total']:.3f} s ({split})"


def run(which: list[str], log: Any = print) -> list[dict[str, Any]]:
    rows = []
    for case in which:
        r = run_isolated("benchmarks.capture_scale:capture_case", {"which": case}, timeout=900)
        rows.append(r)
        if "error" in r:
            log(f"{case}: error {r['error'][:300]}")
            continue
        model, batch, seq = CASES[case]
        log(
            f"{model} batch {batch} x {seq}: first capture {_parts(r['first'])}; then best {_parts(r['best'])}"
        )
    return rows


if __name__ == "__main__":
    run(sys.argv[1:] or list(CASES))
    sys.exit(0)
