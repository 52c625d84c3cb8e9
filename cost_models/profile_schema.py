"""The hardware-profile JSON schema: units, dtype names, the field tree and its validator.

Input: a parsed JSON document (``json.loads``) and the file's name for messages.
Output: :class:`Validator` ``values`` (SI numbers by field path, ``"compute.efficiency_max"``) and
``sources`` (where each number comes from); any defect raises :class:`~autoshard.errors.ProfileError`
naming the file, the field path and what is expected.  :mod:`cost_models.profile` turns the values into
the immutable :class:`~cost_models.profile.HardwareProfile` record.

:data:`SPEC` is the machine-readable schema and the single source of truth; ``hardware_profiles/SCHEMA.md``
lists the same fields for people.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass
from typing import Any, Literal

from autoshard.errors import ProfileError

__all__ = [
    "BUS_KINDS",
    "DTYPE_ALIASES",
    "PEAK_DTYPES",
    "SPEC",
    "UNITS",
    "Validator",
    "canonical_dtype",
]

#: The collectives a profile gives an in-node bus bandwidth for (``intra_node.bus_bandwidth.<kind>``).
BUS_KINDS: tuple[str, ...] = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")

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

SPEC: _Spec = {
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
        "unaligned_gemm_efficiency": _Optional(_Quantity("fraction")),  # default: no alignment penalty
    },
    "memory": {
        "capacity": _Quantity("bytes"),
        "bandwidth": _Quantity("bandwidth"),
        "efficiency": _Quantity("fraction"),
        "runtime_reserve": _Optional(_Quantity("bytes")),  # default 0
    },
    "intra_node": {
        "bus_bandwidth": {k: _Quantity("bandwidth") for k in BUS_KINDS},
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


class Validator:
    """Walks a parsed JSON document against :data:`SPEC`; collects SI values and sources by field path."""

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
