"""One redistribution per (tensor, layout): what it changes in plans, and what it costs the search.

Prints, with the fan-out nodes (the default) and without them (``MAX_FANOUT_STATES = 0``: every consumer
of a tensor pays its own redistribution, the pricing before issue 13):

- a LLaMA-3 layer (hidden 4096, 32 heads, 8 kv heads, FFN 14336, 1 x 4096 tokens) on 8 A100s with the
  linears pinned Megatron-style and the residual stream entering sequence-split: activation collectives
  forward / backward in the plan (Megatron-SP issues 4 / 4) and the predicted step;
- LLaMA-3-8B (zoo, 8 x 4096 tokens) on 64 A100s as an 8 x 8 mesh, free search: predicted step, seconds to
  build the problem and to solve it, and how many fan-out nodes the problem has.

Run: ``python -m benchmarks.fanout``.  Figures are this machine's (2 shared cores): compare the two
columns, not absolute seconds.
"""

from __future__ import annotations

import time
from collections import Counter

import torch
from torch import nn

import autoshard
import autoshard.search.fanout as fanout
from autoshard import zoo

__all__ = ["layer_case", "run"]


def _layer() -> nn.Module:
    import transformers

    cfg = transformers.LlamaConfig(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=1, num_attention_heads=32,
        num_key_value_heads=8, vocab_size=128, attention_dropout=0.0,
    )  # fmt: skip
    cfg._attn_implementation = "sdpa"
    llama = transformers.models.llama.modeling_llama

    class Layer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.rotary = llama.LlamaRotaryEmbedding(cfg)
            self.layer = llama.LlamaDecoderLayer(cfg, 0)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            pos = torch.arange(x.shape[1], device=x.device)[None]
            return self.layer(x, position_embeddings=self.rotary(x, pos), position_ids=pos)

    with torch.device("meta"):
        return Layer()


def layer_case() -> tuple[Counter[str], Counter[str], float]:
    """Activation collectives forward, backward, and the predicted step of the Megatron-SP layer."""
    pins = {
        "x": ("S(1)",),
        **{f"*.{m}": "column" for m in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")},
        **{f"*.{m}": "row" for m in ("o_proj", "down_proj")},
    }
    x = torch.randn(1, 4096, 4096, device="meta")
    plan = autoshard.plan(_layer(), autoshard.load_cluster("a100x8"), (x,), annotations=pins)
    act = [c for c in plan.collectives if c.node not in plan.param_placements]
    return (
        Counter(c.kind for c in act if c.phase == "forward"),
        Counter(c.kind for c in act if c.phase == "backward"),
        plan.predicted_step_time,
    )


def model_case() -> dict[str, float]:
    case = zoo.build("llama3-8b", device="meta")
    cluster = autoshard.load_cluster("a100x8", nodes=8, mesh=(8, 8))
    plan = autoshard.plan(case.model, cluster, case.args, case.kwargs)
    shared = sum(1 for n in plan.notes if "price one redistribution per layout" in n)
    return {
        "step_ms": plan.predicted_step_time * 1e3,
        "build_s": plan.timings.get("strategies_and_costs", 0.0),
        "solve_s": plan.timings.get("solve", 0.0),
        "unshared_groups": float(shared),
    }


def run() -> None:
    default = fanout.MAX_FANOUT_STATES
    rows = {}
    for label, states in (("one per (tensor, layout)", default), ("one per consumer", 0)):
        fanout.MAX_FANOUT_STATES = states
        try:
            start = time.perf_counter()
            rows[label] = (layer_case(), model_case(), time.perf_counter() - start)
        finally:
            fanout.MAX_FANOUT_STATES = default
    for label, ((fwd, bwd, step), model, _) in rows.items():
        print(f"{label}:")
        print(
            f"  LLaMA-3 layer, Megatron TP+SP pinned, 8 x A100: activation collectives forward {dict(fwd)} "
            f"({sum(fwd.values())}), backward {dict(bwd)} ({sum(bwd.values())}); step {step * 1e3:.3f} ms"
        )
        print(
            f"  LLaMA-3-8B, 8 x 8 A100, free search: step {model['step_ms']:.2f} ms, build "
            f"{model['build_s']:.2f} s, solve {model['solve_s']:.2f} s, groups left per consumer "
            f"{model['unshared_groups']:.0f}"
        )


if __name__ == "__main__":
    run()
