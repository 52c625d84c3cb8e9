"""A Hugging Face mask proven causal, emitted as ``is_causal`` or as given: forward + backward on the CPU.

    OMP_NUM_THREADS=1 python -m benchmarks.causal_emitted

A HF LLaMA (``--hidden``, 64-dim heads, ``--layers``, fp32, batch × seq ids) is planned for one CPU device and
emitted by ``autoshard.parallelize`` on one gloo rank twice from the same capture: as planned (the proven mask
dropped, ``is_causal=True``: :mod:`autoshard.codegen.causal`) and with the proof removed (the explicit
``S × S`` mask, as before).  Printed per variant: median wall and CPU (``time.process_time``) milliseconds of a
forward + backward over ``--steps`` steps after 2 warm-ups, the emitted graph's node count, and the largest
logit difference against eager.  On the shared 2-core machine compare CPU milliseconds.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from typing import Any

__all__ = ["emitted_case"]


def emitted_case(hidden: int, layers: int, batch: int, seq: int, steps: int) -> dict[str, Any]:
    """Run on one gloo rank (``autoshard.runtime.launch``): both emitted variants and eager, timed."""
    import torch
    import transformers

    import autoshard
    from autoshard.capture import capture
    from autoshard.capture.meta import META_CAUSAL_MASK
    from autoshard.codegen import parallelize, shard_inputs
    from autoshard.runtime.verify import cluster_for

    config: Any = transformers.LlamaConfig(  # type: ignore[call-arg]
        hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers, num_attention_heads=hidden // 64,
        num_key_value_heads=hidden // 64, vocab_size=1024, max_position_embeddings=max(2048, seq), use_cache=False,
        attn_implementation="sdpa", bos_token_id=0, eos_token_id=1023,
    )  # fmt: skip
    torch.manual_seed(0)
    model: Any = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 1024, (batch, seq))
    plan = autoshard.plan(model, cluster_for("cpu", 1), (ids,))
    (local,) = shard_inputs(plan, ids)
    eager = copy.deepcopy(model)
    reference = eager(ids).logits.detach()

    def timed(forward: Any) -> dict[str, float]:
        wall, cpu, out = [], [], torch.empty(0)
        for i in range(steps + 2):
            w, c = time.perf_counter(), time.process_time()
            out = forward()
            out.sum().backward()
            if i >= 2:
                wall.append(time.perf_counter() - w)
                cpu.append(time.process_time() - c)
        diff = float((out.detach() - reference).abs().max())
        return {
            "wall_ms": 1e3 * statistics.median(wall),
            "cpu_ms": 1e3 * statistics.median(cpu),
            "diff": diff,
        }

    result: dict[str, Any] = {"plan": plan.summary().splitlines()[0]}
    for variant in ("is_causal", "explicit mask"):
        cap = capture(model, (ids,), blocks="full")
        if variant == "explicit mask":
            for node in cap.graph_module.graph.nodes:
                node.meta.pop(META_CAUSAL_MASK, None)
        emitted = parallelize(model, plan, (ids,), captured=cap)
        result[variant] = {**timed(lambda m=emitted: m(local)), "nodes": len(emitted.graph.nodes)}
    result["eager"] = {**timed(lambda: eager(ids).logits), "nodes": 0}
    return result


def main() -> None:
    from autoshard.runtime.launch import launch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=5)
    a = parser.parse_args()
    (r,) = launch(emitted_case, 1, a.hidden, a.layers, a.batch, a.seq, a.steps, timeout=900)
    print(f"LLaMA {a.hidden}h x{a.layers} fp32, batch {a.batch} x {a.seq}, forward + backward, 1 gloo rank")
    print(f"plan: {r['plan']}")
    for variant in ("is_causal", "explicit mask", "eager"):
        v = r[variant]
        nodes = f", {v['nodes']} graph nodes" if v["nodes"] else ""
        print(
            f"  {variant:13s}: {v['cpu_ms']:8.1f} ms CPU, {v['wall_ms']:8.1f} ms wall{nodes}; "
            f"max |logit - eager| {v['diff']:.2e}"
        )


if __name__ == "__main__":
    main()
