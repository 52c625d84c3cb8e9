"""``autoshard profile --out my.json``: measure this machine and write a hardware profile ``search`` accepts.

    autoshard profile --out node.json [--ranks 4] [--base a100x8] [--dtype bfloat16]
                      [--gemm-sizes 256,1024,4096] [--message-sizes 65536,1048576,16777216] [--raw raw.json]

GEMM rate by size, memory bandwidth, and the bus bandwidth of each collective by message size among
``--ranks`` ranks (NCCL on the GPUs of this node when CUDA is present, forked gloo ranks on the CPU
otherwise); :mod:`autoshard.profiling` says how each field is derived.  ``--base`` keeps a bundled profile's
datasheet peaks and network, so efficiencies are fractions of a published peak.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from autoshard.cli.args import CliError, mesh, positive

if TYPE_CHECKING:
    from autoshard.profiling import Measurements
    from cost_models.profile import HardwareProfile

__all__ = ["HELP", "add_arguments", "gemm_summary", "implausible", "run"]

KINDS = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
)  # autoshard.profiling.KINDS, without torch

HELP = "measure this machine (GEMMs, memory, collectives by size) and write a hardware profile"


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"sizes {text!r}: expected whole numbers separated by commas"
        ) from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"sizes {text!r}: expected whole numbers >= 1, e.g. 256,1024")
    return sizes


def gemm_summary(gemm: list[tuple[int, float]], dtype: str, peak: float, base: str | None) -> str:
    """The achieved GEMM rate, and what it is a fraction of: ``GEMM 85.3 GFLOP/s (float32, best at n=512)``,
    then the share of the base profile's datasheet peak, or that there is no peak to compare with (without
    ``--base`` the profile's peak is the best measured rate, so its efficiency is 1 by construction)."""
    n, seconds = max(gemm, key=lambda g: 2.0 * g[0] ** 3 / g[1])
    rate = 2.0 * n**3 / seconds
    line = f"GEMM {rate / 1e9:.1f} GFLOP/s ({dtype}, best at n={n})"
    if base is None:
        return line + "; no datasheet peak to compare with (--base NAME gives one): efficiency_max is 1"
    share = rate / peak if peak else 0.0
    return line + f" = {share:.3g} of the {base} {dtype} peak, {peak / 1e12:.4g} TFLOP/s"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="where to write the profile JSON")
    p.add_argument("--name", default=None, help="profile name (default: the file's stem)")
    p.add_argument("--ranks", type=positive, default=None, help="ranks for collectives (default: GPUs, or 2)")
    p.add_argument("--base", default=None, help="bundled profile whose peaks and network to keep")
    p.add_argument("--dtype", default=None, help="GEMM dtype (default bfloat16 on CUDA, float32 on CPU)")
    p.add_argument("--gemm-sizes", type=_sizes, default=None, help="square GEMM sizes, e.g. 256,1024,4096")
    p.add_argument("--stream-mib", type=positive, default=None, help="MiB copied for the bandwidth")
    p.add_argument("--message-sizes", type=_sizes, default=None, help="collective sizes in bytes")
    p.add_argument("--repeats", type=positive, default=5, help="timed repetitions (median)")
    p.add_argument("--raw", default=None, help="also write the raw measurements here")
    p.add_argument("--mesh", type=mesh, default=None, help="also time each axis of this mesh, e.g. 2x4")


def run(args: argparse.Namespace) -> int:
    import torch

    from autoshard.profiling import axis_bus_bandwidths, measure, write_profile

    out = Path(args.out)
    if not out.resolve().parent.is_dir():
        raise CliError(f"--out {args.out}: directory {out.parent} does not exist; create it first")
    cuda = torch.cuda.is_available()
    dtype_name = args.dtype or ("bfloat16" if cuda else "float32")
    dtype = getattr(torch, dtype_name, None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise CliError(f"--dtype {dtype_name}: not a torch floating dtype; write e.g. bfloat16 or float32")
    ranks = args.ranks or (max(1, torch.cuda.device_count()) if cuda else 2)
    gemm = args.gemm_sizes or ((1024, 2048, 4096, 8192) if cuda else (128, 256, 512))
    stream = (args.stream_mib or (1024 if cuda else 64)) * 2**20
    messages = args.message_sizes or tuple(2**k for k in range(10, 31 if cuda else 25, 2))
    if args.mesh is not None and math.prod(args.mesh) != ranks:
        raise CliError(
            f"--mesh {'x'.join(map(str, args.mesh))} has {math.prod(args.mesh)} ranks; --ranks is {ranks}"
        )
    m = measure(gemm, stream, messages, ranks, dtype, repeats=args.repeats, mesh=args.mesh)
    profile = write_profile(m, str(out), args.name or out.stem, base=args.base, raw=args.raw)
    bus = profile.intra_node.bus_bandwidth
    stream = profile.memory.bandwidth * profile.memory.efficiency
    print(f"wrote {out}: {profile.devices_per_node} x {profile.device}")
    print(f"  {gemm_summary(m.gemm, m.dtype, profile.compute.peak(m.dtype), args.base)}")
    print(f"  memory {stream / 1e9:.1f} GB/s, all_reduce busbw {bus.all_reduce / 1e9:.2f} GB/s")
    for axis, kinds in axis_bus_bandwidths(m).items():
        print(f"  {axis}: " + ", ".join(f"{k} {v / 1e9:.2f} GB/s" for k, v in kinds.items()))
    for line in implausible(m, profile, args.base):
        print(f"warning: {line}", file=sys.stderr)
    return 0


def implausible(m: Measurements, profile: HardwareProfile, base: str | None) -> list[str]:
    """Fitted figures no machine can have, each with the option that fixes it (new-user trial: an all_reduce
    busbw of 124 GB/s beside a 12.8 GB/s memory copy, fitted over messages of 1-64 KiB, was written silently).

    A collective moves its bytes through memory at least once, so its bus bandwidth cannot exceed the copy
    rate measured here: above it, the sizes were too small for the fit to see bandwidth, only latency.  A copy
    faster than the base profile's datasheet bandwidth stayed in cache."""
    copy = m.stream[0] / m.stream[1] if m.stream[1] > 0 else 0.0
    out = []
    bus = profile.intra_node.bus_bandwidth
    fast = [k for k in KINDS if m.collectives.get(k) and copy and bus.of(k) > copy]
    if fast:
        top = max(size for k in fast for size, _ in m.collectives[k])
        sizes = ",".join(str(max(2**20, top * 4) * 4**i) for i in range(3))
        figures = ", ".join(f"{k} {bus.of(k) / 1e9:.2f} GB/s" for k in fast)
        out.append(
            f"busbw {figures} above the memory copy rate measured here, {copy / 1e9:.1f} GB/s, which no "
            f"collective can beat: messages up to {top} B time latency, not bandwidth; measure larger ones, "
            f"e.g. --message-sizes {sizes}"
        )
    if base is not None and copy > profile.memory.bandwidth * 1.001:  # efficiency was capped at 1
        mib = m.stream[0] / 2 / 2**20  # read + written: the copy is half
        out.append(
            f"memory copy {copy / 1e9:.1f} GB/s above the {base} datasheet {profile.memory.bandwidth / 1e9:.1f} "
            f"GB/s: a copy of {mib:.0f} MiB stays in cache; measure a larger one, e.g. --stream-mib "
            f"{max(256, int(mib) * 16)}"
        )
    return out
