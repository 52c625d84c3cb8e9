"""From a plan to a training run: a Hugging Face causal LM from a config and a safetensors directory.

Four steps, each a subcommand (README, "From a plan to a training run")::

    python examples/train.py init  --model ckpt --preset llama-tiny             # config.json + model.safetensors
    python examples/train.py plan  --model ckpt --nproc 4 --mesh 2x2 --layout tp-dp --out plan.json
    python examples/train.py run --nproc 4 --model ckpt --plan plan.json --steps 5 --save dcp   # 4 local ranks
    python examples/train.py run --nproc 2 --model ckpt --plan plan2.json --resume dcp --steps 1
    python examples/train.py reference --model ckpt --steps 5                   # one process, same losses

``run`` builds the model on the ``meta`` device, so a rank never holds more than its shards: each rank reads
only its slices of the safetensors files (``SafetensorsWeights``), trains with AdamW whose state is sharded as
the plan priced (``ZeroOptimizer``: ZeRO-1 by default, ``--zero 2``; ``--zero 3`` with an FSDP plan also frees
gathered weights after use), on synthetic tokens (the same on every rank, seeded per step), prints the loss
and tokens/s of every step and the peak memory of every rank, and saves / resumes DCP checkpoints (any plan,
any world size).  ``--metrics FILE`` writes the same figures as JSON.  Started with ``python``, ``run`` checks
its input once and starts ``--nproc`` local ranks (default: as many as the plan needs) through torch's own
launcher (:func:`autoshard.runtime.local_job.run_local`, ``torchrun --standalone``): bad input ends in one line
and exit code 2 before any rank starts, a failed rank in one line naming its error; under ``torchrun`` (several
nodes) each rank checks the same, and torchrun adds its own failure report.  NCCL with CUDA, else gloo.

Layouts (``plan --layout``) for LLaMA-style models (``q_proj`` ... ``down_proj``): ``tp-dp`` (Megatron
column/row on the last mesh axis, batch over the first), ``fsdp`` (every projection and the LM head stored
split over all devices, gathered before use), ``auto`` (the planner decides).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

import torch

PRESETS: dict[str, dict[str, Any]] = {
    "llama-tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       intermediate_size=128, vocab_size=512),
    "llama-100m": dict(hidden_size=768, num_hidden_layers=8, num_attention_heads=12, num_key_value_heads=4,
                       intermediate_size=2048, vocab_size=32000),
    "llama-1b": dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                     intermediate_size=5632, vocab_size=32000),
}  # fmt: skip


def _config(directory: str) -> Any:
    import transformers

    return transformers.AutoConfig.from_pretrained(directory)


def _meta_model(directory: str) -> torch.nn.Module:
    import transformers

    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(_config(directory))


def _tokens(step: int, batch: int, seq: int, vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(1000 + step))


def cmd_init(args: argparse.Namespace) -> None:
    """Write ``config.json`` and the model's own init (seeded per module) as safetensors, shard by shard."""
    import transformers

    from autoshard.runtime.checkpoint import save_safetensors
    from autoshard.runtime.materialize import InitWeights

    config = transformers.LlamaConfig(**PRESETS[args.preset], tie_word_embeddings=False, use_cache=False)
    (out := Path(args.model)).mkdir(parents=True, exist_ok=True)
    config.save_pretrained(out)
    model = _meta_model(str(out))
    source = InitWeights(model, seed=args.seed)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name in model.state_dict():
        tensor = source.full(name).clone()
        if shards[-1] and size + tensor.numel() * tensor.element_size() > args.shard_bytes:
            save_safetensors(shards[-1], out / f"part-{len(shards)}.safetensors")
            shards[-1], size = {n: torch.empty(0) for n in shards[-1]}, 0
            shards.append({})
        shards[-1][name] = tensor
        size += tensor.numel() * tensor.element_size()
    save_safetensors(shards[-1], out / f"part-{len(shards)}.safetensors")
    weight_map = {n: f"part-{k + 1}.safetensors" for k, shard in enumerate(shards) for n in shard}
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    params = sum(p.numel() for p in model.parameters())
    print(f"wrote {out}: {params / 1e6:.1f} M parameters in {len(shards)} safetensors file(s)")


def _layout(kind: str, mesh: tuple[int, ...]) -> dict[str, Any] | None:
    if kind == "auto":
        return None
    columns, rows = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"), ("o_proj", "down_proj")
    if kind == "fsdp":  # weights stored split over every device, the batch split the same way
        split, n = tuple("S(0)" for _ in mesh), math.prod(mesh)
        ids = ("S(0)",) * len(mesh)
        return {"input_ids": ids, "labels": ids, "lm_head": ((n, 1, 1), (1, 1)), "lm_head.weight": split,
                **{f"*.{m}": ((n, 1, 1), (1, 1)) for m in (*columns, *rows)},
                **{f"*.{m}.weight": split for m in (*columns, *rows)}}  # fmt: skip
    # tp-dp (the parser allows no other): Megatron on the last axis, the batch split over the others
    rep: tuple[str, ...] = ("R",) * (len(mesh) - 1)
    split_batch: tuple[int, ...] = (*mesh[:-1], 1, 1)
    dp = ("S(0)",) * (len(mesh) - 1) + ("R",)
    return {"input_ids": dp, "labels": dp,
            **{f"*.{m}.weight": (*rep, "S(0)") for m in columns}, **{f"*.{m}.weight": (*rep, "S(1)") for m in rows},
            **{f"*.{m}": (split_batch,) for m in columns},
            **{f"*.{m}": ((*mesh[:-1], 1, mesh[-1]),) for m in rows}}  # fmt: skip


def cmd_plan(args: argparse.Namespace) -> None:
    """Plan the model on the meta device for ``--nproc`` devices and save the plan."""
    import autoshard
    from autoshard.report import Baseline, render
    from autoshard.runtime.verify import cluster_for

    mesh = args.mesh or (args.nproc,)
    model = _meta_model(args.model)
    ids = torch.zeros(args.batch, args.seq, dtype=torch.long, device="meta")
    cluster = cluster_for(args.profile, args.nproc, mesh)
    limit = args.memory_limit * 2**30 if args.memory_limit else None
    plan = autoshard.plan(
        model, cluster, (ids,), {"labels": ids}, annotations=_layout(args.layout, mesh), memory_limit=limit
    )
    plan.save(args.out)
    why = "not compared: train.py plan plans one layout (compare plans: `autoshard diff A.json B.json`)"
    print(render(plan, baseline=Baseline("data parallel", reason=why)))  # not summary(): its advice is Python
    print(f"saved {args.out}")


def _rss_bytes() -> int:
    """Peak resident memory of this process so far."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _rss_now() -> int:
    """Resident memory now (Linux ``/proc``): the baseline of imports before the model is built."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize()


def cmd_run(args: argparse.Namespace) -> None:
    """Train under torchrun with a saved plan (module doc), then close the process groups.

    Why the order matters: gloo runs each collective on a worker thread of its process group, and that thread
    drops the collective's tensors after ``wait()`` has returned.  If the last reference to such a tensor is
    the worker's when the interpreter finalises, freeing it needs the GIL, the thread is stopped inside a
    ``noexcept`` frame and the process aborts ("terminate called without an active exception").  Destroying a
    gloo group joins its workers -- only when its last reference goes, and the module, the optimizer and the
    last step's autograd graph (``ctx.comm``) hold the groups.  So training runs in its own frame, then
    ``destroy_process_group`` drops c10d's references: the workers are joined with the interpreter whole.
    """
    import gc

    import torch.distributed as dist

    import autoshard
    from autoshard.runtime.local_job import run_local

    if "LOCAL_RANK" not in os.environ:  # started with python: check once, then start the ranks (module doc)
        world = args.nproc or autoshard.load_plan(args.plan).num_devices
        check_run(args, world)
        raise SystemExit(run_local(world, [__file__, *args.argv]))
    check_run(args)
    _train(args)
    gc.collect()  # reference cycles (fx modules) that still hold a group
    dist.destroy_process_group()
    gc.collect()


def check_run(args: argparse.Namespace, world: int | None = None) -> None:
    """Refuse in one line, exit code 2, before any process group, what ``run`` cannot do: a plan for another
    model or rank count than the job's (``world``: ``--nproc`` in the launcher, else torchrun's ``WORLD_SIZE``),
    ``--zero 3`` (FSDP) with a plan storing no weight split and gathered, a plan without token ids."""
    import autoshard
    from autoshard.plan_model import check_built
    from autoshard.report.groups import PlanView
    from autoshard.report.roles import fsdp_axes
    from autoshard.runtime.local_job import fail

    plan = autoshard.load_plan(args.plan)
    plan_batch(plan)
    started = "torchrun started" if world is None else "--nproc asks for"
    world = int(os.environ.get("WORLD_SIZE", "1")) if world is None else world
    again = f"train.py plan --model {args.model} --nproc {world} --out PLAN.json"
    check_built(plan, args.model, _meta_model(args.model), scaled=False, path=args.plan, replan=again,
                model_required=True)  # fmt: skip
    mesh = "x".join(map(str, plan.mesh_shape))
    problem = ""
    nproc = getattr(args, "nproc", 0)
    if started == "torchrun started" and nproc and nproc != world:
        problem = f"--nproc {nproc} under torchrun, which started {world} ranks: leave --nproc out (torchrun decides)"
    elif plan.num_devices != world:
        use = "--nproc_per_node" if started == "torchrun started" else "--nproc"
        problem = (
            f"the plan {args.plan} needs {plan.num_devices} ranks (mesh {mesh}), {started} {world}: use "
            f"{use} {plan.num_devices}, or re-plan with `train.py plan --nproc {world}`"
        )
    elif args.zero == 3 and not fsdp_axes(PlanView.of(plan)):
        problem = (
            f"--zero 3 frees weights gathered before use (FSDP), but the plan {args.plan} (mesh {mesh}) stores "
            "no weight split and gathered: use --zero 1 or 2 (optimizer state, and gradients, sharded over the "
            "data axes), or plan with --layout fsdp"
        )
    if problem:
        fail(f"train.py run: error: {problem}")


def _train(args: argparse.Namespace) -> None:
    """Everything of ``run`` that holds a process group (module doc)."""
    import torch.distributed as dist

    import autoshard
    from autoshard.codegen import parallel_info, parallelize, shard_inputs
    from autoshard.report.labels import fmt_bytes
    from autoshard.runtime import init_from_env
    from autoshard.runtime.checkpoint import load_checkpoint, save_checkpoint
    from autoshard.runtime.materialize import InitWeights, SafetensorsWeights
    from autoshard.runtime.prefetch import prefetch_gathers
    from autoshard.runtime.reshard import reshard_after_forward
    from autoshard.runtime.zero import ZeroOptimizer

    device = init_from_env()
    rank, world = dist.get_rank(), dist.get_world_size()
    plan = autoshard.load_plan(args.plan)
    model = _meta_model(args.model)
    start_rss = _rss_now()  # imports, the process group and the model on meta: nothing of the weights yet
    batch, seq = plan_batch(plan)
    print(plan.recipe_note("train.py", "float32 weights without autocast") if rank == 0 else "", end="")
    ids = torch.zeros(batch, seq, dtype=torch.long, device="meta")
    has_weights = any(Path(args.model).glob("*.safetensors"))
    weights = SafetensorsWeights(args.model, model) if has_weights else InitWeights(model, args.seed)
    start = time.perf_counter()
    module = parallelize(
        model, plan, (ids,), {"labels": ids}, weights=weights, device=device, record=args.log
    )
    if args.zero == 3 and plan.overlap.reshard_after_forward:  # as the plan priced (Plan.overlap)
        reshard_after_forward(module)
    prefetch_gathers(module)  # FSDP gathers plan.overlap.prefetch layers ahead (nothing without FSDP)
    optimizer = ZeroOptimizer(
        module, torch.optim.AdamW, stage=args.zero, lr=args.lr, weight_decay=0.0, foreach=False
    )
    first = 0
    if args.resume:
        load_checkpoint(module, args.resume, optimizer)
        first = int(json.loads((Path(args.resume) / "autoshard-step.json").read_text())["next_step"])
    built, built_rss = time.perf_counter() - start, _rss_bytes()
    vocab = int(_config(args.model).vocab_size)
    losses, speeds = [], []
    for step in range(first, first + args.steps):
        tokens = _tokens(step, batch, seq, vocab)
        t0 = time.perf_counter()
        optimizer.zero_grad()
        local = [t.to(device) for t in shard_inputs(plan, tokens, labels=tokens)]
        loss = module(*local)[0]
        loss.backward()
        optimizer.step()
        seconds = time.perf_counter() - t0
        losses.append(float(loss.item()))
        speeds.append(batch * seq / seconds)
        if rank == 0:
            print(f"step {step}: loss {losses[-1]:.6f}  {speeds[-1]:.0f} tokens/s", flush=True)
    if args.save:
        save_checkpoint(module, args.save, optimizer)
        if rank == 0:
            (Path(args.save) / "autoshard-step.json").write_text(
                json.dumps({"next_step": first + args.steps})
            )
            print(f"saved checkpoint {args.save} (continue with --resume {args.save})")
    held = sum(p.numel() * p.element_size() for p in module.parameters())
    state = optimizer.state_elements() * 4
    mine = torch.tensor([_rss_bytes(), held, state, built_rss, start_rss], dtype=torch.float64)
    every = [torch.zeros(5, dtype=torch.float64) for _ in range(world)]
    dist.all_gather(every, mine)
    if rank == 0:
        full = sum(p.numel() * p.element_size() for p in model.parameters())
        print(f"built in {built:.1f} s; model {fmt_bytes(full)} of parameters")
        for r, (rss, params, optim, before, _) in enumerate(t.tolist() for t in every):
            print(f"rank {r}: peak RSS {fmt_bytes(rss)} ({fmt_bytes(before)} once built); parameters "
                  f"{fmt_bytes(params)}, optimizer state {fmt_bytes(optim)}")  # fmt: skip
        if args.metrics:
            counts = parallel_info(module).collective_counts()
            Path(args.metrics).write_text(json.dumps({
                "losses": losses, "tokens_per_s": speeds, "model_bytes": full, "collectives": counts,
                "ranks": [dict(zip(FIELDS, t.tolist(), strict=True)) for t in every],
            }, indent=1))  # fmt: skip


FIELDS = ("peak_rss", "params", "optimizer", "built_rss", "start_rss")


def plan_batch(plan: Any) -> tuple[int, int]:
    """The (batch, sequence) the plan was made for: shapes are baked into the graph."""
    if "input_ids" not in plan.input_shapes:
        from autoshard.runtime.local_job import fail

        fail(f"train.py run: error: the plan has no input_ids input ({list(plan.input_shapes)}): plan a causal "
             "LM with train.py plan")  # fmt: skip
    shape = plan.input_shapes["input_ids"][0]
    return int(shape[0]), int(shape[1])


def cmd_reference(args: argparse.Namespace) -> None:
    """The same training in one process, without autoshard: the losses ``run`` must reproduce."""
    import transformers

    start_rss = _rss_now()
    model = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    losses = []
    for step in range(args.steps):
        tokens = _tokens(step, args.batch, args.seq, int(model.config.vocab_size))
        optimizer.zero_grad()
        loss = model(tokens, labels=tokens).loss
        loss.backward()
        optimizer.step()
        losses.append(float(loss.item()))
        print(f"step {step}: loss {losses[-1]:.6f}", flush=True)
    print(f"peak RSS {_rss_bytes() / 2**20:.0f} MiB")
    if args.metrics:
        figures = {"losses": losses, "peak_rss": _rss_bytes(), "start_rss": start_rss}
        Path(args.metrics).write_text(json.dumps(figures))


def main(argv: list[str] | None = None) -> None:
    from autoshard.cli.args import OneLineParser, amount, positive, sizes  # usage errors: one line, exit 2

    parser = OneLineParser(prog="train.py", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    init = sub.add_parser("init", help="write config.json + safetensors of a preset")
    init.add_argument("--preset", choices=sorted(PRESETS), default="llama-tiny")
    init.add_argument("--shard-bytes", type=positive, default=1 << 30)
    plan = sub.add_parser("plan", help="plan on the meta device, save plan.json")
    plan.add_argument("--nproc", type=positive, required=True)
    plan.add_argument("--mesh", type=sizes, default=None, help="axis sizes, e.g. 2x2 (default: one axis)")
    plan.add_argument("--layout", choices=["auto", "fsdp", "tp-dp"], default="auto")
    plan.add_argument("--profile", default="cpu")
    plan.add_argument("--memory-limit", type=amount, help="GiB per device (default: the device's memory)")
    plan.add_argument("--out", default="plan.json")
    run = sub.add_parser("run", help="train under torchrun with a saved plan")
    run.add_argument("--plan", required=True)
    run.add_argument(
        "--nproc", type=positive, help="local ranks to start (default: the plan's; not torchrun)"
    )
    run.add_argument("--zero", type=int, choices=[1, 2, 3], default=1)
    run.add_argument("--save", default="")
    run.add_argument("--resume", default="")
    run.add_argument("--log", action="store_true", help="record every collective")
    ref = sub.add_parser("reference", help="the same training in one process")
    for p in (init, plan, run, ref):
        p.add_argument("--model", required=True, help="directory with config.json (+ *.safetensors)")
        p.add_argument("--seed", type=int, default=0)
    for p in (plan, ref):
        p.add_argument("--batch", type=positive, default=4)
        p.add_argument("--seq", type=positive, default=32)
    for p in (run, ref):
        p.add_argument("--steps", type=positive, default=5)
        p.add_argument("--lr", type=float, default=1e-3)
        p.add_argument("--metrics", default="", help="write the figures as JSON")
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # what `run` hands the ranks it starts
    command = {"init": cmd_init, "plan": cmd_plan, "run": cmd_run, "reference": cmd_reference}[args.command]
    from autoshard.errors import AutoshardError

    try:
        _check_paths(args)
        command(args)
    except AutoshardError as e:  # bad input (plan file, mesh, model): one line, exit 2, no traceback
        from autoshard.runtime.local_job import fail

        fail(f"train.py {args.command}: error: {e}")


def _check_paths(args: argparse.Namespace) -> None:
    """Paths the command reads, checked before anything loads (a missing model directory would otherwise be taken
    for a Hugging Face Hub id and fetched over the network)."""
    from autoshard.errors import AutoshardError

    if args.command != "init" and not (Path(args.model) / "config.json").is_file():
        raise AutoshardError(
            f"--model {args.model}: no config.json there; write one with `train.py init --model {args.model}`"
        )
    resume = getattr(args, "resume", "")
    for name in ("autoshard-step.json", ".metadata"):  # ours, and torch.distributed.checkpoint's
        if resume and not (Path(resume) / name).is_file():
            raise AutoshardError(
                f"--resume {resume}: not a checkpoint written by `train.py run --save` (no {name})"
            )


if __name__ == "__main__":
    from autoshard.runtime.local_job import worker  # a rank's exception is named in the launcher's last line

    worker(main)
