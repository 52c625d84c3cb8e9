"""Op by op: what the cost model prices for one single-GPU training step against what torch.profiler measured.

    python -m benchmarks.gpu_ops [MODEL ...]     # here, on the CPU; default: the four profiled cases

For each case of ``benchmarks.gpu_step.OPS_CASES`` (the ones recorded op by op on the H100): ``autoshard.plan``
on one ``h100x8`` device, every node's priced seconds (forward + backward + optimizer, ``Plan.nodes``) summed by
op, against the self CUDA time of each aten op in ``results/gpu_step_ops_<model>[_<recipe>].txt`` (backward
kernels are listed under the forward op's name there, as they are here).  Rows by op class; the loss after
the logits is priced on the last linear layer's node and shown as its own row.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from benchmarks.gpu_step import OPS_CASES, RESULTS

__all__ = ["OP_CLASSES", "measured_ops", "op_class", "predicted_ops"]

OP_CLASSES = {  # op class: aten op names (the profiler's and the captured graph's)
    "gemm": ("mm", "addmm", "linear", "matmul", "bmm", "baddbmm"),
    "attention": ("_cudnn_attention_forward", "_cudnn_attention_backward", "scaled_dot_product_attention"),
    "loss": ("_log_softmax", "_log_softmax_backward_data", "nll_loss_forward", "nll_loss_backward", "loss"),
    "optimizer": ("_fused_adamw_", "optimizer", "_foreach_add_"),
    "casts/copies": ("copy_", "_to_copy", "to", "type_as", "contiguous", "clone", "cat", "Memcpy"),
    "norms": ("native_layer_norm", "native_layer_norm_backward", "layer_norm", "pow", "mean", "rsqrt"),
    "mul/div": ("mul", "div"),
    "add (incl. grad accumulation)": ("add", "add_", "sub"),
    "reductions": ("sum",),
}


def op_class(op: str) -> str:
    """The class of an aten op name (``aten::`` prefix and overload stripped)."""
    return next((c for c, ops in OP_CLASSES.items() if op in ops), "other elementwise")


def measured_ops(path: Path) -> dict[str, float]:
    """Self CUDA ms per aten op of a profiled step (the first table of a ``gpu_step_ops_*.txt``)."""
    out: dict[str, float] = {}
    for line in path.read_text().splitlines():
        cols = re.split(r"\s{2,}", line.strip())
        if line.startswith("aten ops by input shapes"):
            break  # the first table only
        if len(cols) < 11 or not cols[0].startswith(("aten::", "Memcpy")):
            continue
        value = cols[6]
        scale = {"us": 1e-3, "ms": 1.0}.get(value[-2:], 1e3)
        out[cols[0].removeprefix("aten::").split(" ")[0]] = float(value.rstrip("mus")) * scale
    return out


def predicted_ops(model: str, batch: int, seq: int, recompute: str, recipe: str = "bf16") -> dict[str, Any]:
    """Priced ms per op of one case (child process: captures and plans)."""
    import torch

    import autoshard
    from autoshard.problem.hidden_ops import GRAD_FILL_BYTES, LOG_SOFTMAX_BYTES, UPCAST_BYTES
    from autoshard.runtime.verify import cluster_for
    from benchmarks.gpu_step import build

    net, ids = build(model, batch, seq, "meta", torch.bfloat16)
    net.train()
    cluster = cluster_for("h100x8", 1)
    how: Any = {"recompute": recompute, "precision": recipe}  # the planner's Literal keywords
    plan = autoshard.plan(net, cluster, (ids,), memory_limit=float("inf"), **how)
    ops: dict[str, float] = {}
    for row in plan.nodes:
        parts = row.target.split(".")
        op = "optimizer" if row.target == "placeholder" else parts[1] if len(parts) > 2 else parts[-1]
        ops[op] = ops.get(op, 0.0) + row.compute_seconds * 1e3
    logits = batch * seq * net.config.vocab_size
    forward = logits * (UPCAST_BYTES + LOG_SOFTMAX_BYTES)  # as hidden_ops prices the loss of bf16 logits
    backward = logits * (2 + 4 + GRAD_FILL_BYTES + LOG_SOFTMAX_BYTES)
    loss = (
        cluster.compute_time(0.0, forward, "float32") + cluster.compute_time(0.0, backward, "float32")
    ) * 1e3
    ops["linear" if "linear" in ops else "mm"] -= loss
    ops["loss"] = loss
    return {"ops": ops, "step_ms": plan.predicted_step_time * 1e3}


def main(argv: list[str]) -> None:
    from benchmarks.isolate import run_isolated

    recipe = "amp" if "--amp" in argv else "bf16"
    models = [a for a in argv if not a.startswith("--")]
    for case in OPS_CASES:
        if models and case.model not in models:
            continue
        kwargs = {"model": case.model, "batch": case.batch, "seq": case.seq, "recompute": case.recompute}
        got = run_isolated("benchmarks.gpu_ops:predicted_ops", {**kwargs, "recipe": recipe}, timeout=1200)
        suffix = "" if recipe == "bf16" else f"_{recipe}"
        measured = measured_ops(RESULTS / f"gpu_step_ops_{case.model}{suffix}.txt")
        classes: dict[str, list[float]] = {}
        for op, ms in got.get("ops", {}).items():
            classes.setdefault(op_class(op), [0.0, 0.0])[0] += ms
        for op, ms in measured.items():
            classes.setdefault(op_class(op), [0.0, 0.0])[1] += ms
        print(f"\n{case.key} {recipe}: step priced {got.get('step_ms', float('nan')):.1f} ms")
        print(f"{'class':32s} {'priced ms':>10s} {'measured':>10s}")
        for name, (p, m) in sorted(classes.items(), key=lambda kv: -kv[1][1]):
            print(f"{name:32s} {p:10.2f} {m:10.2f}")
        print(
            f"{'sum':32s} {sum(v[0] for v in classes.values()):10.2f} {sum(v[1] for v in classes.values()):10.2f}"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
