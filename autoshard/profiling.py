"""Measure this machine and write a hardware profile: GEMM efficiency, memory bandwidth, collectives by size.

Input: what to measure (GEMM sizes, a streaming size, message sizes, ranks) and optionally a *base* profile whose
datasheet figures (peak FLOP/s, peak HBM bandwidth, network) are kept, so that measured efficiencies are
fractions of a published peak.
Output: a profile JSON (``autoshard-hardware-profile/1``) that :func:`cost_models.load_profile` and
``autoshard search --profile`` accept, every number's ``source`` saying how it was measured, and the raw
measurements (for benchmarks/results).

What is measured, on CUDA when present (NCCL between the GPUs of this node) and on the CPU otherwise (gloo
between forked ranks):

* compute: square GEMMs of each size in the profile dtype (median of ``repeats``).  ``efficiency_max`` is
  the best achieved rate over the peak (the base profile's, else the best rate itself: η = 1);
  ``efficiency_half_time`` τ is the median excess over F / (peak · η) of the products that take at least
  twice the launch floor (faster ones are host-bound: they measure the launch floor again), the ramp of
  :mod:`cost_models.compute`; ``launch_floor`` the time of a one-element add;
* memory: a copy of ``stream_bytes`` (read + write) over the peak bandwidth (base) or itself;
* collectives: all_reduce, all_gather, reduce_scatter and all_to_all of every message size among ``ranks``
  ranks.  The alpha–beta line of :mod:`cost_models.collectives` is fitted per kind by least squares to
  (size, time): its slope gives the bus bandwidth (nccl-tests convention), its intercept the per-step
  latency (shared by the kinds: the median).  The size curve is the model's; the raw points are kept.
  With a mesh (``--mesh 2x4``), the same curves are timed on the groups of each mesh axis and kept in the raw
  measurements (a profile describes the node; per-axis figures are for checking the mesh's layout).

One node only: the network section is copied from the base profile, or set equal to the in-node figures
without one (its source says so).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

import torch
import torch.distributed as dist

from cost_models.profile import SCHEMA_ID, HardwareProfile, load_profile

__all__ = ["Measurements", "axis_bus_bandwidths", "measure", "profile_document", "write_profile"]

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")


@dataclass
class Measurements:
    """Raw figures of one run of :func:`measure` (seconds, bytes)."""

    device: str
    dtype: str
    ranks: int
    gemm: list[tuple[int, float]] = field(default_factory=list)  # (n, seconds) of an n^3 product
    stream: tuple[float, float] = (0.0, 0.0)  # (bytes read + written, seconds)
    launch: float = 0.0
    collectives: dict[str, list[tuple[int, float]]] = field(default_factory=dict)  # kind -> (S, seconds)
    axes: dict[str, dict[str, list[tuple[int, float]]]] = field(default_factory=dict)  # per mesh axis
    capacity: int = 0
    multiprocessors: int = 0  # CUDA: the device's SM count (0: not read)

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items()}


def _timer(device: torch.device) -> Callable[[Callable[[], object], int], float]:
    if device.type == "cuda":
        return _cuda_time

    def median_time(fn: Callable[[], object], repeats: int) -> float:
        fn()  # warm up (kernel selection, allocation)
        times = []
        for _ in range(repeats):
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            fn()
            if device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    return median_time


def _cuda_time(fn: Callable[[], object], repeats: int) -> float:
    """Seconds per call of ``fn`` on the GPU: CUDA events around ``repeats`` back-to-back calls after a warm-up,
    the median of 3 such runs.  Back to back, as eager training issues them: the host queues each launch while
    the device runs the last, so a small kernel costs the host's issue time (the launch floor), a large one
    its own (a host clock around each call with a synchronize would add a round trip to every one)."""
    for _ in range(3):
        fn()  # kernel selection, allocation, clocks up
    runs = []
    for _ in range(3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            fn()
        end.record()
        end.synchronize()
        runs.append(start.elapsed_time(end) / 1e3 / repeats)
    return statistics.median(runs)


def measure(
    gemm_sizes: Sequence[int],
    stream_bytes: int,
    message_sizes: Sequence[int],
    ranks: int,
    dtype: torch.dtype,
    repeats: int = 5,
    mesh: Sequence[int] | None = None,
) -> Measurements:
    """Run every measurement of the module docstring on this machine; with ``mesh`` (axis sizes whose product
    is ``ranks``), also time the collectives of each mesh axis's groups (``Measurements.axes``)."""
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    timed = _timer(device)
    name = torch.cuda.get_device_name() if cuda else f"CPU ({os.cpu_count()} cores)"
    m = Measurements(device=name, dtype=str(dtype).removeprefix("torch."), ranks=ranks)
    for n in gemm_sizes:
        a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
        m.gemm.append((n, timed(partial(torch.matmul, a, b), repeats)))
    src = torch.empty(stream_bytes // 2, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    m.stream = (2.0 * src.numel() * src.element_size(), timed(partial(dst.copy_, src), repeats))
    one = torch.ones(1, device=device)
    m.launch = timed(partial(one.add_, 1), max(repeats, 20))
    if cuda:
        props = torch.cuda.get_device_properties(0)
        m.capacity, m.multiprocessors = int(props.total_memory), int(props.multi_processor_count)
    else:
        m.capacity = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // max(1, ranks))
    if ranks > 1:
        from autoshard.runtime.launch import launch

        backend: Literal["gloo", "nccl"] = "nccl" if cuda else "gloo"
        shape = tuple(mesh) if mesh else (ranks,)
        if math.prod(shape) != ranks:
            raise ValueError(f"mesh {shape} has {math.prod(shape)} ranks, not {ranks}")
        results = launch(
            _collectives, ranks, tuple(message_sizes), repeats, shape, backend=backend, timeout=600.0
        )
        m.collectives, m.axes = results[0]
    return m


def _axis_groups(shape: tuple[int, ...], axis: int) -> list[list[int]]:
    """Ranks of every group along ``axis`` of a row-major mesh of ``shape`` (as autoshard.cluster lays them)."""
    ranks = list(range(math.prod(shape)))
    coords = [list(_coordinate(r, shape)) for r in ranks]
    groups: dict[tuple[int, ...], list[int]] = {}
    for r, c in zip(ranks, coords, strict=True):
        key = tuple(v for i, v in enumerate(c) if i != axis)
        groups.setdefault(key, []).append(r)
    return list(groups.values())


def _coordinate(rank: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major coordinate of ``rank`` on a mesh of ``shape``."""
    out = []
    for size in reversed(shape):
        rank, c = divmod(rank, size)
        out.append(c)
    return tuple(reversed(out))


def _collectives(
    sizes: tuple[int, ...], repeats: int, shape: tuple[int, ...]
) -> tuple[dict[str, list[tuple[int, float]]], dict[str, dict[str, list[tuple[int, float]]]]]:
    """On every rank: time each collective kind at each buffer size S (nccl-tests' convention) over all ranks,
    then over the groups of each mesh axis of ``shape`` (rank 0's group reported)."""
    rank = dist.get_rank()
    everyone = _timed_curves(sizes, repeats, None, dist.get_world_size())
    axes: dict[str, dict[str, list[tuple[int, float]]]] = {}
    if len(shape) > 1:
        for axis, size in enumerate(shape):
            mine = None
            for ranks in _axis_groups(shape, axis):  # every rank creates every group, in the same order
                group = dist.new_group(ranks)
                if rank in ranks:
                    mine = group
            axes[f"axis{axis} ({size} ranks)"] = _timed_curves(sizes, repeats, mine, size)
    return (everyone, axes) if rank == 0 else ({}, {})


def _timed_curves(
    sizes: tuple[int, ...], repeats: int, group: Any, n: int
) -> dict[str, list[tuple[int, float]]]:
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
    timed = _timer(device or torch.device("cpu"))
    out: dict[str, list[tuple[int, float]]] = {k: [] for k in KINDS}
    for size in sizes:
        elems = max(n, size // 4 // n * n)  # float32, divisible by the ranks
        full = torch.ones(elems, device=device)
        part = torch.ones(elems // n, device=device)
        for kind, op in _ops(full, part, group).items():
            dist.barrier()
            out[kind].append((elems * 4, timed(op, repeats)))
    return out


def _ops(full: torch.Tensor, part: torch.Tensor, group: Any = None) -> dict[str, Callable[[], object]]:
    """One call of each collective kind on buffers ``full`` (S bytes) and ``part`` (S / ranks) over ``group``."""
    gather = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)  # renamed in torch 2.13
    scatter = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
    source = full.clone()
    return {
        "all_reduce": partial(dist.all_reduce, full, group=group),
        "all_gather": partial(gather, full, part, group=group),
        "reduce_scatter": partial(scatter, part, full, group=group),
        "all_to_all": partial(dist.all_to_all_single, full, source, group=group),
    }


def axis_bus_bandwidths(m: Measurements) -> dict[str, dict[str, float]]:
    """Bus bandwidth (bytes/s) of each kind on each measured mesh axis: the alpha-beta fit's slope."""
    out: dict[str, dict[str, float]] = {}
    for axis, curves in m.axes.items():
        size = int(axis.split("(")[1].split()[0])
        out[axis] = {k: _volume(k, size) / _line(points)[1] for k, points in curves.items() if points}
    return out


def _volume(kind: str, n: int) -> float:
    return (2.0 if kind == "all_reduce" else 1.0) * (n - 1) / n


def _steps(kind: str, n: int) -> int:
    return (2 if kind == "all_reduce" else 1) * (n - 1)


def _line(points: Sequence[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares (intercept, slope) of time against size; slope clamped positive."""
    xs = [float(s) for s, _ in points]
    ys = [t for _, t in points]
    if len(points) < 2 or max(xs) == min(xs):
        return 0.0, ys[-1] / xs[-1]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    slope = max(slope, ys[-1] / xs[-1] * 1e-3)
    return max(0.0, my - slope * mx), slope


def _q(value: float, unit: str | None, source: str) -> dict[str, Any]:
    q: dict[str, Any] = {"value": value}
    if unit is not None:
        q["unit"] = unit
    q["source"] = source
    return q


def profile_document(m: Measurements, name: str, base: HardwareProfile | None) -> dict[str, Any]:
    """The profile JSON for measurements ``m`` (module docstring says how each field is derived)."""
    when = time.strftime("%Y-%m-%d")
    how = f"measured by `autoshard profile` on {m.device}, {when}"
    rates = [2.0 * n**3 / t for n, t in m.gemm]
    best = max(rates)
    peak = base.compute.peak(m.dtype) if base is not None else best
    peak_source = f"base profile {base.name}: {base.source_of('compute.peak_flops.' + m.dtype)}" if base else (
        f"{how}: best achieved {m.dtype} GEMM rate (no base profile: efficiency_max is 1 by construction)"
    )  # fmt: skip
    eta = min(1.0, best / peak)
    # products that take under twice the launch floor measure how fast the host issues them (the floor's job)
    timed = [(n, t) for n, t in m.gemm if t >= 2 * m.launch] or m.gemm
    tau = statistics.median(max(0.0, t - 2.0 * n**3 / (peak * eta)) for n, t in timed)
    stream_rate = m.stream[0] / m.stream[1]
    hbm = base.memory.bandwidth if base is not None else stream_rate
    compute: dict[str, Any] = {
        "peak_flops": {m.dtype: _q(peak / 1e12, "TFLOP/s", peak_source)},
        "efficiency_max": _q(round(eta, 4), None, f"{how}: best of square GEMMs {[n for n, _ in m.gemm]}"),
        "efficiency_half_time": _q(
            tau * 1e6, "us", f"{how}: median excess over F / (peak x eta) of {[n for n, _ in timed]}"
        ),
        "launch_floor": _q(m.launch * 1e6, "us", f"{how}: one-element add, median"),
    }
    if m.dtype != "float32":
        fp32 = base.compute.peak("float32") if base is not None else best
        compute["peak_flops"]["float32"] = _q(fp32 / 1e12, "TFLOP/s", "base profile" if base else peak_source)
    for dt, value in base.compute.peak_flops if base is not None else ():
        if dt not in compute["peak_flops"]:  # the datasheet peaks of the dtypes not measured
            compute["peak_flops"][dt] = _q(value / 1e12, "TFLOP/s", f"base profile {_name_of(base)}")
    bus: dict[str, Any] = {}
    latencies: list[float] = []
    for kind in KINDS:
        points = m.collectives.get(kind, [])
        if not points and base is not None:
            bus[kind] = _q(base.intra_node.bus_bandwidth.of(kind) / 1e9, "GB/s", _unmeasured(base, kind))
            continue
        if not points:
            bus[kind] = _q(stream_rate / 1e9, "GB/s", f"not measured (one rank): the copy bandwidth, {how}")
            continue
        intercept, slope = _line(points)
        bus[kind] = _q(
            _volume(kind, m.ranks) / slope / 1e9, "GB/s",
            f"{how}: alpha-beta fit over {len(points)} sizes {points[0][0]}-{points[-1][0]} B, {m.ranks} ranks",
        )  # fmt: skip
        latencies.append(intercept / _steps(kind, m.ranks))
    step = statistics.median(latencies) if latencies else m.launch
    step_source = f"{how}: intercept of the alpha-beta fits / ring steps"
    ranks = _q(m.ranks, None, f"{how}: ranks measured")
    if not latencies and base is not None:
        step, step_source = base.intra_node.step_latency, _unmeasured(base, "step_latency")
        ranks = _q(base.devices_per_node, None, _unmeasured(base, "devices_per_node"))
    _copy_unmeasured(compute, m, base)
    doc: dict[str, Any] = {
        "schema": SCHEMA_ID,
        "name": name,
        "description": f"{m.ranks} x {m.device}, measured by autoshard profile on {when}",
        "device": m.device,
        "devices_per_node": ranks,
        "compute": compute,
        "memory": {
            "capacity": _q(m.capacity, "B", f"{how}: device memory (CPU: physical memory / ranks)"),
            "bandwidth": _q(hbm / 1e9, "GB/s", f"base profile {base.name}" if base else f"{how}: copy rate"),
            "efficiency": _q(
                round(min(1.0, stream_rate / hbm), 4), None, f"{how}: copy of {m.stream[0]:.0f} B"
            ),
        },
        "intra_node": {
            "bus_bandwidth": bus,
            "step_latency": _q(step * 1e6, "us", step_source),
        },
        "inter_node": _network(base, bus, step, how),
    }
    if base is not None and base.memory.runtime_reserve:
        reserve = _unmeasured(base, "memory.runtime_reserve")
        doc["memory"]["runtime_reserve"] = _q(base.memory.runtime_reserve / 1e9, "GB", reserve)
    return doc


def _name_of(base: HardwareProfile | None) -> str:
    return base.name if base is not None else "none"


def _unmeasured(base: HardwareProfile, field: str) -> str:
    """Source of a figure one device cannot measure (collectives need >= 2 ranks) or that is not measured."""
    path = {
        "step_latency": "intra_node.step_latency",
        "devices_per_node": "devices_per_node",
    }.get(field, field if "." in field else f"intra_node.bus_bandwidth.{field}")
    why = "collectives need >= 2 ranks; " if path.startswith(("intra_node", "devices")) else ""
    return f"not measured ({why}one device profiled): base profile {base.name}'s, {base.source_of(path)}"


def _copy_unmeasured(compute: dict[str, Any], m: Measurements, base: HardwareProfile | None) -> None:
    """Shape figures of the compute model: the SM count as read from the device, the GEMM tile and fused
    attention efficiency from the base profile (not measured by this command)."""
    if m.multiprocessors:
        compute["multiprocessors"] = _q(m.multiprocessors, None, f"read from the device on {m.device}")
    elif base is not None and base.compute.multiprocessors > 1:
        compute["multiprocessors"] = _q(
            base.compute.multiprocessors, None, _unmeasured(base, "compute.multiprocessors")
        )
    if base is None:
        return
    if base.compute.gemm_tile > 1:
        compute["gemm_tile"] = _q(base.compute.gemm_tile, None, _unmeasured(base, "compute.gemm_tile"))
    if base.compute.attention_efficiency is not None:
        compute["attention_efficiency"] = _q(
            base.compute.attention_efficiency, None, _unmeasured(base, "compute.attention_efficiency")
        )


def _network(base: HardwareProfile | None, bus: dict[str, Any], step: float, how: str) -> dict[str, Any]:
    if base is not None:
        net = base.inter_node
        source = f"not measured (one node): copied from base profile {base.name}"
        return {
            "nics_per_node": _q(net.nics_per_node, None, source),
            "nic_bandwidth": _q(net.nic_bandwidth / 1e9, "GB/s", source),
            "efficiency": _q(net.efficiency, None, source),
            "step_latency": _q(net.step_latency * 1e6, "us", source),
        }
    source = "not measured (one node, no base profile): set equal to the in-node figures"
    return {
        "nics_per_node": _q(1, None, source),
        "nic_bandwidth": _q(bus["all_reduce"]["value"], "GB/s", source),
        "efficiency": _q(1.0, None, source),
        "step_latency": _q(step * 1e6, "us", source),
    }


def write_profile(
    m: Measurements, path: str, name: str, base: str | None = None, raw: str | None = None
) -> HardwareProfile:
    """Write the profile of ``m`` to ``path`` (and the raw measurements to ``raw``); return it loaded back."""
    doc = profile_document(m, name, load_profile(base) if base else None)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
    if raw:
        with open(raw, "w", encoding="utf-8") as f:
            json.dump(m.to_json(), f, indent=1)
    return load_profile(path if os.sep in path or "/" in path else os.path.join(".", path))
