"""Pipeline parallelism, planning side: stages and microbatches searched jointly with intra-op sharding.

A tour, one module per step:

- :mod:`~autoshard.pipeline.options` — the pins (``pipeline``, ``microbatches``, ``schedule``, stage cuts
  through ``"stage"`` annotations) checked, with one-line errors;
- :mod:`~autoshard.pipeline.schedules` — GPipe, 1F1B, interleaved 1F1B, ZB-V and interleaved zero-bubble
  priced as pure functions: step time, bubble, microbatches in flight, p2p;
- :mod:`~autoshard.pipeline.stages` — the exact stage DP over cut points (table indices in its docstring);
- :mod:`~autoshard.pipeline.layers` — one intra-op solution split into one layer, ``pre`` and ``post``;
- :mod:`~autoshard.pipeline.search` — the loop over degrees, microbatch counts and recomputation, one
  intra-op solve per (sub-mesh, microbatch size, policy);
- :mod:`~autoshard.pipeline.assemble` — the winner as a :class:`~autoshard.plans.Plan` (degrees,
  microbatches, stages) and the report's headline.

Example::

    plan = autoshard.plan(model, load_cluster("a100x8", nodes=128, mesh=(128, 8)), (ids,),
                          pipeline="auto", microbatches="auto")
    print(plan.summary().splitlines()[0])   # PP 8 (interleaved, v=2) × TP 8 × DP 16, 96 microbatches of 1

No module here but ``search`` and ``assemble`` imports torch; ``schedules`` and ``stages`` are pure.
"""

from autoshard.pipeline.schedules import TORCH_CLASS, Schedule

__all__ = ["TORCH_CLASS", "Schedule"]
