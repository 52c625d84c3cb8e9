"""Pipeline stages at run time: each schedule's step time, exactness and traffic on 4 local gloo ranks.

``python -m benchmarks.pipeline_run [--family tp|dp] [--layers N] [--batch B] [--seq S] [--microbatches M]
[--steps K]`` plans a tiny LLaMA (float64) for one stage's 2 ranks (Megatron TP, or data parallel), gives it 2
pipeline stages (4 for the interleaved / zero-bubble schedules) on 4 ranks, runs every schedule torch ships
through :func:`autoshard.runtime.pipelining.build_pipeline`, and prints per schedule: the median wall time of
a training step (after one warm-up step), the largest gradient difference from the single-device model after
the first step, and the point-to-point and intra-stage collectives one step ran on the busiest rank.  The
single-device eager step time is printed for scale.  Not a timed test: figures depend on the machine's load.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import statistics
import time
from typing import Any

import torch
import torch.distributed.distributed_c10d as c10d
import torch.nn.functional as F

import autoshard
from autoshard import zoo
from autoshard.codegen import parallel_info
from autoshard.codegen.shard import gather_full
from autoshard.plans import PipelinePlan, PipelineStage, Plan
from autoshard.runtime.launch import launch
from autoshard.runtime.pipelining import SCHEDULES, build_pipeline, step
from autoshard.runtime.stages import StageBuild, prepare_stages
from autoshard.runtime.verify import cluster_for

MEGATRON = {
    **{f"*.{m}": "column" for m in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")},
    **{f"*.{m}": "row" for m in ("o_proj", "down_proj")},
}
BATCH_SPLIT = ((2, 1, 1), (1, 1))
FAMILIES: dict[str, dict[str, Any]] = {
    "tp": MEGATRON,
    "dp": {"input_ids": ("S(0)",), "*_proj": BATCH_SPLIT, "lm_head": BATCH_SPLIT},
}


def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten())


def _stages(layers: int, chunks: int, schedule: str) -> tuple[PipelineStage, ...]:
    per = layers // chunks
    groups = []
    for c in range(chunks):
        mods = tuple(f"model.layers.{i}" for i in range(c * per, (c + 1) * per))
        mods = (("model.embed_tokens",) if c == 0 else ()) + mods
        mods += ("model.norm", "lm_head") if c == chunks - 1 else ()
        groups.append(mods)
    row = (
        [c if c < 2 else 3 - c for c in range(chunks)]
        if schedule == "zb_v"
        else [c % 2 for c in range(chunks)]
    )
    return tuple(PipelineStage(c, g, None, ((0, 1), (2, 3))[row[c]]) for c, g in enumerate(groups))


def _rank(
    model: torch.nn.Module,
    plan: Plan,
    builds: tuple[StageBuild, ...],
    batches: list[Any],
    ref: dict[str, Any],
    sync_once: bool,
) -> dict[str, Any]:
    log: list[str] = []
    originals = {n: getattr(c10d, n) for n in ("isend", "irecv")}

    def wrap(name: str) -> Any:
        def recorded(tensor: torch.Tensor, *a: Any, **k: Any) -> Any:
            if tensor.is_floating_point():
                log.append(name)
            return originals[name](tensor, *a, **k)

        return recorded

    for name in originals:  # both names: P2POp checks the op against torch.distributed's
        setattr(c10d, name, wrap(name))
        setattr(torch.distributed, name, getattr(c10d, name))
    run = build_pipeline(
        model, plan, (batches[0][0],), loss_fn, stages=builds, record=True, sync_once=sync_once
    )
    opt = torch.optim.AdamW(run.parameters(), lr=1e-3)
    times, error = [], 0.0
    for i, (ids, labels) in enumerate(batches):
        opt.zero_grad()
        t0 = time.perf_counter()
        step(run, ids, labels)
        times.append(time.perf_counter() - t0)
        if i == 0:
            p2p, ran = len(log), sum(len(parallel_info(m).comm.log or ()) for m in run.modules)
            for m in run.modules:
                info = parallel_info(m)
                for a in info.attrs:
                    if a.kind == "parameter":
                        grad = m.get_parameter(a.fqn).grad
                        assert grad is not None
                        whole = gather_full(grad, a.spec, a.global_shape, info.comm)
                        error = max(error, float((whole - ref[a.fqn]).abs().max()))
        opt.step()
    return {"times": times[1:], "error": error, "p2p": p2p, "intra": ran}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", choices=sorted(FAMILIES), default="tp")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument(
        "--sync", choices=("once", "microbatch"), default="once", help="replicated gradients' all-reduce"
    )
    args = parser.parse_args()
    torch.manual_seed(0)
    case = zoo.build("llama-tiny", batch=args.batch, seq=args.seq, layers=args.layers)
    model, ids = case.model.to(torch.float64), case.args[0]
    gen = torch.Generator().manual_seed(1)
    draws = [torch.randint(0, 512, ids.shape, generator=gen) for _ in range(args.steps)]
    batches = [(b, torch.roll(b, -1, 1)) for b in draws]  # next-token labels
    reference = copy.deepcopy(model)
    t0 = time.perf_counter()
    loss_fn(reference(batches[0][0]).logits, batches[0][1]).backward()
    eager = time.perf_counter() - t0
    ref = {k: p.grad for k, p in reference.named_parameters()}
    intra = autoshard.plan(model, cluster_for("cpu", 2), (ids,), annotations=FAMILIES[args.family])
    print(
        f"LLaMA {args.layers} layers, hidden 64, batch {args.batch} x seq {args.seq}, {args.microbatches} "
        f"microbatches, 4 gloo ranks = 2 pipeline ranks x 2 ({args.family} inside a stage), float64, "
        f"gradient sync once per {'step' if args.sync == 'once' else 'microbatch'}"
    )
    print(f"single-device eager step {eager * 1e3:.1f} ms")
    print(
        f"{'schedule':<18}{'stages':>7}{'step ms':>10}{'max |grad diff|':>17}{'p2p/step':>10}{'intra/step':>12}"
        f"{'plan s':>8}"
    )
    cache: dict[int, tuple[StageBuild, ...]] = {}
    for schedule in SCHEDULES:
        chunks = 2 if schedule in ("gpipe", "1f1b") else 4
        stages = _stages(args.layers, chunks, schedule)
        plan = dataclasses.replace(
            intra, pipeline=PipelinePlan(stages, schedule, chunks // 2), microbatches=args.microbatches
        )
        t0 = time.perf_counter()
        if chunks not in cache:
            cache[chunks] = prepare_stages(model, plan, (ids,), FAMILIES[args.family])
        builds = tuple(
            dataclasses.replace(b, ranks=s.ranks) for b, s in zip(cache[chunks], stages, strict=True)
        )
        planned = time.perf_counter() - t0
        ranks = launch(_rank, 4, model, plan, builds, batches, ref, args.sync == "once", timeout=600)
        median = statistics.median(t for r in ranks for t in r["times"])
        print(
            f"{schedule:<18}{chunks:>7}{median * 1e3:>10.1f}{max(r['error'] for r in ranks):>17.1e}"
            f"{max(r['p2p'] for r in ranks):>10}{max(r['intra'] for r in ranks):>12}{planned:>8.1f}"
        )


if __name__ == "__main__":
    main()
