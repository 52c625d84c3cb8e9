"""Hardware profiles: the JSON description of one node, validated, as an immutable record.

Input: a bundled profile name (``"a100x8"`` or ``"a100x8.json"``) or the path of a JSON file.
Output: a :class:`HardwareProfile` whose numbers are in SI units (bytes, seconds, FLOP/s, bytes/s), and whose
``sources`` say where each number comes from.  Any defect raises :class:`~autoshard.errors.ProfileError`
naming the file, the field path (``intra_node.bus_bandwidth.all_reduce``) and what is expected.

A profile is a tree of sections; every leaf number is a *quantity* object that carries its source::

    "bandwidth": {"value": 2039, "unit": "GB/s", "source": "NVIDIA A100 datasheet (80GB SXM)"}

``unit`` is required for dimensioned fields and one of :data:`UNITS` (``Gb/s`` is bits, ``GB/s`` bytes);
counts and fractions take no unit.  Unknown fields are errors (typo protection).
``hardware_profiles/SCHEMA.md`` lists every field; :data:`cost_models.profile_schema.SPEC` is the
machine-readable version and the single source of truth.

Example::

    >>> p = load_profile("a100x8")
    >>> p.devices_per_node, p.intra_node.bus_bandwidth.all_reduce / 1e9
    (8, 230.0)
    >>> p.source_of("intra_node.bus_bandwidth.all_reduce")[:8]
    'REFERENC'
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import hardware_profiles
from autoshard.errors import ProfileError
from cost_models.profile_schema import (
    DTYPE_ALIASES,
    PEAK_DTYPES,
    SPEC,
    UNITS,
    Validator,
    canonical_dtype,
)

__all__ = [
    "DTYPE_ALIASES",
    "PEAK_DTYPES",
    "SCHEMA_ID",
    "UNITS",
    "BusBandwidth",
    "ComputeSpec",
    "HardwareProfile",
    "InterNodeLink",
    "IntraNodeLink",
    "MemorySpec",
    "canonical_dtype",
    "load_profile",
    "parse_profile",
]

SCHEMA_ID = "autoshard-hardware-profile/1"


# ---------------------------------------------------------------------------------------------- records


@dataclass(frozen=True, slots=True)
class ComputeSpec:
    """Arithmetic of one device.

    Attributes:
        peak_flops: (dtype, dense peak FLOP/s) pairs, in :data:`PEAK_DTYPES` order.
        efficiency_max: the fraction of peak a large matrix product reaches (η_max).
        efficiency_half_time: τ of η(F) = η_max · F / (F + F½) with F½ = τ · peak(dtype) · η_max: an op
            whose ideal time F / (peak · η_max) equals τ reaches half of η_max.  Equivalently every op with
            FLOPs pays τ on top of its ideal time.  A time, not a FLOP count, so one number fits all dtypes.
        launch_floor: seconds; no op takes less (host-side launch cost, overlapped with the device's work).
        multiprocessors: streaming multiprocessors (GPU) or cores that run one output tile each at a time; with
            ``gemm_tile`` it sets the tile and wave quantisation of :func:`cost_models.compute.gemm_efficiency`.
        gemm_tile: edge, in elements, of the output tile one multiprocessor computes (1: no quantisation).
        attention_efficiency: fraction of peak a fused attention kernel (FlashAttention) reaches on large
            problems; ``None`` means the profile gives none and ``efficiency_max`` is used.
        unaligned_gemm_efficiency: the rate of a matrix product whose K or N row is not a multiple of 16 bytes
            (GPT-2's 50257-word vocabulary in bf16), as a fraction of the aligned rate: the library falls back
            to kernels without vector loads; ``None``: no penalty.
    """

    peak_flops: tuple[tuple[str, float], ...]
    efficiency_max: float
    efficiency_half_time: float
    launch_floor: float
    multiprocessors: int = 1
    gemm_tile: int = 1
    attention_efficiency: float | None = None
    unaligned_gemm_efficiency: float | None = None

    def peak(self, dtype: object, profile_name: str = "this profile") -> float:
        """Dense peak FLOP/s for ``dtype``; integer and bool dtypes use the float32 peak (ALU-class work)."""
        name = canonical_dtype(dtype)
        if name.startswith(("int", "uint")) or name == "bool":
            name = "float32"
        # a complex number is a pair of reals: its arithmetic runs at the real dtype's peak (its FLOPs count pairs)
        name = {"complex32": "float16", "complex64": "float32", "complex128": "float64"}.get(name, name)
        for dt, value in self.peak_flops:
            if dt == name:
                return value
        listed = ", ".join(dt for dt, _ in self.peak_flops)
        raise ProfileError(
            f"hardware profile '{profile_name}' has no peak for dtype '{name}' "
            f"(field compute.peak_flops.{name}); it lists {listed}: "
            f"run the model in one of those dtypes or add the peak to the profile"
        )


@dataclass(frozen=True, slots=True)
class MemorySpec:
    """Device memory: capacity in bytes, bandwidth in bytes/s, and the fraction of it a stream reaches."""

    capacity: int
    bandwidth: float
    efficiency: float
    runtime_reserve: float = 0.0  # bytes the runtime holds before the model: CUDA context, NCCL, allocator


@dataclass(frozen=True, slots=True)
class BusBandwidth:
    """nccl-tests bus bandwidth (bytes/s, large messages) of each collective among the node's devices."""

    all_reduce: float
    all_gather: float
    reduce_scatter: float
    all_to_all: float

    def of(self, kind: str) -> float:
        """The bus bandwidth of collective ``kind`` (one of the four field names)."""
        value: float = getattr(self, kind)
        return value


@dataclass(frozen=True, slots=True)
class IntraNodeLink:
    """The links among the devices of one node (NVLink/NVSwitch, or shared memory for CPU ranks)."""

    bus_bandwidth: BusBandwidth
    step_latency: float  # seconds per ring step


@dataclass(frozen=True, slots=True)
class InterNodeLink:
    """The network between nodes: NICs per node, bandwidth per NIC (bytes/s), efficiency, step latency."""

    nics_per_node: int
    nic_bandwidth: float
    efficiency: float
    step_latency: float

    def bandwidth_per_device(self, devices_per_node: int) -> float:
        """Bytes/s one device can drive off the node: every device drives its share of the node's NICs."""
        return self.nics_per_node * self.nic_bandwidth * self.efficiency / devices_per_node


@dataclass(frozen=True, slots=True)
class HardwareProfile:
    """One node of a cluster.  Hashable and immutable: clusters and cost caches key on it."""

    name: str
    description: str
    device: str
    devices_per_node: int
    compute: ComputeSpec
    memory: MemorySpec
    intra_node: IntraNodeLink
    inter_node: InterNodeLink
    origin: str = field(default="", compare=False)
    sources: tuple[tuple[str, str], ...] = field(default=(), compare=False, repr=False)
    _hash: int = field(default=0, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        # Computed once: clusters and cost caches hash the profile on every lookup.
        key = (self.name, self.description, self.device, self.devices_per_node, self.compute, self.memory)
        object.__setattr__(self, "_hash", hash((*key, self.intra_node, self.inter_node)))

    def __hash__(self) -> int:
        return self._hash

    def source_of(self, path: str) -> str:
        """The source of the number at field ``path``, e.g. ``"memory.bandwidth"``."""
        for p, src in self.sources:
            if p == path:
                return src
        raise KeyError(
            f"profile '{self.name}' has no number at '{path}'; it has {[p for p, _ in self.sources]}"
        )


# ---------------------------------------------------------------------------------------------- loading


def parse_profile(text: str, origin: str) -> HardwareProfile:
    """Parse and validate profile JSON ``text``; ``origin`` (a file name) appears in every error."""
    try:
        doc = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as e:
        raise ProfileError(
            f"hardware profile '{origin}': invalid JSON at line {e.lineno}, column {e.colno}: {e.msg}"
        ) from e
    except ValueError as e:
        raise ProfileError(f"hardware profile '{origin}': {e}; write finite numbers only") from e
    v = Validator(origin)
    v.section(doc, SPEC, "")
    if v.values["schema"] != SCHEMA_ID:
        raise v.fail("schema", f"expected '{SCHEMA_ID}', got {v.values['schema']!r}")
    return _build(v, origin)


def _reject_constant(name: str) -> float:
    raise ValueError(f"JSON constant {name} is not a number a profile may hold")


def _build(v: Validator, origin: str) -> HardwareProfile:
    x = v.values
    peaks = tuple(
        (dt, x[f"compute.peak_flops.{dt}"]) for dt in PEAK_DTYPES if f"compute.peak_flops.{dt}" in x
    )
    bus = BusBandwidth(**{k: x[f"intra_node.bus_bandwidth.{k}"] for k in BusBandwidth.__slots__})
    return HardwareProfile(
        name=x["name"],
        description=x["description"],
        device=x["device"],
        devices_per_node=x["devices_per_node"],
        compute=ComputeSpec(
            peak_flops=peaks,
            efficiency_max=x["compute.efficiency_max"],
            efficiency_half_time=x["compute.efficiency_half_time"],
            launch_floor=x["compute.launch_floor"],
            multiprocessors=x.get("compute.multiprocessors", 1),
            gemm_tile=x.get("compute.gemm_tile", 1),
            attention_efficiency=x.get("compute.attention_efficiency"),
            unaligned_gemm_efficiency=x.get("compute.unaligned_gemm_efficiency"),
        ),
        memory=MemorySpec(
            round(x["memory.capacity"]),
            x["memory.bandwidth"],
            x["memory.efficiency"],
            x.get("memory.runtime_reserve", 0.0),
        ),
        intra_node=IntraNodeLink(bus, x["intra_node.step_latency"]),
        inter_node=InterNodeLink(
            x["inter_node.nics_per_node"],
            x["inter_node.nic_bandwidth"],
            x["inter_node.efficiency"],
            x["inter_node.step_latency"],
        ),
        origin=origin,
        sources=tuple(v.sources.items()),
    )


def load_profile(profile: str | os.PathLike[str]) -> HardwareProfile:
    """Load a bundled profile by name (``"a100x8"``, ``"a100x8.json"``) or a profile file by path.

    A bare name (no directory part) that names a bundled profile loads the bundled one; to load a local file
    of the same name, pass ``"./a100x8.json"``.  Bundled profiles are parsed once and cached.
    """
    text = os.fspath(profile)
    if os.sep not in text and "/" not in text and hardware_profiles.profile_resource(text) is not None:
        return _load_bundled(text.removesuffix(".json"))
    path = Path(text)
    try:
        content = path.read_text(encoding="utf-8")
    except FileNotFoundError as e:
        raise ProfileError(
            f"hardware profile '{path}': no such file; pass a bundled profile name "
            f"({', '.join(hardware_profiles.bundled_profiles())}) or the path of a profile .json file"
        ) from e
    except (OSError, UnicodeDecodeError) as e:
        raise ProfileError(
            f"hardware profile '{path}': cannot be read ({e}); pass a readable UTF-8 JSON file"
        ) from e
    return parse_profile(content, str(path))


@cache
def _load_bundled(name: str) -> HardwareProfile:
    resource = hardware_profiles.profile_resource(name)
    assert resource is not None, name
    return parse_profile(resource.read_text(encoding="utf-8"), f"hardware_profiles/{name}.json")
