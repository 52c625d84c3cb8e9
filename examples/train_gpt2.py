"""Train a small GPT-2 for a few steps under autoshard, and check every step against one process.

    torchrun --nproc_per_node 4 examples/train_gpt2.py                 # gloo on CPU (NCCL when CUDA is there)
    torchrun --nproc_per_node 4 examples/train_gpt2.py --plan megatron --steps 5
    torchrun --nproc_per_node 2 examples/train_gpt2.py --plan auto

Every rank builds the same model (fixed seed) and the same plan (planning is deterministic), parallelizes it,
and trains on the same token batches: the loss is computed inside the graph (``labels=``), so each rank's
module returns the global loss, replicated.  Rank 0 also trains an untouched copy in one process and prints
both losses per step; the script fails if they differ beyond float32 rounding.

Plans (``--plan``): ``dp`` splits the batch over all ranks (gradients all-reduced), ``megatron`` splits
attention and MLP weights (column / row), ``auto`` lets the planner choose (at this size it keeps most of
the model replicated).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.distributed as dist

import autoshard
from autoshard import zoo
from autoshard.cli.args import OneLineParser, positive
from autoshard.codegen import parallelize, shard_inputs
from autoshard.runtime import init_from_env
from autoshard.runtime.verify import cluster_for


def pins(kind: str, n: int) -> dict[str, Any] | None:
    """Pins that force the plan: GPT-2's Conv1D runs ``addmm(bias, x (tokens, in), weight (in, out))``."""
    if kind == "dp":
        split = {f"*.{m}": ((1,), (n, 1), (1, 1)) for m in ("c_attn", "c_proj", "c_fc")}
        return {"input_ids": ("S(0)",), "labels": ("S(0)",), **split, "lm_head": ((n, 1, 1), (1, 1))}
    if kind == "megatron":
        column, row = ((n,), (1, 1), (1, n)), ((1,), (1, n), (n, 1))
        return {"*.c_attn": column, "*.attn.c_proj": row, "*.c_fc": column, "*.mlp.c_proj": row}
    return None


def batches(steps: int, batch: int, seq: int, vocab: int) -> list[torch.Tensor]:
    """Two random batches, alternated: a model that learns shows a falling loss."""
    gen = torch.Generator().manual_seed(1234)
    pool = [torch.randint(0, vocab, (batch, seq), generator=gen) for _ in range(2)]
    return [pool[step % 2] for step in range(steps)]


def main() -> None:
    parser = OneLineParser(prog="train_gpt2.py", description=__doc__.split("\n")[0])  # usage errors: one line
    parser.add_argument("--plan", choices=["dp", "megatron", "auto"], default="dp")
    parser.add_argument("--steps", type=positive, default=5)
    parser.add_argument("--batch", type=positive, default=8)
    parser.add_argument("--seq", type=positive, default=32)
    parser.add_argument("--lr", type=float, default=1e-2)
    args = parser.parse_args()

    device = init_from_env()
    world, rank = dist.get_world_size(), dist.get_rank()
    case = zoo.build("gpt2-tiny", batch=args.batch, seq=args.seq)  # same weights everywhere (seeded)
    model, ids = case.model.train(), case.args[0]
    reference = copy.deepcopy(model) if rank == 0 else None

    cluster = cluster_for("cpu", world)
    plan = autoshard.plan(model, cluster, (ids,), {"labels": ids.clone()}, annotations=pins(args.plan, world))
    module = parallelize(model, plan, (ids,), {"labels": ids.clone()})
    if rank == 0:
        print(plan.summary(), "\n")
        print(f"{sum(p.numel() for p in module.parameters())} parameters on rank 0 "
              f"(the model has {sum(p.numel() for p in model.parameters())})\n")  # fmt: skip

    optimizer = torch.optim.AdamW(module.parameters(), lr=args.lr)
    ref_optimizer = torch.optim.AdamW(reference.parameters(), lr=args.lr) if reference is not None else None
    for step, tokens in enumerate(batches(args.steps, args.batch, args.seq, 512)):
        optimizer.zero_grad()
        local = [t.to(device) for t in shard_inputs(plan, tokens, labels=tokens)]
        loss = module(*local)[0]  # (loss, logits): the loss is replicated on every rank
        loss.backward()
        optimizer.step()
        if reference is not None and ref_optimizer is not None:
            ref_optimizer.zero_grad()
            ref_loss = reference(tokens, labels=tokens).loss
            ref_loss.backward()
            ref_optimizer.step()
            print(f"step {step}: loss {loss.item():.6f}  (single process {ref_loss.item():.6f})", flush=True)
            torch.testing.assert_close(loss.detach().cpu(), ref_loss.detach(), rtol=1e-4, atol=1e-5)
    if rank == 0:
        print("autoshard training matches single-process training")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
