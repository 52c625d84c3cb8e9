"""Step time of autoshard's emitted module against torch's DTensor tensor parallelism, same Megatron plan.

    python benchmarks/runtime_vs_dtensor.py [--nproc 4] [--steps 12] [--hidden 256] [--seq 64]

One LLaMA (zoo ``llama-tiny`` widened: 2 layers, GQA), ``nproc`` gloo ranks (forked), side by side in one run:

- autoshard: ``autoshard.plan`` forced to Megatron by annotations (q/k/v/gate/up column, o/down row, input,
  embedding and LM head replicated), then ``autoshard.parallelize``;
- DTensor, the torchtitan way: ``parallelize_module`` with ``ColwiseParallel`` / ``RowwiseParallel`` on the
  same projections of every decoder layer (local tensors between layers, as torchtitan's default).

A step is forward + backward of ``sum(logits * g)`` (no optimizer: both update the same local shards).  Both
must give the same loss; the script prints the median step time of each (rank 0, after a barrier, warm-up
steps dropped), their ratio (autoshard / DTensor; below 1 means autoshard is faster), and the collectives
each issues per step.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

import autoshard
from autoshard.codegen import parallel_info, parallelize, shard_inputs
from autoshard.runtime.launch import device_mesh, launch
from autoshard.runtime.verify import cluster_for

COLUMN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
ROW = ("o_proj", "down_proj")


def build(hidden: int, batch: int, seq: int) -> tuple[nn.Module, torch.Tensor]:
    import transformers

    torch.manual_seed(0)
    config: dict[str, Any] = {
        "hidden_size": hidden, "intermediate_size": 4 * hidden, "num_hidden_layers": 2, "num_attention_heads": 8,
        "num_key_value_heads": 4, "vocab_size": 512, "max_position_embeddings": max(512, seq), "use_cache": False,
        "attn_implementation": "sdpa", "bos_token_id": 0, "eos_token_id": 511,
    }  # fmt: skip
    cfg = transformers.LlamaConfig(**config)
    model = transformers.LlamaForCausalLM(cfg).eval()
    return model, torch.randint(0, 512, (batch, seq), generator=torch.Generator().manual_seed(1))


def megatron_annotations(n: int) -> dict[str, Any]:
    """Megatron by annotations: weights column / row, and the ops that use them pinned the same way."""
    pins: dict[str, Any] = {
        "input_ids": ("R",),
        "model.embed_tokens.weight": ("R",),
        "lm_head.weight": ("R",),
    }
    for name in COLUMN:
        pins[f"*.{name}"] = ((1, 1, 1), (n, 1))  # input replicated, weight rows (output features) split
    for name in ROW:
        pins[f"*.{name}"] = ((1, 1, n), (1, n))  # input split on features, weight columns split -> Partial
    pins["lm_head"] = ((1, 1, 1), (1, 1))
    return pins


def dtensor_tp(model: nn.Module, mesh: Any) -> nn.Module:
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        ParallelStyle,
        RowwiseParallel,
        parallelize_module,
    )

    layer_plan: dict[str, ParallelStyle] = {f"self_attn.{m}": ColwiseParallel() for m in COLUMN[:3]}
    layer_plan |= {"self_attn.o_proj": RowwiseParallel(), "mlp.down_proj": RowwiseParallel()}
    layer_plan |= {f"mlp.{m}": ColwiseParallel() for m in COLUMN[3:]}
    for layer in model.model.layers:  # type: ignore[union-attr]
        parallelize_module(layer, mesh, layer_plan)
    return model


def _time(step: Callable[[], torch.Tensor], steps: int, warmup: int) -> tuple[list[float], float]:
    times, loss = [], 0.0
    for i in range(warmup + steps):
        dist.barrier()
        start = time.perf_counter()
        loss = float(step())
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return times, loss


def _rank(model: nn.Module, ids: torch.Tensor, plan: Any, steps: int, warmup: int) -> dict[str, Any]:
    torch.manual_seed(0)
    ours = parallelize(model, plan, (ids,), record=True)
    local = shard_inputs(plan, ids)
    g = torch.randn(*ids.shape, 512, generator=torch.Generator().manual_seed(2))
    theirs = dtensor_tp(copy.deepcopy(model), device_mesh((dist.get_world_size(),)))

    def step_ours() -> torch.Tensor:
        out = ours(*local)
        loss = (out * g).sum()
        loss.backward()
        return loss.detach()

    def step_theirs() -> torch.Tensor:
        loss = (theirs(ids).logits * g).sum()
        loss.backward()
        return loss.detach()

    result: dict[str, Any] = {}
    for _ in range(2):  # interleave the two, twice, so that load on the machine hits both alike
        t_ours, loss_ours = _time(step_ours, steps // 2, warmup)
        t_theirs, loss_theirs = _time(step_theirs, steps // 2, warmup)
        result.setdefault("ours", []).extend(t_ours)
        result.setdefault("theirs", []).extend(t_theirs)
    result["loss"] = (loss_ours, loss_theirs)
    log = parallel_info(ours).comm.log
    assert log is not None
    log.clear()
    step_ours()
    result["collectives"] = Counter(f"{r.phase} {r.kind}" for r in log)
    result["dtensor_collectives"] = _dtensor_collectives(step_theirs)
    return result


def _dtensor_collectives(step: Callable[[], torch.Tensor]) -> dict[str, int]:
    """Collectives of one DTensor step, counted by torch's ``CommDebugMode``."""
    import warnings

    from torch.distributed.tensor.debug import CommDebugMode

    with CommDebugMode() as mode, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its module tracker's backward hooks warn about input-less modules
        step()
    return {str(op).split(".")[-1]: n for op, n in mode.get_comm_counts().items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, ids = build(args.hidden, args.batch, args.seq)
    plan = autoshard.plan(
        model, cluster_for("cpu", args.nproc), (ids,), annotations=megatron_annotations(args.nproc)
    )
    r = launch(_rank, args.nproc, model, ids, plan, args.steps, args.warmup, timeout=600)[0]
    ours, theirs = statistics.median(r["ours"]) * 1e3, statistics.median(r["theirs"]) * 1e3
    print(
        f"LLaMA {args.hidden}h x 2 layers (8 heads, 4 kv), batch {args.batch} x {args.seq}, {args.nproc} gloo ranks"
    )
    print(
        f"plan: {dict(plan.collective_counts('forward'))} forward, {dict(plan.collective_counts('backward'))} backward"
    )
    print(f"autoshard ran per step: {dict(r['collectives'])}")
    print(f"DTensor ran per step:   {r['dtensor_collectives']}")
    print(f"loss  autoshard {r['loss'][0]:.6f}   DTensor {r['loss'][1]:.6f}")
    print(f"median step (forward + backward) over {len(r['ours'])} steps:")
    print(f"  autoshard {ours:8.2f} ms   (min {min(r['ours']) * 1e3:.2f})")
    print(f"  DTensor   {theirs:8.2f} ms   (min {min(r['theirs']) * 1e3:.2f})")
    print(f"  ratio autoshard / DTensor = {ours / theirs:.2f}")


if __name__ == "__main__":
    main()
