"""Context parallelism on Hugging Face LLaMA (issue 17): is the explicit mask proven causal, which sequence layout
does the search keep, and what does searching the layout cost?

Run: ``OMP_NUM_THREADS=1 python -m benchmarks.context_hf``

For each case the model is captured once (the causal-mask proof runs inside capture; its own CPU time is
printed), then planned with ``cp_layout="auto"`` (the layout searched: :mod:`autoshard.planner_layout`) and with
``"contiguous"`` (one solve, no layout search).  Printed: the plan's CP degree and layout, the layout prices the
search compared (the solver's objective per layout problem, and the balanced bound), the predicted step of both
plans, and planning CPU seconds (``time.process_time``) of both.  On this shared 2-core machine compare CPU
seconds, not wall time.
"""

from __future__ import annotations

import time

import torch

import autoshard
from autoshard import zoo
from autoshard.capture import capture
from autoshard.capture.causal import mark_causal_masks
from autoshard.runtime.verify import cluster_for

CASES = (  # name, zoo model, batch, seq, profile, devices, pins
    ("llama-tiny, 1024 tokens, 2 CPU ranks, free", "llama-tiny", 1, 1024, "cpu", 2, None),
    ("llama-tiny, 32 tokens, 4 CPU ranks, ring pinned", "llama-tiny", 1, 32, "cpu", 4, "ring"),
    ("LLaMA-3-8B, 8192 tokens, 8 x H100, ring pinned", "llama3-8b", 1, 8192, "h100x8", 8, "ring"),
)


def main() -> None:
    for title, name, batch, seq, profile, devices, pins in CASES:
        case = zoo.build(name, batch=batch, seq=seq, device="cpu" if profile == "cpu" else "meta")
        captured = capture(case.model, case.args)
        t0 = time.process_time()
        marked = mark_causal_masks(captured.graph_module)  # the proof again, timed alone
        proof = time.process_time() - t0
        cluster = cluster_for(profile, devices)
        annotations = {"model.layers.*.self_attn": pins} if pins else None
        plans, cpu = {}, {}
        for layout in ("auto", "contiguous"):
            t0 = time.process_time()
            plans[layout] = autoshard.plan(
                case.model, cluster, case.args, annotations=annotations, captured=captured, cp_layout=layout
            )
            cpu[layout] = time.process_time() - t0
        auto = plans["auto"]
        searched = next((n for n in auto.notes if "layout searched" in n), "no ring in the balanced bound")
        print(title)
        print(f"  masks proven causal: {marked} attention nodes in {proof * 1e3:.1f} ms CPU")
        print(f"  auto: {headline(auto)}, step {auto.predicted_step_time * 1e3:.3f} ms; {searched}")
        contiguous = plans["contiguous"]
        print(
            f"  contiguous pinned: {headline(contiguous)}, step {contiguous.predicted_step_time * 1e3:.3f} ms"
        )
        print(f"  planning CPU s: auto {cpu['auto']:.2f}, contiguous {cpu['contiguous']:.2f}")


def headline(plan: autoshard.Plan) -> str:
    cp = plan.degrees.get("cp")
    return f"CP {cp} ({plan.context_layout})" if cp else "no CP"


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
