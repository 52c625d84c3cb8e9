"""Section 3, plan quality: autoshard's plan against the hand plans people write, under the same cost model.

For each case (model, hardware profile, mesh, global batch) the child process captures the model once and
solves autoshard's unconstrained problem and every applicable hand plan of :mod:`benchmarks.hand_plans`
(data parallel, FSDP, Megatron TP, TP x DP, TP x FSDP) on the same priced problem.  The ratio autoshard / hand
plan must be <= 1.00: a hand plan is the same problem with fewer strategies allowed.  A hand plan that
cannot be expressed (a dim that does not divide) or fits in no memory even with full recomputation is
reported as such.  Outside ``--quick`` the child also runs :func:`autoshard.plan` itself and checks that the
public entry point predicts the same step time.
"""

from __future__ import annotations

import math
from typing import Any

from benchmarks.isolate import run_isolated
from benchmarks.report import Table

__all__ = ["CASES", "quality_case", "run"]

CASES: tuple[tuple[str, str, int, int, str, tuple[int, ...]], ...] = (
    # zoo name, family, global batch, seq, profile, mesh (nodes of 8 follow from it)
    ("gpt2", "gpt2", 8, 1024, "a100x8", (8,)),
    ("gpt2-medium", "gpt2", 8, 1024, "a100x8", (8,)),
    ("gpt2-large", "gpt2", 8, 1024, "a100x8", (8,)),
    ("gpt2-xl", "gpt2", 16, 1024, "a100x8", (8,)),
    ("gpt2-xl", "gpt2", 32, 1024, "h100x8", (2, 8)),
    ("llama3-8b", "llama", 8, 4096, "a100x8", (8,)),
    ("llama3-8b", "llama", 16, 4096, "h100x8", (2, 8)),
    ("llama3-8b", "llama", 64, 4096, "a100x8", (8, 8)),
    ("llama3-70b", "llama", 64, 4096, "a100x8", (8, 8)),
    ("llama3-70b", "llama", 256, 4096, "h100x8", (32, 8)),
)
QUICK_CASES = (CASES[6],)


def quality_case(
    model: str, family: str, batch: int, seq: int, profile: str, mesh: list[int], check_public: bool
) -> dict[str, Any]:
    """Autoshard and every hand plan on one case (child process)."""
    import torch

    import autoshard
    from autoshard import zoo
    from autoshard.errors import InfeasibleError
    from benchmarks.hand_plans import FAMILIES, CasePlanner, HandPlanError, plans_for_mesh

    case = zoo.build(model, batch=batch, seq=seq, device="meta", dtype=torch.bfloat16)
    cluster = autoshard.load_cluster(profile, nodes=max(1, math.prod(mesh) // 8), mesh=tuple(mesh))
    planner = CasePlanner(case.model, cluster, case.args, case.kwargs)
    rows: list[dict[str, Any]] = []

    def record(name: str, plan: Any) -> None:
        rows.append(
            {
                "plan": name,
                "step_s": plan.predicted_step_time,
                "comm_s": plan.communication_time,
                "memory_gib": plan.memory_per_device / 2**30,
                "recompute": any("recomputation" in n for n in plan.notes),
            }
        )

    try:
        best = planner.plan(None)
    except InfeasibleError as e:
        return {"rows": [{"plan": "autoshard", "error": "no fit", "why": str(e).splitlines()[0]}]}
    record("autoshard", best)
    for name, roles in plans_for_mesh(len(mesh)).items():
        try:
            record(name, planner.plan(roles, FAMILIES[family]))
        except HandPlanError as e:
            rows.append({"plan": name, "error": "not expressible", "why": str(e)})
        except InfeasibleError as e:  # not even with full recomputation
            rows.append({"plan": name, "error": "no fit", "why": str(e).splitlines()[0]})
    public = None
    if check_public:
        public = autoshard.plan(case.model, cluster, case.args, case.kwargs).predicted_step_time
    return {"rows": rows, "public_step_s": public}


def run(quick: bool, log: Any = print) -> list[Table]:
    table_rows: list[tuple[Any, ...]] = []
    notes: list[str] = []
    worst = 0.0
    for model, family, batch, seq, profile, mesh in QUICK_CASES if quick else CASES:
        r = run_isolated(
            "benchmarks.quality:quality_case",
            {
                "model": model,
                "family": family,
                "batch": batch,
                "seq": seq,
                "profile": profile,
                "mesh": list(mesh),
                "check_public": not quick,
            },
        )
        log(f"  quality {model} {profile} {mesh}: {'error' if 'error' in r else 'ok'}")
        cluster = f"{profile[:4]} {'x'.join(map(str, mesh))}"
        if "error" in r:
            table_rows.append((model, cluster, batch, "all", None, None, None, "error"))
            notes.append(f"{model} on {cluster} failed: {r['error'][:200]}")
            continue
        rows = r["rows"]
        best = next((x for x in rows if x["plan"] == "autoshard" and "error" not in x), None)
        for x in rows:
            if "error" in x:
                table_rows.append((model, cluster, batch, x["plan"], None, None, None, x["error"]))
                if x["error"] == "not expressible":
                    notes.append(f"{model} on {cluster}, {x['plan']}: {x['why'][:160]}")
                continue
            ratio = best["step_s"] / x["step_s"] if best else None
            if ratio is not None and x["plan"] != "autoshard":
                worst = max(worst, ratio)
            note = "recompute" if x["recompute"] else ""
            ratio_text = None if ratio is None else f"{ratio:.3f}"
            table_rows.append(
                (model, cluster, batch, x["plan"], x["step_s"], x["memory_gib"], ratio_text, note)
            )
        public = r.get("public_step_s")
        if best is not None and public is not None and abs(public - best["step_s"]) > 1e-9 * best["step_s"]:
            notes.append(
                f"{model} on {cluster}: autoshard.plan predicts {public:.6f} s, here {best['step_s']:.6f} s"
            )
    notes = [
        f"largest autoshard / hand-plan ratio: {worst:.3f} (must be <= 1.000).",
        "Predicted seconds per training step (forward + backward + Adam) of the whole global batch, all models "
        "in bfloat16; memory: per device, against 80 GiB; Adam state is always sharded over all devices "
        "(ZeRO-1, the cost model's default), so 'data parallel' is DP + ZeRO-1.",
        "Hand plans pin the layout of every linear/embedding operand and of the weights' storage; norms, "
        "attention and the redistributions between them are chosen by the planner (the best completion of "
        "each hand plan).  'megatron tp' is shown on one-node meshes only; 2-D meshes get TP on the fast axis.",
        "GPT-2's fused c_attn weight split contiguously puts q, k and v of different heads on one rank; Megatron "
        "stores it permuted per head, which a placement cannot express, so GPT-2's TP baselines pay one "
        "all-to-all per layer each way that real Megatron does not.  GPT-2's vocabulary (50,257) does not "
        "divide by 8: its embedding stays replicated (Megatron pads it).",
        "cluster: profile and mesh (nodes of 8).  recompute: fits only with full activation recomputation "
        "(tried when nothing fits without, as autoshard.plan does); no fit: does not fit in 80 GiB even with it.",
        *notes,
    ]
    if not quick and not any("autoshard.plan predicts" in n or "failed" in n for n in notes):
        notes.append("autoshard.plan itself predicted the same step time as the autoshard row in every case.")
    if quick:
        notes.append(
            "--quick: one case; the full run covers GPT-2 124M-1.5B and LLaMA-3-8B/70B on A100 and H100."
        )
    columns = ("model", "cluster", "batch", "plan", "step s", "mem GiB", "ratio", "note")
    return [
        Table(
            "plan_quality",
            "autoshard against hand plans (predicted step time)",
            columns,
            table_rows,
            tuple(notes),
        )
    ]
