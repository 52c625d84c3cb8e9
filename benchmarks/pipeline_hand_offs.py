"""What the pipeline pricing charges for p2p sends, per schedule: ZB-V's turn is an in-memory hand-off.

``python -m benchmarks.pipeline_hand_offs`` plans LLaMA-tiny (4 layers, batch 8 x seq 8) on the ``cpu``
profile's mesh (2, 2) with 2 pipeline stages and 4 microbatches under ``zb_v``, ``interleaved_1f1b`` and
``1f1b``, and prints per schedule: the chunks, the p2p sends each pipeline rank makes per microbatch
(:func:`~autoshard.pipeline.schedules.chunk_sends`, the rule ``verify`` counts by), the predicted step and
communication time.  Before the turn was free, ZB-V charged its last rank 4 sends a microbatch, not 2
(step 6.0647 ms, communication 4.2621 ms at main 21a1f36; results/pipeline_hand_offs.txt).
"""

from __future__ import annotations

import time

import torch

import autoshard
from autoshard import zoo
from autoshard.pipeline.schedules import Schedule, chunk_sends, device_of_chunk
from autoshard.runtime.verify import cluster_for


def main() -> None:
    torch.manual_seed(0)
    case = zoo.build("llama-tiny", batch=8, seq=8, layers=4)
    print(
        f"{'schedule':<18}{'chunks':>7}{'sends/microbatch per rank':>27}{'step ms':>10}{'comm ms':>10}{'cpu s':>7}"
    )
    for name in ("zb_v", "interleaved_1f1b", "1f1b"):
        c0 = time.process_time()
        plan = autoshard.plan(
            case.model, cluster_for("cpu", 4, (2, 2)), case.args, pipeline=2, microbatches=4, schedule=name
        )
        assert plan.pipeline is not None
        chunks, degree, which = len(plan.pipeline.stages), plan.pipeline.degree, Schedule(name)
        sends = [0] * degree
        for c in range(chunks):
            sends[device_of_chunk(which, c, degree)] += sum(chunk_sends(which, c, chunks, degree))
        print(
            f"{name:<18}{chunks:>7}{sends!s:>27}{plan.predicted_step_time * 1e3:>10.4f}"
            f"{plan.communication_time * 1e3:>10.4f}{time.process_time() - c0:>7.2f}"
        )


if __name__ == "__main__":
    main()
