"""autoshard's plan against the hand-written plans people use, under the same cost model.

    python benchmarks/hand_plans.py [--quick]

Hand plans are written as parameter placements (annotations); everything else about them (how activations
flow between the pinned weights) is left to the planner, which makes each baseline the *best* version of
that hand plan.  The ratio autoshard / hand plan must be <= 1.00; a hand plan that cannot be expressed on a
model (a dim that does not divide) or does not fit in memory is reported as such, not silently dropped.

Plans:
  data parallel   every parameter replicated, batch split (gradient all-reduce)
  fsdp            every matrix sharded on dim 0 over all axes (ZeRO-3: all-gather forward, reduce-scatter back)
  megatron tp     column -> row on the last (intra-node) axis: attention by heads, MLP column -> row,
                  vocabulary-parallel embedding and head; replicated on the other axes
  tp x dp         megatron on the intra-node axis, batch split on the inter-node axis (2-D meshes)
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import autoshard
from autoshard import zoo

# Linear/Conv1D layouts differ: HF GPT-2 uses Conv1D with weight [in, out], LLaMA nn.Linear with [out, in].
COLUMN = {"gpt2": "S(1)", "llama": "S(0)"}
ROW = {"gpt2": "S(0)", "llama": "S(1)"}
COLUMN_MODULES = {
    "gpt2": ["*.attn.c_attn", "*.mlp.c_fc"],
    "llama": ["*.q_proj", "*.k_proj", "*.v_proj", "*.gate_proj", "*.up_proj"],
}
ROW_MODULES = {"gpt2": ["*.attn.c_proj", "*.mlp.c_proj"], "llama": ["*.o_proj", "*.down_proj"]}
VOCAB = {"gpt2": ["transformer.wte.weight"], "llama": ["model.embed_tokens.weight", "lm_head.weight"]}


def _on_axis(placement: str, ndim: int, axis: int) -> tuple[str, ...]:
    return tuple(placement if a == axis else "R" for a in range(ndim))


def _fsdp(model: Any, mesh: tuple[int, ...]) -> dict[str, Any]:
    """Every matrix split over all devices on the first dim that divides (ZeRO-3), vectors replicated."""
    devices = 1
    for n in mesh:
        devices *= n
    plan: dict[str, Any] = {}
    for fqn, param in model.named_parameters():
        dims = [d for d, size in enumerate(param.shape) if size % devices == 0] if param.dim() >= 2 else []
        plan[fqn] = (f"S({dims[0]})",) * len(mesh) if dims else ("R",) * len(mesh)
    return plan


def hand_plans(family: str, model: Any, mesh: tuple[int, ...], input_name: str) -> dict[str, dict[str, Any]]:
    ndim = len(mesh)
    last = ndim - 1
    megatron: dict[str, Any] = {}
    for pattern in COLUMN_MODULES[family]:
        megatron[pattern + ".weight"] = _on_axis(COLUMN[family], ndim, last)
    for pattern in ROW_MODULES[family]:
        megatron[pattern + ".weight"] = _on_axis(ROW[family], ndim, last)
    shapes = {fqn: tuple(p.shape) for fqn, p in model.named_parameters()}
    for name in VOCAB[family]:
        # Megatron pads the vocabulary to a multiple of the TP degree; without padding it stays replicated
        divides = name in shapes and shapes[name][0] % mesh[last] == 0
        megatron[name] = _on_axis("S(0)" if divides else "R", ndim, last)
    replicated = {fqn: ("R",) * ndim for fqn, _ in model.named_parameters()}
    plans: dict[str, dict[str, Any]] = {
        "data parallel": {**replicated, input_name: ("S(0)",) + ("R",) * (ndim - 1)},
        "fsdp": _fsdp(model, mesh),
        "megatron tp": {**megatron, input_name: ("R",) * ndim},
    }
    if ndim == 2:
        plans["tp x dp"] = {**megatron, input_name: ("S(0)", "R")}
    return plans


CASES = [
    # (zoo name, family, batch, seq, profile, nodes, mesh)
    ("gpt2", "gpt2", 8, 1024, "a100x8", 1, (8,)),
    ("gpt2-xl", "gpt2", 16, 1024, "a100x8", 1, (8,)),
    ("gpt2-xl", "gpt2", 32, 1024, "h100x8", 2, (2, 8)),
    ("llama3-8b", "llama", 64, 4096, "a100x8", 8, (8, 8)),
    ("llama3-8b", "llama", 16, 4096, "h100x8", 2, (2, 8)),
    ("llama3-70b", "llama", 256, 4096, "h100x8", 32, (32, 8)),
]


def run(case: tuple, quick: bool) -> list[str]:
    name, family, batch, seq, profile, nodes, mesh = case
    model_case = zoo.build(name, batch=batch, seq=seq, device="meta")
    cluster = autoshard.load_cluster(profile, nodes=nodes, mesh=mesh)
    t0 = time.perf_counter()
    best = autoshard.plan(model_case.model, cluster, model_case.args, model_case.kwargs)
    seconds = time.perf_counter() - t0
    rows = [
        f"| {name} | {profile} x{nodes} {mesh} | autoshard | {best.predicted_step_time:.4f} | "
        f"{best.memory_per_device / 2**30:.1f} | 1.00 | planned in {seconds:.1f} s, "
        f"{'optimal' if best.solver.optimal else f'gap {best.solver.gap:.2%}'} |"
    ]
    input_name = next(iter(best.input_placements))
    for label, pins in hand_plans(family, model_case.model, mesh, input_name).items():
        try:
            hand = autoshard.plan(
                model_case.model, cluster, model_case.args, model_case.kwargs, annotations=pins
            )
        except autoshard.AutoshardError as e:
            rows.append(
                f"| {name} | {profile} x{nodes} {mesh} | {label} | - | - | - | {str(e).splitlines()[0][:90]} |"
            )
            continue
        ratio = best.predicted_step_time / hand.predicted_step_time
        rows.append(
            f"| {name} | {profile} x{nodes} {mesh} | {label} | {hand.predicted_step_time:.4f} | "
            f"{hand.memory_per_device / 2**30:.1f} | {ratio:.2f} | |"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="only the GPT-2 cases")
    args = parser.parse_args()
    print("| model | cluster | plan | step time (s) | memory/device (GiB) | autoshard / plan | note |")
    print("|---|---|---|---|---|---|---|")
    for case in CASES:
        if args.quick and case[1] != "gpt2":
            continue
        for row in run(case, args.quick):
            print(row, flush=True)


if __name__ == "__main__":
    main()
