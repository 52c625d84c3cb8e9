"""autoshard's benchmark suite: one entry point, six sections, CSV + a markdown summary.

    python -m benchmarks             # full run, ~20 minutes on the 2-core dev VM, writes out/benchmarks/
    python -m benchmarks --write     # the same, recorded in results/ (the committed figures)
    python -m benchmarks --quick     # subset in under 3 minutes, writes out/benchmarks/quick/
    python -m benchmarks --only scaling --only quality

Sections, one module each (each returns :class:`~benchmarks.report.Table` records; nothing else writes files):

1. :mod:`~benchmarks.scaling`     planning time and peak RSS by model, devices, mesh and depth; problem size
                                   before/after the exact reductions
2. :mod:`~benchmarks.optimality`  the solver against brute force on random graphs; CP-SAT against the chain DP
3. :mod:`~benchmarks.quality`     autoshard's plan against hand plans (:mod:`~benchmarks.hand_plans`)
4. :mod:`~benchmarks.fidelity`    collective bus bandwidth against nccl-tests; 16 published training runs
5. :mod:`~benchmarks.runtime`     emitted module against DTensor (``runtime_vs_dtensor.py``) on gloo ranks
6. :mod:`~benchmarks.runtime`     emitted module against eager on one GPU (CPU stand-in without one); the
                                   H100 probe of ``gpu_probe.py``

Cases that measure time or memory run in fresh processes (:mod:`~benchmarks.isolate`), so each case's peak
RSS is its own.  :mod:`~benchmarks.report` holds the table record and the machine description.
"""
