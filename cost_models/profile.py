"""Hardware profiles: the JSON description of one node, validated, as an immutable record.

Input: a bundled profile name (``"a100x8"`` or ``"a100x8.json"``) or the path of a JSON file.
Output: a :class:`HardwareProfile` whose numbers are in SI units (bytes, seconds, FLOP/s, bytes/s), and whose
``sources`` say where each number comes from.  Any defect raises :class:`~autoshard.errors.ProfileError`
naming the file, the field path (``intra_node.bus_bandwidth.all_reduce``) and what is expected.

A profile is a tree of sections; every leaf number is a *quantity* object that carries its source::

    "bandwidth": {"value": 2039, "unit": "GB/s", "source": "NVIDIA A100 datasheet (80GB SXM)"}

``unit`` is required for dimensioned fields and one of :data:`UNITS` (``Gb/s`` is bits, ``GB/s`` bytes);
counts and fractions take no unit.  Unknown fields are errors (typo protection).
``hardware_profiles/SCHEMA.md`` lists every field; ``_SPEC`` below is the machine-readable version and the
single source of truth.

Example::

    >>> p = load_profile("a100x8")
    >>> p.devices_per_node, p.intra_node.bus_bandwidth.all_reduce / 1e9
    (8, 230.0)
    >>> p.source_of("intra_node.bus_bandwidth.all_reduce")[:8]
    'REFERENC'
"""

from __future__ import annotations

import difflib
import json
import math
import os
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Literal

import hardware_profiles
from autoshard.errors import ProfileError

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

# Dtype names a profile may give a peak for.  float8 stands for both float8_e4m3fn and float8_e5m2.
PEAK_DTYPES: tuple[str, ...] = ("float64", "float32", "tf32", "bfloat16", "float16", "float8")
DTYPE_ALIASES: dict[str, str] = {
    "fp64": "float64", "double": "float64", "fp32": "float32", "float": "float32",
    "bf16": "bfloat16", "fp16": "float16", "half": "float16",
    "float8_e4m3fn": "float8", "float8_e5m2": "float8", "fp8": "float8",
}  # fmt: skip

Dimension = Literal["count", "fraction", "bytes", "bandwidth", "time", "flop_rate"]
UNITS: dict[Dimension, dict[str, float]] = {
    "bytes": {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30},
    "bandwidth": {"B/s": 1, "MB/s": 1e6, "GB/s": 1e9, "TB/s": 1e12, "GiB/s": 2**30, "Mb/s": 1e6 / 8,
                  "Gb/s": 1e9 / 8},
    "time": {"s": 1, "ms": 1e-3, "us": 1e-6, "ns": 1e-9},
    "flop_rate": {"FLOP/s": 1, "GFLOP/s": 1e9, "TFLOP/s": 1e12, "PFLOP/s": 1e15},
}  # fmt: skip
_EXAMPLE_UNIT: dict[Dimension, str] = {
    "bytes": "GiB", "bandwidth": "GB/s", "time": "us", "flop_rate": "TFLOP/s",
}  # fmt: skip
_WORDS: dict[Dimension, str] = {
    "count": "a positive whole number",
    "fraction": "a number in (0, 1]",
    "bytes": "a positive size",
    "bandwidth": "a positive bandwidth",
    "time": "a time >= 0",
    "flop_rate": "a positive FLOP rate",
}


def canonical_dtype(dtype: object) -> str:
    """``torch.bfloat16``, ``"torch.bfloat16"``, ``"bf16"`` → ``"bfloat16"``; other names pass through."""
    name = str(dtype).removeprefix("torch.")
    return DTYPE_ALIASES.get(name, name)


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
    """

    peak_flops: tuple[tuple[str, float], ...]
    efficiency_max: float
    efficiency_half_time: float
    launch_floor: float
    multiprocessors: int = 1
    gemm_tile: int = 1
    attention_efficiency: float | None = None

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


# ----------------------------------------------------------------------------------------------- schema


@dataclass(frozen=True, slots=True)
class _Quantity:
    dimension: Dimension


@dataclass(frozen=True, slots=True)
class _Optional:
    """A field a profile may leave out; then :func:`_build` applies the documented default."""

    inner: _Quantity


@dataclass(frozen=True, slots=True)
class _DTypeMap:
    dimension: Dimension
    required: tuple[str, ...]


_Text = str  # marker: a plain non-empty string
_Spec = dict[str, Any]  # field name -> _Quantity | _DTypeMap | _Text marker | nested _Spec

_SPEC: _Spec = {
    "schema": _Text,
    "name": _Text,
    "description": _Text,
    "device": _Text,
    "devices_per_node": _Quantity("count"),
    "compute": {
        "peak_flops": _DTypeMap("flop_rate", required=("float32",)),
        "efficiency_max": _Quantity("fraction"),
        "efficiency_half_time": _Quantity("time"),
        "launch_floor": _Quantity("time"),
        "multiprocessors": _Optional(_Quantity("count")),  # default 1
        "gemm_tile": _Optional(_Quantity("count")),  # default 1: no tile quantisation
        "attention_efficiency": _Optional(_Quantity("fraction")),  # default: efficiency_max
    },
    "memory": {
        "capacity": _Quantity("bytes"),
        "bandwidth": _Quantity("bandwidth"),
        "efficiency": _Quantity("fraction"),
        "runtime_reserve": _Optional(_Quantity("bytes")),  # default 0
    },
    "intra_node": {
        "bus_bandwidth": {k: _Quantity("bandwidth") for k in BusBandwidth.__slots__},
        "step_latency": _Quantity("time"),
    },
    "inter_node": {
        "nics_per_node": _Quantity("count"),
        "nic_bandwidth": _Quantity("bandwidth"),
        "efficiency": _Quantity("fraction"),
        "step_latency": _Quantity("time"),
    },
}
_QUANTITY_KEYS = ("value", "unit", "source")


class _Validator:
    """Walks a parsed JSON document against :data:`_SPEC`; collects SI values and sources by field path."""

    def __init__(self, origin: str) -> None:
        self.origin = origin
        self.values: dict[str, Any] = {}
        self.sources: dict[str, str] = {}

    def fail(self, path: str, message: str) -> ProfileError:
        return ProfileError(f"hardware profile '{self.origin}', field '{path}': {message}")

    def section(self, node: object, spec: _Spec, path: str) -> None:
        where = f"{path}." if path else ""
        if not isinstance(node, dict):
            raise self.fail(
                path or "(top level)", f"expected an object with fields {sorted(spec)}, got {_kind(node)}"
            )
        for key in node:
            if key not in spec:
                hint = difflib.get_close_matches(key, list(spec), n=1)
                did_you_mean = f"did you mean '{hint[0]}'? " if hint else ""
                raise self.fail(where + key, f"unknown field; {did_you_mean}expected one of {sorted(spec)}")
        for key, sub in spec.items():
            if isinstance(sub, _Optional):
                if key in node:
                    self.field(node[key], sub.inner, where + key)
                continue
            if key not in node:
                raise self.fail(where + key, f"missing; expected {_describe(sub)}")
            self.field(node[key], sub, where + key)

    def field(self, node: object, spec: Any, path: str) -> None:
        if spec is _Text:
            if not isinstance(node, str) or not node.strip():
                raise self.fail(path, f"expected a non-empty string, got {_kind(node)}")
            self.values[path] = node
        elif isinstance(spec, _Quantity):
            self.quantity(node, spec.dimension, path)
        elif isinstance(spec, _DTypeMap):
            self.dtype_map(node, spec, path)
        else:
            self.section(node, spec, path)

    def dtype_map(self, node: object, spec: _DTypeMap, path: str) -> None:
        if not isinstance(node, dict):
            raise self.fail(
                path, f"expected an object keyed by dtype ({', '.join(PEAK_DTYPES)}), got {_kind(node)}"
            )
        for key in node:
            if key not in PEAK_DTYPES:
                alias = DTYPE_ALIASES.get(key)
                hint = f"write '{alias}'; " if alias else ""
                raise self.fail(
                    f"{path}.{key}", f"unknown dtype name; {hint}expected one of {list(PEAK_DTYPES)}"
                )
        for key in spec.required:
            if key not in node:
                raise self.fail(f"{path}.{key}", f"missing; expected {_describe(_Quantity(spec.dimension))}")
        for key in PEAK_DTYPES:  # canonical order, so equal profiles compare equal
            if key in node:
                self.quantity(node[key], spec.dimension, f"{path}.{key}")

    def quantity(self, node: object, dimension: Dimension, path: str) -> None:
        expected = _describe(_Quantity(dimension))
        if not isinstance(node, dict):
            raise self.fail(path, f"expected {expected}, got {_kind(node)}")
        allowed = _QUANTITY_KEYS if dimension in UNITS else ("value", "source")
        for key in node:
            if key not in allowed:
                raise self.fail(f"{path}.{key}", f"unknown field; a quantity has exactly {list(allowed)}")
        for key in allowed:
            if key not in node:
                raise self.fail(f"{path}.{key}", f"missing; expected {expected}")
        source = node["source"]
        if not isinstance(source, str) or not source.strip():
            expected_source = "a non-empty string saying where the number comes from"
            raise self.fail(f"{path}.source", f"expected {expected_source}, got {_kind(source)}")
        self.values[path] = self.number(node["value"], node.get("unit"), dimension, path)
        self.sources[path] = source

    def number(self, value: object, unit: object, dimension: Dimension, path: str) -> float | int:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise self.fail(f"{path}.value", f"expected {_WORDS[dimension]}, got {_kind(value)}")
        if dimension == "count":
            if not isinstance(value, int) or value < 1:
                raise self.fail(f"{path}.value", f"expected {_WORDS[dimension]}, got {value!r}")
            return value
        if dimension == "fraction":
            if not 0 < value <= 1:
                raise self.fail(f"{path}.value", f"expected {_WORDS[dimension]}, got {value!r}")
            return float(value)
        units = UNITS[dimension]
        if unit not in units:
            raise self.fail(f"{path}.unit", f"expected one of {list(units)}, got {_kind(unit)}")
        may_be_zero = dimension == "time"
        if value < 0 or (value == 0 and not may_be_zero):
            raise self.fail(f"{path}.value", f"expected {_WORDS[dimension]}, got {value!r}")
        return float(value) * units[str(unit)]


def _kind(node: object) -> str:
    if isinstance(node, dict):
        return "an object"
    if isinstance(node, list):
        return "a list"
    if node is None:
        return "null"
    return f"{type(node).__name__} {node!r}"


def _describe(spec: Any) -> str:
    if spec is _Text:
        return "a non-empty string"
    if isinstance(spec, _Optional):
        return _describe(spec.inner) + " (optional)"
    if isinstance(spec, _Quantity):
        words = _WORDS[spec.dimension]
        if spec.dimension in UNITS:
            unit = _EXAMPLE_UNIT[spec.dimension]
            return f'{words} as {{"value": <number>, "unit": "{unit}", "source": "<where it comes from>"}}'
        return f'{words} as {{"value": <number>, "source": "<where it comes from>"}}'
    if isinstance(spec, _DTypeMap):
        return f"an object keyed by dtype ({', '.join(PEAK_DTYPES)}) including {', '.join(spec.required)}"
    return f"an object with fields {sorted(spec)}"


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
    v = _Validator(origin)
    v.section(doc, _SPEC, "")
    if v.values["schema"] != SCHEMA_ID:
        raise v.fail("schema", f"expected '{SCHEMA_ID}', got {v.values['schema']!r}")
    return _build(v, origin)


def _reject_constant(name: str) -> float:
    raise ValueError(f"JSON constant {name} is not a number a profile may hold")


def _build(v: _Validator, origin: str) -> HardwareProfile:
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
