"""Section 4, fidelity: the cost model against published measurements.

- **collectives**: the bus bandwidth the collective model implies (``cost_models.collectives.bus_bandwidth``,
  8 GiB buffers as in nccl-tests' large-message end) against the nccl-tests points of REFERENCE.md.
- **published runs** (:mod:`benchmarks.fidelity_runs`: 16 measured training runs, Korthikanti et al. 2022
  Table 5 and torchtitan's published FSDP2 figures, each cited there): every run's configuration is pinned
  (degrees, micro-batches, recomputation) and its step predicted by :mod:`benchmarks.fidelity_model` from the
  cost model's functions (shape-aware GEMMs, fused attention, memory-bound ops, collectives, overlap, 1F1B
  composed analytically until the pipeline engineer's stage pricing lands).  Two A100 profile parameters,
  ``compute.efficiency_max`` and ``compute.attention_efficiency``, are *fitted* on the runs named in
  ``fidelity_runs.FIT`` (:func:`fit`; the bundled a100x8.json holds the result); every other run is held out.
- **memory**: Megatron's published first-stage memory (REFERENCE.md) against
  :mod:`cost_models.memory` (activations per layer, micro-batches in flight, precision policy).
- **planner cross-check**: the 22B run through the planner itself (Megatron TP forced on the captured graph of
  a Megatron-shaped GPT with unfused attention, :mod:`benchmarks.hand_plans`): the planner's per-op pricing
  against the same measurements.

    python -m benchmarks --only fidelity      # writes results/fidelity_*.csv and SUMMARY.md
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Literal

from benchmarks.fidelity_model import predict_memory, predict_step
from benchmarks.fidelity_runs import FIT, RUNS, Run
from benchmarks.isolate import run_isolated
from benchmarks.report import Table, percent
from cost_models.profile import HardwareProfile, load_profile

__all__ = ["CALIBRATION", "fit", "megatron_case", "memory_table", "nccl_points", "run", "runs_table"]

GiB = 2**30
BUFFER = 8 * GiB

# (label, profile, members per node, nodes, kind, published GB/s)
NCCL_POINTS = (
    ("8xA100, one node", "a100x8", 8, 1, "all_reduce", 230.0),
    ("2x DGX A100, 8x HDR", "a100x8", 8, 2, "all_reduce", 192.0),
    ("8xH100, NVLS", "h100x8", 8, 1, "all_reduce", 480.0),
    ("8xH100, NCCL ring", "h100x8", 8, 1, "all_reduce", 370.0),
    ("8xH100", "h100x8", 8, 1, "all_gather", 370.0),
    ("8xH100", "h100x8", 8, 1, "reduce_scatter", 370.0),
    ("8xH200", "h200x8", 8, 1, "all_reduce", 475.0),
)


def nccl_points() -> Table:
    import hardware_profiles
    from cost_models.collectives import CollectiveGroup, bus_bandwidth, choose_algorithm
    from cost_models.profile import load_profile

    bundled = set(hardware_profiles.bundled_profiles())
    rows: list[tuple[Any, ...]] = []
    for label, profile, k, m, kind, published in NCCL_POINTS:
        if profile not in bundled:
            rows.append((label, kind, profile, published, None, "n/a", "no profile"))
            continue
        prof = load_profile(profile)
        group = CollectiveGroup(members_per_node=k, nodes=m)
        predicted = bus_bandwidth(kind, BUFFER, group, prof) / 1e9
        algorithm = choose_algorithm(kind, BUFFER, group, prof).algorithm
        error = percent((predicted - published) / published, signed=True)
        rows.append((label, kind, profile, published, predicted, error, algorithm))
    notes = (
        "Bus bandwidth (nccl-tests convention, GB/s) of an 8 GiB buffer; published: nccl-tests large-message "
        "figures of REFERENCE.md (8xA100: ~230, 200-233 across vendors).  The profiles' in-node bus bandwidths "
        "and the A100 network efficiency (0.96) were *set from these very points* (their 'source' fields cite "
        "them), so agreement there checks the model's algebra (ring volume factors, latency terms, choice "
        "between ring and hierarchical across nodes), not an independent prediction.",
        "8xH100 ring all-reduce: the model has one all-reduce bandwidth per node type and assumes NCCL's default "
        "on H100, NVLink SHARP (480 GB/s); with NCCL_ALGO=Ring it overestimates by the error shown.",
        "8xH200: no h200x8 profile exists (n/a); its NVLink is the H100's, so the h100x8 figure (480) would "
        "predict it within 1%.",
    )
    columns = ("point", "collective", "profile", "published", "predicted", "error", "algorithm")
    return Table(
        "fidelity_nccl",
        "Collective bus bandwidth: cost model against nccl-tests (GB/s)",
        columns,
        rows,
        notes,
    )


# -- Megatron calibration ----------------------------------------------------------------------------------------
# name, heads, hidden, layers, GPUs, TP, PP, interleave v, global batch, measured full recompute s, selective s
CALIBRATION = (
    ("22B", 64, 6144, 48, 8, 8, 1, 1, 4, 1.42, 1.10),
    ("175B", 96, 12288, 96, 64, 8, 8, 3, 64, 18.13, 13.75),
    ("530B", 128, 20480, 105, 280, 8, 35, 3, 280, 49.05, 37.83),  # v = 3: inferred, fidelity_runs.py
    ("1T", 160, 25600, 128, 512, 8, 64, 1, 512, 94.42, 71.49),
)
SEQ, VOCAB = 2048, 51200
A100_PEAK = 312e12


def model_flops(batch: int, layers: int, hidden: int, recompute: bool) -> float:
    """FLOPs of one iteration (Narayanan et al., SC'21, as quoted in REFERENCE.md)."""
    s, h, v, lay = SEQ, hidden, VOCAB, layers
    if recompute:
        return 96 * batch * s * lay * h * h * (1 + s / (6 * h) + v / (16 * lay * h))
    return 72 * batch * s * lay * h * h * (1 + s / (6 * h) + v / (12 * lay * h))


def _gpt_module(hidden: int, heads: int, layers: int) -> Any:
    """A Megatron-shaped GPT on the meta device, bfloat16 (class defined here to keep torch out of import)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Attention(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q, self.k, self.v = (nn.Linear(hidden, hidden) for _ in range(3))
            self.proj = nn.Linear(hidden, hidden)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, s, _ = x.shape

            def heads_of(t: torch.Tensor) -> torch.Tensor:
                return t.view(b, s, heads, hidden // heads).transpose(1, 2)  # (B, a, S, d)

            # Megatron 2022's unfused attention: QK^T and ·V as batched GEMMs over the full S x S scores,
            # a fused scale-mask-softmax between them (one memory-bound op here)
            q, k, v = heads_of(self.q(x)), heads_of(self.k(x)), heads_of(self.v(x))
            scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(hidden // heads)  # (B, a, S, S)
            causal = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
            probs = torch.softmax(scores.masked_fill(causal, float("-inf")), dim=-1)
            y = torch.matmul(probs, v)  # (B, a, S, d)
            return self.proj(y.transpose(1, 2).reshape(b, s, hidden))

    class Mlp(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc, self.out = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.out(F.gelu(self.fc(x)))

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln_1, self.attn = nn.LayerNorm(hidden), Attention()
            self.ln_2, self.mlp = nn.LayerNorm(hidden), Mlp()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class MegatronGPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wte, self.wpe = nn.Embedding(VOCAB, hidden), nn.Embedding(SEQ, hidden)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln_f = nn.LayerNorm(hidden)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            pos = torch.arange(ids.shape[1], device=ids.device)
            x = self.wte(ids) + self.wpe(pos)
            for block in self.blocks:
                x = block(x)
            return F.linear(self.ln_f(x), self.wte.weight)  # (B, S, V) logits, head tied to the embedding

    with torch.device("meta"):
        return MegatronGPT().to(torch.bfloat16)


def megatron_case(heads: int, hidden: int, layers: int, tp: int, pp: int, batch: int) -> dict[str, Any]:
    """One pipeline stage (layers / pp decoder layers, embedding and head) planned with Megatron TP forced,
    with and without full recomputation (child process)."""
    import torch

    import autoshard
    from benchmarks.hand_plans import CasePlanner, Family

    family = Family(
        ("*.attn.q", "*.attn.k", "*.attn.v", "*.mlp.fc"), ("*.attn.proj", "*.mlp.out"), ("wte.weight",), 0
    )
    model = _gpt_module(hidden, heads, layers // pp)
    ids = torch.zeros((batch, SEQ), dtype=torch.long, device="meta")
    cluster = autoshard.load_cluster("a100x8", nodes=1, mesh=(tp,))
    planner = CasePlanner(model, cluster, (ids,), memory_limit=float("inf"))
    out: dict[str, Any] = {}
    policies: tuple[Literal["full", "none"], ...] = ("full", "none")
    for policy in policies:
        plan = planner.plan(("tp",), family, recompute=policy)
        out[policy] = {
            "step_s": plan.predicted_step_time,
            "compute_s": plan.compute_time,
            "comm_s": plan.communication_time,
            "counts": {k: v for k, v in plan.collective_counts("forward").items()},
        }
    return out


def with_parameters(profile: HardwareProfile, efficiency_max: float, attention: float) -> HardwareProfile:
    """``profile`` with the two fitted compute parameters replaced."""
    compute = dataclasses.replace(
        profile.compute, efficiency_max=efficiency_max, attention_efficiency=attention
    )
    return dataclasses.replace(profile, compute=compute)


def _error(run: Run, profile: HardwareProfile) -> float:
    return predict_step(run, profile) / run.step_seconds - 1


def fit(profile: HardwareProfile, keys: tuple[str, ...] = FIT) -> tuple[float, float, float]:
    """Grid search (steps of 0.01 / 0.02) of (efficiency_max, attention_efficiency) minimising the mean
    |error| on the runs ``keys``; returns (efficiency_max, attention_efficiency, mean |error|)."""
    runs = [r for r in RUNS if r.key in keys]
    best = (math.inf, 0.0, 0.0)
    for e in range(60, 96):
        for a in range(20, 81, 2):
            candidate = with_parameters(profile, e / 100, a / 100)
            mean = sum(abs(_error(r, candidate)) for r in runs) / len(runs)
            if mean < best[0] - 1e-12:
                best = (mean, e / 100, a / 100)
    return best[1], best[2], best[0]


def runs_table(profile_name: str = "a100x8") -> Table:
    profile = load_profile(profile_name)
    rows: list[tuple[Any, ...]] = []
    held: list[float] = []
    fitted: list[float] = []
    korthikanti_22b: list[str] = []
    for r in RUNS:
        predicted = predict_step(r, profile)
        error = predicted / r.step_seconds - 1
        (fitted if r.key in FIT else held).append(abs(error))
        if r.key.startswith("22B"):
            korthikanti_22b.append(f"{r.key} {percent(error, signed=True)}")
        dp = f"{'FSDP' if r.fsdp else 'DP'} {r.dp}"
        config = f"TP{r.tp} PP{r.pp}{f'x{r.virtual_stages}' if r.virtual_stages > 1 else ''} {dp}"
        rows.append(
            (
                r.key,
                config,
                f"{r.micro_batch}x{r.microbatches}",
                r.recompute + (" +SP" if r.sequence_parallel else ""),
                "fit" if r.key in FIT else "held out",
                r.step_seconds,
                predicted,
                percent(error, signed=True),
            )
        )
    e, a, mean = fit(profile)
    notes = (
        f"Seconds per step.  Held out ({len(held)} runs): mean |error| {percent(sum(held) / len(held))}, max "
        f"{percent(max(held))}.  Fit ({len(fitted)} runs): mean |error| {percent(sum(fitted) / len(fitted))}.  "
        f"Korthikanti 22B: {', '.join(korthikanti_22b)}.",
        f"Fitted on {', '.join(FIT)}: A100 compute.efficiency_max and compute.attention_efficiency (grid "
        f"search; a re-fit now gives {e:.2f} and {a:.2f}, mean |error| {percent(mean)}); "
        f"a100x8.json holds {profile.compute.efficiency_max:.2f} and {profile.compute.attention_efficiency}. "
        "No other parameter was fitted; nothing is per model or per run.",
        "Sources and pinned configurations: benchmarks/fidelity_runs.py (Korthikanti et al. 2022 Table 5; "
        "torchtitan docs/performance.md, WPS turned into seconds per step).  mb: micro-batch x micro-batches "
        "per step.  Prediction: benchmarks/fidelity_model.py, layer by layer from cost_models; pipeline runs "
        "composed analytically (1F1B slots (m + (p-1)/v), LM head on the last stage, exposed sends), FSDP "
        "with cost_models.overlap (prefetched gathers, reduce-scatters hidden by the next layer's backward).",
        "Where the model is still wrong: Llama 2 70B selective-op at batch 1 measures as slow per token as "
        "full recomputation at batch 2 (the page notes batch 2 runs out of memory under selective op: an "
        "allocator near its limit is not modelled); the Megatron rows are predicted up to 12% too slow, "
        "more for larger models and for full recomputation: the fit trades them against torchtitan's eager "
        "runs (one efficiency_max for Megatron's fused kernels and eager torch alike; the model has no "
        "efficiency gain for very large K), and the recomputed forward is priced like the first.",
    )
    columns = ("run", "config", "mb", "recompute", "set", "measured", "predicted", "error")
    return Table("fidelity_runs", "Published training runs: step time (s)", columns, rows, notes)


def memory_table() -> Table:
    rows: list[tuple[Any, ...]] = []
    errors: list[float] = []
    for r in RUNS:
        for (what, published), (_, predicted) in zip(r.memory_gib, predict_memory(r), strict=True):
            error = predicted / published - 1
            errors.append(abs(error))
            rows.append((r.model.name, what, published, predicted, percent(error, signed=True)))
    notes = (
        f"GiB on the first pipeline stage (REFERENCE.md, Korthikanti et al. 2022).  Mean |error| "
        f"{percent(sum(errors) / len(errors))}, max {percent(max(errors))}.",
        "params+optimizer: the layers' parameters over TP x PP at 18 bytes each (bf16 weights, fp32 main "
        "gradients, fp32 master + Adam moments: cost_models.memory.PrecisionPolicy(fp32_grad_accumulation="
        "True)); activations: transformer_activation_bytes x layers per stage x microbatches_in_flight.",
        "This checks cost_models.memory's implementation and its in-flight and precision accounting against the "
        "paper's own figures; the formulas come from the same paper, so agreement is expected, not independent. "
        "The 22B figures are those of a micro-batch of 4 (9.56 GiB = 34 s b h / t x 48 holds only for b = 4); "
        "530B is pinned interleaved (v = 3), inferred from these figures (fidelity_runs.py says why).",
    )
    columns = ("model", "memory", "published", "predicted", "error")
    return Table("fidelity_memory", "Published memory per GPU (GiB)", columns, rows, notes)


def planner_table(quick: bool, log: Any = print) -> Table:
    """Korthikanti's runs through the planner (Megatron TP forced), beside the layer model and the measurement.

    A pipelined run is composed as the layer model's is not: the planner prices one stage (layers / p layers
    plus embedding and head, the whole global batch at once) and the 1F1B bubble (p - 1) / (v m) is added.
    """
    profile = load_profile("a100x8")
    rows: list[tuple[Any, ...]] = []
    for name, heads, hidden, layers, _gpus, tp, pp, v, batch, full_s, selective_s in CALIBRATION[
        : 1 if quick else None
    ]:
        r = run_isolated(
            "benchmarks.fidelity:megatron_case",
            {"heads": heads, "hidden": hidden, "layers": layers, "tp": tp, "pp": pp, "batch": batch},
        )
        log(f"  planner {name}: {'error' if 'error' in r else 'ok'}")
        bubble = (pp - 1) / (v * batch)
        mine = {run.recompute: predict_step(run, profile) for run in RUNS if run.key.split()[0] == name}
        for policy, measured, label, layer_model in (
            ("full", full_s, "full", mine["full"]),
            ("none", selective_s, "SP+sel. (planner: none)", mine["selective"]),
        ):
            planned = None if "error" in r else r[policy]["step_s"] * (1 + bubble)
            error = None if planned is None else percent(planned / measured - 1, signed=True)
            rows.append((name, label, measured, layer_model, planned, error))
    notes: tuple[str, ...] = (
        "The planner prices the captured graph op by op with the same profile.  The benchmark's GPT runs "
        "Megatron 2022's unfused attention (batched QK^T and ·V over full S x S scores, softmax between), "
        "priced as the ops they are.  The planner cannot yet express selective recomputation (fid-graph's "
        "item), so its SP+selective row is planned without recomputation (Megatron re-runs the attention "
        "core: a few % more); full recomputation re-issues no forward collectives yet, and the solver's plan "
        "pays more redistributions per layer than Megatron's four (fid-graph's one-redistribution item).  "
        "Pipelined runs (175B, 530B, 1T) price one stage with embedding and head and add the 1F1B bubble "
        "(p-1)/(v m) analytically; stage-to-stage sends are not priced (the pipeline engineer's stage pricing "
        "replaces this).",
    )
    columns = ("model", "column", "measured", "layer model", "planner", "planner error")
    if quick:
        notes = (*notes, "--quick: the 22B run only.")
    return Table("fidelity_planner", "Korthikanti et al. 2022 through the planner (s)", columns, rows, notes)


def run(quick: bool, log: Any = print) -> list[Table]:
    return [nccl_points(), runs_table(), memory_table(), planner_table(quick, log)]
