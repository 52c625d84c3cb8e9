"""Sections 5 and 6, runtime: emitted modules against DTensor and against eager execution.

- **against DTensor** (section 5): ``benchmarks/runtime_vs_dtensor.py`` (written with the codegen) runs the same
  Megatron plan as autoshard's emitted module and as torch DTensor tensor parallelism on 4 gloo ranks; this
  module runs it as a subprocess and reads its printed figures.  Without the script: "not available".
- **against eager on one device** (section 6): a LLaMA-shaped model planned for one device, emitted by
  :func:`autoshard.parallelize` and timed (forward + backward) against the eager model on the same device.
  On a GPU (NCCL, one rank) that is the GPU comparison; without one, the same code runs on the CPU (gloo, one
  rank) as a stand-in that checks the emitted graph's overhead, and says so.  The H100 probe
  (``results/h100_gpu_probe_2026-11-23.json``, ``benchmarks/gpu_probe.py``) is reported alongside.
"""

from __future__ import annotations

import ast
import json
import re
import statistics
import subprocess
import sys
import time
from typing import Any

from benchmarks.isolate import REPO, run_isolated
from benchmarks.report import Table

__all__ = ["dtensor_table", "eager_case", "gpu_tables", "parse_dtensor_output", "run"]

SCRIPT = REPO / "benchmarks" / "runtime_vs_dtensor.py"
PROBE = REPO / "benchmarks" / "results" / "h100_gpu_probe_2026-11-23.json"


# -- section 5 ----------------------------------------------------------------------------------------------------
def parse_dtensor_output(text: str) -> dict[str, Any]:
    """The figures ``runtime_vs_dtensor.py`` prints (keys missing when a line is absent)."""
    patterns = {
        "setup": r"^(LLaMA .*ranks)$",
        "autoshard_ms": r"^\s*autoshard\s+([\d.]+) ms",
        "dtensor_ms": r"^\s*DTensor\s+([\d.]+) ms",
        "ratio": r"ratio autoshard / DTensor = ([\d.]+)",
        "loss": r"^loss\s+autoshard ([-\d.e]+)\s+DTensor ([-\d.e]+)",
        "autoshard_collectives": r"^autoshard ran per step: (.*)$",
        "dtensor_collectives": r"^DTensor ran per step:\s+(.*)$",
    }
    out: dict[str, Any] = {}
    for key, pattern in patterns.items():
        m = re.search(pattern, text, re.MULTILINE)
        if m is None:
            continue
        if key == "loss":
            out[key] = (float(m.group(1)), float(m.group(2)))
        elif key.endswith("_ms") or key == "ratio":
            out[key] = float(m.group(1))
        else:
            out[key] = m.group(1).strip()
    return out


def dtensor_table(quick: bool) -> Table:
    columns = ("runtime", "median step ms", "collectives per step", "loss")
    title = "Emitted module against DTensor tensor parallelism (4 gloo ranks, CPU)"
    if not SCRIPT.exists():
        return Table(
            "runtime_dtensor",
            title,
            columns,
            [],
            ("not available: benchmarks/runtime_vs_dtensor.py is missing.",),
        )
    cmd = [sys.executable, str(SCRIPT), "--nproc", "4", "--steps", "8" if quick else "24"]
    start = time.perf_counter()
    try:
        out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
        text, ok = out.stdout, out.returncode == 0
        err = out.stderr
    except subprocess.TimeoutExpired:
        text, ok, err = "", False, "timed out after 600 s"
    seconds = time.perf_counter() - start
    r = parse_dtensor_output(text)
    if not ok or "autoshard_ms" not in r or "dtensor_ms" not in r:
        tail = " | ".join((err or text).strip().splitlines()[-3:])
        return Table("runtime_dtensor", title, columns, [], (f"the script failed: {tail[:300]}",))
    loss = r.get("loss", (None, None))
    rows: list[tuple[Any, ...]] = [
        ("autoshard (emitted)", r["autoshard_ms"], _counts(r.get("autoshard_collectives")), loss[0]),
        ("DTensor TP", r["dtensor_ms"], _counts(r.get("dtensor_collectives")), loss[1]),
    ]
    notes = (
        f"{r.get('setup', '')}; the same Megatron plan both ways; forward + backward, no optimizer.  "
        f"ratio autoshard / DTensor = {r.get('ratio', r['autoshard_ms'] / r['dtensor_ms']):.2f} (below 1: autoshard "
        f"faster).  Run took {seconds:.0f} s.",
        "Shared 2-core machine, 4 ranks: absolute times are noisy; the two runtimes are interleaved in one run so "
        "that load hits both alike.",
    )
    return Table("runtime_dtensor", title, columns, rows, notes)


def _counts(text: str | None) -> str | None:
    """``{'forward all_reduce': 4}`` as ``forward all_reduce 4`` (the script prints a dict)."""
    try:
        counts = ast.literal_eval(text) if text else None
    except (ValueError, SyntaxError):
        return text
    return ", ".join(f"{k} {v}" for k, v in counts.items()) if isinstance(counts, dict) else text


# -- section 6 ----------------------------------------------------------------------------------------------------
def _compare_on_rank(
    hidden: int, layers: int, batch: int, seq: int, steps: int, profile: str
) -> dict[str, Any]:
    """Runs on the single rank of a process group: plan, emit, and time emitted against eager."""
    import copy

    import torch
    import transformers

    import autoshard
    from autoshard.codegen import parallelize, shard_inputs
    from autoshard.runtime.launch import default_device
    from autoshard.runtime.verify import cluster_for

    device = default_device()
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    config: dict[str, Any] = {
        "hidden_size": hidden, "intermediate_size": 4 * hidden, "num_hidden_layers": layers,
        "num_attention_heads": hidden // 64, "num_key_value_heads": max(1, hidden // 256), "vocab_size": 32000,
        "max_position_embeddings": max(2048, seq), "use_cache": False, "attn_implementation": "sdpa",
        "bos_token_id": 0, "eos_token_id": 31999,
    }  # fmt: skip
    model: Any = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config))
    model = model.to(dtype).eval()
    ids = torch.randint(0, 32000, (batch, seq), generator=torch.Generator().manual_seed(1))
    plan = autoshard.plan(model, cluster_for(profile, 1), (ids,))
    emitted = parallelize(model, plan, (ids,), device=device)
    (local,) = shard_inputs(plan, ids)
    local = local.to(device)
    eager = copy.deepcopy(model).to(device)
    ids_dev = ids.to(device)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    def timed(step: Any) -> tuple[float, Any]:
        times, out = [], None
        for i in range(steps + 2):
            sync()
            start = time.perf_counter()
            out = step()
            sync()
            if i >= 2:  # warm-up
                times.append(time.perf_counter() - start)
        return statistics.median(times), out

    def step_emitted() -> Any:
        out = emitted(local)
        out.float().sum().backward()
        return out.detach()

    def step_eager() -> Any:
        out = eager(ids_dev).logits
        out.float().sum().backward()
        return out.detach()

    result: dict[str, Any] = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu"}
    t_emitted, y_emitted = timed(step_emitted)
    t_eager, y_eager = timed(step_eager)
    result.update(
        emitted_ms=t_emitted * 1e3,
        eager_ms=t_eager * 1e3,
        max_abs_diff=float((y_emitted.float() - y_eager.float()).abs().max()),
        dtype=str(dtype).removeprefix("torch."),
    )
    return result


def eager_case(hidden: int, layers: int, batch: int, seq: int, steps: int) -> dict[str, Any]:
    """One rank (NCCL on a GPU, else gloo on the CPU) comparing emitted and eager (child process)."""
    import torch

    from autoshard.runtime.launch import launch

    gpu = torch.cuda.is_available()
    profile = "h100x8" if gpu else "cpu"
    (r,) = launch(
        _compare_on_rank,
        1,
        hidden,
        layers,
        batch,
        seq,
        steps,
        profile,
        backend="nccl" if gpu else "gloo",
        timeout=900,
    )
    return dict(r)


def _probe_table() -> Table:
    columns = ("measurement", "size", "value", "unit")
    title = "H100 probe (benchmarks/gpu_probe.py on a lent H100 80GB HBM3, 2026-11-23)"
    if not PROBE.exists():
        return Table("gpu_probe", title, columns, [], (f"{PROBE.name} is missing.",))
    data = json.loads(PROBE.read_text())
    rows: list[tuple[Any, ...]] = []
    for g in data.get("gemm", []):
        if "m" in g:
            rows.append(("GEMM bf16, LLaMA shape", f"{g['m']}x{g['k']}x{g['n']}", g["tflops"], "TFLOP/s"))
        else:
            rows.append(("GEMM " + g["dtype"].removeprefix("torch."), f"{g['n']}^3", g["tflops"], "TFLOP/s"))
    for c in data.get("copy", []):
        rows.append(("HBM copy (read + write)", f"{c['MiB']} MiB", c["GBps"], "GB/s"))
    if "launch_floor_s" in data:
        rows.append(("launch floor (tiny add)", "-", data["launch_floor_s"] * 1e6, "us"))
    notes = (
        f"Measured on a lent {data.get('device', 'H100')} on 2026-11-23 (not on this machine); the h100x8 "
        "profile's compute efficiency (0.75 of 989 TFLOP/s) and HBM efficiency (0.9) come from it.",
    )
    return Table("gpu_probe", title, columns, rows, notes)


def gpu_tables(quick: bool) -> list[Table]:
    import torch

    gpu = torch.cuda.is_available()
    columns = ("device", "model", "dtype", "eager ms", "emitted ms", "ratio", "max abs diff")
    title = "Emitted module against eager execution on one device (forward + backward)"
    probe = _probe_table()
    if quick:
        note = "skipped in --quick." + ("" if gpu else " No CUDA device on this machine either.")
        return [Table("gpu_eager", title, columns, [], (note,)), probe]
    hidden, layers, batch, seq = (2048, 8, 8, 1024) if gpu else (256, 2, 2, 128)
    r = run_isolated(
        "benchmarks.runtime:eager_case",
        {"hidden": hidden, "layers": layers, "batch": batch, "seq": seq, "steps": 20 if gpu else 6},
        timeout=900,
    )
    model = f"LLaMA {hidden}h x{layers}"
    if "error" in r:
        rows: list[tuple[Any, ...]] = [
            ("gpu" if gpu else "cpu", model, None, None, None, None, r["error"][:40])
        ]
    else:
        ratio = r["emitted_ms"] / r["eager_ms"]
        rows = [
            (
                r["device"],
                model,
                r["dtype"],
                r["eager_ms"],
                r["emitted_ms"],
                f"{ratio:.2f}",
                r["max_abs_diff"],
            )
        ]
    notes: tuple[str, ...] = (
        (
            f"Batch {batch} x {seq}, forward + backward, median of 20 steps; ratio: emitted / eager.  Run on "
            "this machine's GPU: one NCCL rank, the plan for a one-GPU h100x8 cluster.",
        )
        if gpu
        else (
            f"Batch {batch} x {seq}, forward + backward, median of 6 steps; ratio: emitted / eager.  "
            "NOT RUN ON A GPU: this machine has no CUDA device.  The row is the CPU stand-in (one gloo rank, "
            "float32, a small model): it checks the emitted graph's overhead and numerics only.  On a GPU machine "
            "`python -m benchmarks` runs LLaMA 2048h x 8 in bfloat16 on one GPU instead.",
        )
    )
    return [Table("gpu_eager", title, columns, rows, notes), probe]


def run(quick: bool, log: Any = print) -> list[Table]:
    tables = [dtensor_table(quick)]
    log("  runtime against DTensor done")
    tables += gpu_tables(quick)
    log("  eager comparison done")
    return tables


def _main() -> None:
    for t in run(quick="--quick" in sys.argv):
        print(t.markdown(), end="\n\n")


if __name__ == "__main__":
    _main()
