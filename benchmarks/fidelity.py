"""Section 4, fidelity: the cost model against published measurements.

- **collectives**: the bus bandwidth the collective model implies (``cost_models.collectives.bus_bandwidth``,
  8 GiB buffers as in nccl-tests' large-message end) against the nccl-tests points of REFERENCE.md, and the
  8-rank all-reduce time from 32 KiB to 16 GiB against a published sweep, with the alpha-beta latency fitted
  to it (:mod:`benchmarks.fidelity_nccl`).
- **published runs** (:mod:`benchmarks.fidelity_runs`: 16 measured training runs, Korthikanti et al. 2022
  Table 5 and torchtitan's published FSDP2 figures, each cited there): every run's configuration is pinned
  (degrees, micro-batches, recomputation) and its step predicted by :mod:`benchmarks.fidelity_model` from the
  cost model's functions layer by layer (shape-aware GEMMs, fused attention, memory-bound ops, collectives,
  overlap; pipelines composed analytically).  Two A100 profile parameters, ``compute.efficiency_max`` and
  ``compute.attention_efficiency``, are *fitted* on the runs named in ``fidelity_runs.FIT`` (:func:`fit`; the
  bundled a100x8.json holds the result); every other run is held out.
- **planned runs** (:mod:`benchmarks.fidelity_planned`): Korthikanti's eight runs through ``autoshard.plan``
  itself, the published PP / microbatches / schedule / TP pinned on a meta-device Megatron GPT at full depth,
  every stage priced by the pipeline search (no composition by hand); the runs table's held-out figure with
  these in place of the layer model's Megatron rows is the headline.
- **memory**: Megatron's published first-stage memory (REFERENCE.md) against :mod:`cost_models.memory` (the
  formulas' own paper: a consistency check), and, *independently*, torchtitan's measured H100 peaks planned
  by ``autoshard.plan`` (:mod:`benchmarks.fidelity_memory`; nothing fitted on them).

    python -m benchmarks --only fidelity --write   # writes results/fidelity_*.csv and SUMMARY.md
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from benchmarks.fidelity_memory import TITAN_MEMORY, planned_memory
from benchmarks.fidelity_model import predict_memory, predict_step
from benchmarks.fidelity_nccl import curve_table
from benchmarks.fidelity_planned import planned_step
from benchmarks.fidelity_runs import FIT, RUNS, Run
from benchmarks.report import Table, percent
from cost_models.profile import HardwareProfile, load_profile

__all__ = ["fit", "memory_table", "nccl_points", "planned_table", "run", "runs_table"]

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


# -- Megatron's GPT ---------------------------------------------------------------------------------------------
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


def runs_table(profile_name: str = "a100x8", planned: dict[str, float] | None = None) -> Table:
    """The layer model on every run; with ``planned`` (run key -> step from autoshard.plan), also the
    held-out error with those runs priced by the planner instead."""
    profile = load_profile(profile_name)
    planned = planned or {}
    mixed: list[float] = []
    rows: list[tuple[Any, ...]] = []
    held: list[float] = []
    fitted: list[float] = []
    korthikanti_22b: list[str] = []
    for r in RUNS:
        predicted = predict_step(r, profile)
        error = predicted / r.step_seconds - 1
        (fitted if r.key in FIT else held).append(abs(error))
        if r.key not in FIT:
            mixed.append(abs(planned.get(r.key, predicted) / r.step_seconds - 1))
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
    headline = (
        f"With the {len(planned)} Megatron runs priced by autoshard.plan (the planned table below) in place of "
        f"the layer model: held out ({len(mixed)} runs) mean |error| {percent(sum(mixed) / len(mixed))}, max "
        f"{percent(max(mixed))}; Korthikanti 22B through the planner: "
        + ", ".join(
            f"{k} {percent(v / _measured(k) - 1, signed=True)}" for k, v in planned.items() if k[:3] == "22B"
        )
        + "."
        if planned
        else "No run was planned (the planned table failed or was skipped)."
    )
    notes = (
        f"Seconds per step, layer model.  Held out ({len(held)} runs): mean |error| "
        f"{percent(sum(held) / len(held))}, max {percent(max(held))}.  Fit ({len(fitted)} runs): mean |error| "
        f"{percent(sum(fitted) / len(fitted))}.  Korthikanti 22B: {', '.join(korthikanti_22b)}.",
        headline,
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
        "allocator near its limit is not modelled).  Megatron 1T is predicted 9-13% slow (planned table): 1F1B "
        "on 64 stages of 2 layers leaves a 10% bubble, and the last stage, which also runs the LM head and the "
        "fp32 loss (1/6 of a layer's forward), paces the steady state (+6-8% a microbatch); both are what 1F1B "
        "does and are priced as such.  Taking them as real, the measurement implies a stage ~9% faster than "
        "priced, where 175B agrees to 1-6%: the gap grows with hidden size (1T: 25600, 175B: 12288), as if "
        "Megatron's GEMMs ran above the fitted 0.68 of peak at 1T's shapes; the H100 GEMM probe "
        "(results/h100_gpu_probe_2026-11-23.json) is flat from 4096 to 16384, so no sourced size effect "
        "supports raising it, and it is left unexplained rather than fitted.  The paper's 1T memory figure "
        "(131.25 GiB) equals the non-interleaved formula, so v = 1 is pinned as published.",
    )
    columns = ("run", "config", "mb", "recompute", "set", "measured", "predicted", "error")
    return Table("fidelity_runs", "Published training runs: step time (s)", columns, rows, notes)


def _measured(key: str) -> float:
    return next(r.step_seconds for r in RUNS if r.key == key)


def memory_table(quick: bool = True, log: Any = print) -> Table:
    rows: list[tuple[Any, ...]] = []
    errors: list[float] = []
    for r in RUNS:
        for (what, published), (_, predicted) in zip(r.memory_gib, predict_memory(r), strict=True):
            error = predicted / published - 1
            errors.append(abs(error))
            rows.append(
                (r.model.name, what, "paper's formula", published, predicted, percent(error, signed=True))
            )
    independent: list[float] = []
    for m in TITAN_MEMORY[: 1 if quick else None]:
        got = planned_memory(m.key)
        log(f"  memory {m.key}: {'error' if 'error' in got else 'ok'}")
        if "error" in got:
            rows.append((m.key, "peak, planned", "held out", m.measured_gib, None, got["error"][:80]))
            continue
        error = got["gib"] / m.measured_gib - 1
        independent.append(abs(error))
        rows.append(
            (m.key, "peak, planned", "held out", m.measured_gib, got["gib"], percent(error, signed=True))
        )
    held = (
        f"Independent (torchtitan's measured H100 peaks, {len(independent)} runs, all held out, nothing fitted): "
        f"mean |error| {percent(sum(independent) / len(independent))}, max {percent(max(independent))}."
        if independent
        else "Independent rows: none planned."
    )
    notes: tuple[str, ...] = (
        f"GiB per GPU.  {held}  Korthikanti rows (first pipeline stage, REFERENCE.md): mean |error| "
        f"{percent(sum(errors) / len(errors))}, max {percent(max(errors))}.",
        "Independent rows: benchmarks/fidelity_memory.py (torchtitan benchmarks/llama3_h100_202412_torchtitan.md "
        "Tables 1, 3, 4; the published layout pinned in autoshard.plan; predicted = the plan's "
        "memory_per_device).  The planner keeps every matmul output under 'selective' where torchtitan's "
        "op-level policy keeps every second one, and its logits are a full (tokens x 128256) output kept "
        "for backward: both make it high on the 8B rows.",
        "params+optimizer: the layers' parameters over TP x PP at 18 bytes each (bf16 weights, fp32 main "
        "gradients, fp32 master + Adam moments: cost_models.memory.PrecisionPolicy(fp32_grad_accumulation="
        "True)); activations: transformer_activation_bytes x layers per stage x microbatches_in_flight.",
        "This checks cost_models.memory's implementation and its in-flight and precision accounting against the "
        "paper's own figures; the formulas come from the same paper, so agreement is expected, not independent. "
        "The 22B figures are those of a micro-batch of 4 (9.56 GiB = 34 s b h / t x 48 holds only for b = 4); "
        "530B is pinned interleaved (v = 3), inferred from these figures (fidelity_runs.py says why).",
    )
    if quick:
        notes = (*notes, "--quick: the first independent row only.")
    columns = ("model", "memory", "set", "published", "predicted", "error")
    return Table("fidelity_memory", "Published memory per GPU (GiB)", columns, rows, notes)


def planned_table(quick: bool, log: Any = print) -> tuple[Table, dict[str, float]]:
    """Korthikanti's runs through ``autoshard.plan`` with the published configuration pinned
    (:mod:`benchmarks.fidelity_planned`), beside the layer model and the measurement."""
    profile = load_profile("a100x8")
    runs = [r for r in RUNS if r.source.startswith("Korthikanti")][: 2 if quick else None]
    rows: list[tuple[Any, ...]] = []
    planned: dict[str, float] = {}
    details: list[str] = []
    for r in runs:
        got = planned_step(r.key)
        log(f"  planned {r.key}: {'error' if 'error' in got else 'ok'}")
        layer_model = predict_step(r, profile)
        if "error" in got:
            rows.append((r.key, _config(r), "-", r.step_seconds, layer_model, None, got["error"][:80]))
            continue
        planned[r.key] = got["step_s"]
        error = got["step_s"] / r.step_seconds - 1
        how = f"{got['schedule']}, bubble {percent(got['bubble'])}" if r.pp > 1 else "no stages"
        rows.append(
            (r.key, _config(r), how, r.step_seconds, layer_model, got["step_s"], percent(error, signed=True))
        )
        if r.key.startswith("1T"):
            details.append(f"{r.key}: {got['why']}")
    held = [abs(planned[k] / r.step_seconds - 1) for r in runs if (k := r.key) in planned and k not in FIT]
    summary = (
        f"Held out ({len(held)} Megatron runs): mean |error| {percent(sum(held) / len(held))}, max "
        f"{percent(max(held))}."
        if held
        else "No held-out run was planned."
    )
    notes: tuple[str, ...] = (
        "Each run planned by autoshard.plan on a meta-device Megatron GPT at full depth (unfused attention, "
        "tied head), on gpus / 8 a100x8 nodes, with pipeline=<published PP>, microbatches=<global batch / "
        "DP>, schedule interleaved_1f1b (v = 3 pinned by stage cuts) or 1f1b, annotations pinning Megatron's "
        "TP 8, and the published recomputation (benchmarks/fidelity_planned.py).  Every stage is priced by "
        "the pipeline search: the intra-op critical path on its sub-mesh, the schedule, the p2p sends.  "
        + summary,
        "SP+sel rows run autoshard's selective policy (torchtitan's op-level: matmul outputs kept, the rest "
        "re-run), Korthikanti's recomputes the attention core; sequence parallelism is the planner's choice.",
        *details,
    )
    columns = ("run", "config", "schedule", "measured", "layer model", "planner", "planner error")
    if quick:
        notes = (*notes, "--quick: the 22B runs only.")
    table = Table(
        "fidelity_planner", "Korthikanti et al. 2022 through autoshard.plan (s)", columns, rows, notes
    )
    return table, planned


def _config(r: Run) -> str:
    return f"TP{r.tp} PP{r.pp}{f'x{r.virtual_stages}' if r.virtual_stages > 1 else ''} DP {r.dp}"


def run(quick: bool, log: Any = print) -> list[Table]:
    planned_runs, planned = planned_table(quick, log)
    return [nccl_points(), curve_table(), runs_table(planned=planned), memory_table(quick, log), planned_runs]
