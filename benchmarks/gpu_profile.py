"""The measured H100 profile and how far the bundled one is from it: ``python -m benchmarks.gpu_profile``.

Input (measured on a lent H100 80GB HBM3, 2026-11-24): ``results/h100_profile_2026-11-24_raw.json``, the raw
figures of ``autoshard profile --base h100x8 --ranks 1 --raw ...`` (square bf16 GEMMs 256-8192, a 2 GiB copy,
back-to-back one-element adds; one GPU, so no collective), and ``results/h100_gpu_probe_2026-11-24.json``
(``benchmarks/gpu_probe.py``: GEMMs by size and dtype, a linear layer's three products at unaligned and
padded sizes, copies, the launch floor).
Output: ``hardware_profiles/h100_measured.json`` -- :func:`autoshard.profiling.profile_document` of the raw
figures (what the command writes), plus the unaligned-GEMM rate from the probe -- and a table of every
compute and memory figure, measured against ``h100x8``'s.  ``autoshard search --profile
hardware_profiles/h100_measured.json`` plans with it.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from autoshard.profiling import Measurements, profile_document
from cost_models.profile import load_profile

RESULTS = Path(__file__).resolve().parent / "results"
RAW = RESULTS / "h100_profile_2026-11-24_raw.json"
PROBE = RESULTS / "h100_gpu_probe_2026-11-24.json"
OUT = Path(__file__).resolve().parents[1] / "hardware_profiles" / "h100_measured.json"

__all__ = ["measured_profile", "unaligned_ratio"]


def unaligned_ratio(probe: dict[str, Any]) -> tuple[float, list[str]]:
    """Median over the probe's unaligned shapes of (padded shape's time / unaligned time), a linear layer's
    three products summed; and one line per shape."""
    rows = {(r["m"], r["k"], r["n"]): sum(r["seconds"]) for r in probe["linear_fwd_bwd"]}
    pairs = [((8192, 768, 50257), (8192, 768, 50304)), ((16384, 768, 30522), (16384, 768, 30528)),
             ((8192, 4096, 4097), (8192, 4096, 4096)), ((8192, 4097, 4096), (8192, 4096, 4096))]  # fmt: skip
    ratios = [rows[padded] / rows[odd] for odd, padded in pairs]
    lines = [
        f"{'x'.join(map(str, odd))}: {r:.3f} of {'x'.join(map(str, p))}"
        for (odd, p), r in zip(pairs, ratios, strict=True)
    ]
    return statistics.median(ratios), lines


def measured_profile() -> dict[str, Any]:
    raw = json.loads(RAW.read_text())
    m = Measurements(**{**raw, "gemm": [tuple(g) for g in raw["gemm"]], "stream": tuple(raw["stream"])})
    doc = profile_document(m, "h100_measured", load_profile("h100x8"))
    doc["description"] = (
        "one NVIDIA H100 80GB HBM3 (lent, Firecracker VM host, torch 2.11+cu130), measured 2026-11-24; links "
        "and network from h100x8 (one GPU: no collective measured)"
    )
    ratio, lines = unaligned_ratio(json.loads(PROBE.read_text()))
    doc["compute"]["unaligned_gemm_efficiency"] = {
        "value": round(ratio, 3),
        "source": f"measured by benchmarks/gpu_probe.py on the same H100, 2026-11-24 ({PROBE.name}, "
        f"linear_fwd_bwd: a linear layer's three bf16 products, median of {'; '.join(lines)})",
    }
    for q in doc["compute"].values():  # cite the raw file for what autoshard profile measured
        if isinstance(q, dict) and "source" in q and q["source"].startswith("measured by `autoshard"):
            q["source"] += f" ({RAW.name})"
    return doc


def main() -> None:
    doc = measured_profile()
    OUT.write_text(json.dumps(doc, indent=1) + "\n")
    new, old = load_profile(str(OUT)), load_profile("h100x8")
    rows = [
        ("efficiency_max", new.compute.efficiency_max, old.compute.efficiency_max, 1),
        ("efficiency_half_time us", new.compute.efficiency_half_time, old.compute.efficiency_half_time, 1e6),
        ("launch_floor us", new.compute.launch_floor, old.compute.launch_floor, 1e6),
        ("memory efficiency", new.memory.efficiency, old.memory.efficiency, 1),
        ("unaligned_gemm_efficiency", new.compute.unaligned_gemm_efficiency, None, 1),
    ]
    print(f"wrote {OUT}\n{'figure':28s} {'measured':>10s} {'h100x8':>10s} {'h100x8 off by':>14s}")
    for name, a, b, scale in rows:
        off = f"{100 * (b / a - 1):+.0f}%" if a and b else "-"
        print(
            f"{name:28s} {(a or 0.0) * scale:10.4g} {'-' if b is None else f'{b * scale:.4g}':>10s} {off:>14s}"
        )


if __name__ == "__main__":
    main()
