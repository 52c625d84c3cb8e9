"""The profile validator against a corpus of broken profiles written into tmp_path.

Each defect must raise ProfileError (an AutoshardError) whose message names the file, the field and what
is expected, so a user can fix the file from the message alone.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import hardware_profiles
from autoshard.errors import AutoshardError, ProfileError
from cost_models.profile import UNITS, load_profile

GOOD = json.loads((Path(hardware_profiles.__file__).parent / "a100x8.json").read_text())


def _write(tmp_path: Path, doc: Any, name: str = "broken.json") -> Path:
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc, indent=2))
    return path


def _mutated(edit: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    doc = copy.deepcopy(GOOD)
    edit(doc)
    return doc


def _error(path: Path) -> str:
    with pytest.raises(ProfileError) as info:
        load_profile(path)
    assert isinstance(info.value, AutoshardError)
    message = str(info.value)
    assert str(path) in message  # names the file
    return message


def test_a_valid_copy_loads_from_a_path(tmp_path: Path) -> None:
    p = load_profile(_write(tmp_path, GOOD, "mine.json"))
    assert p.name == "a100x8"
    assert p.origin.endswith("mine.json")


def test_missing_file_names_the_path_and_the_bundled_profiles(tmp_path: Path) -> None:
    message = _error(tmp_path / "nope.json")
    assert "no such file" in message
    assert "a100x8" in message and "h100x8" in message


def test_broken_json_reports_line_and_column(tmp_path: Path) -> None:
    text = '{\n  "schema": "autoshard-hardware-profile/1"\n  "name": "x"\n}\n'
    message = _error(_write(tmp_path, text))
    assert "line 3, column 3" in message
    assert "delimiter" in message


def test_nan_is_refused(tmp_path: Path) -> None:
    text = json.dumps(GOOD).replace('"value": 0.68,', '"value": NaN,', 1)
    assert "NaN" in text
    assert "finite" in _error(_write(tmp_path, text))


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    keys = path.split(".")

    def edit(doc: dict[str, Any]) -> None:
        node = doc
        for key in keys[:-1]:
            node = node[key]
        node[keys[-1]] = value

    return edit


def _delete(path: str) -> Callable[[dict[str, Any]], None]:
    keys = path.split(".")

    def edit(doc: dict[str, Any]) -> None:
        node = doc
        for key in keys[:-1]:
            node = node[key]
        del node[keys[-1]]

    return edit


def _rename(path: str, new: str) -> Callable[[dict[str, Any]], None]:
    keys = path.split(".")

    def edit(doc: dict[str, Any]) -> None:
        node = doc
        for key in keys[:-1]:
            node = node[key]
        node[new] = node.pop(keys[-1])

    return edit


# (case, edit, field path the message must name, words that say what is expected)
CORPUS: list[tuple[str, Callable[[dict[str, Any]], None], str, list[str]]] = [
    ("count as string", _set("devices_per_node.value", "8"), "devices_per_node.value", ["whole number"]),
    ("count as float", _set("devices_per_node.value", 8.5), "devices_per_node.value", ["whole number"]),
    ("bool is no number", _set("inter_node.nics_per_node.value", True), "inter_node.nics_per_node.value",
     ["whole"]),
    ("section as list", _set("memory", [1, 2]), "memory", ["object", "capacity"]),
    ("quantity as bare number", _set("memory.bandwidth", 2039), "memory.bandwidth", ['"value"', '"source"']),
    ("name not a string", _set("name", 7), "name", ["non-empty string"]),
    ("negative bandwidth", _set("intra_node.bus_bandwidth.all_reduce.value", -230),
     "intra_node.bus_bandwidth.all_reduce.value", ["positive bandwidth", "-230"]),
    ("zero NIC bandwidth", _set("inter_node.nic_bandwidth.value", 0), "inter_node.nic_bandwidth.value",
     ["positive bandwidth"]),
    ("zero capacity", _set("memory.capacity.value", 0), "memory.capacity.value", ["positive size"]),
    ("negative latency", _set("intra_node.step_latency.value", -1), "intra_node.step_latency.value",
     [">= 0"]),
    ("efficiency above one", _set("memory.efficiency.value", 1.5), "memory.efficiency.value", ["(0, 1]"]),
    ("dtype alias", _rename("compute.peak_flops.bfloat16", "bf16"), "compute.peak_flops.bf16",
     ["unknown dtype", "'bfloat16'"]),
    ("unknown dtype", _rename("compute.peak_flops.float16", "float128"), "compute.peak_flops.float128",
     ["unknown dtype", "float32"]),
    ("missing section", _delete("inter_node"), "inter_node", ["missing", "nic_bandwidth"]),
    ("missing quantity", _delete("memory.capacity"), "memory.capacity", ["missing", "GiB"]),
    ("missing float32 peak", _delete("compute.peak_flops.float32"), "compute.peak_flops.float32",
     ["missing"]),
    ("missing source", _delete("memory.bandwidth.source"), "memory.bandwidth.source", ["missing"]),
    ("empty source", _set("memory.bandwidth.source", "  "), "memory.bandwidth.source", ["where the number"]),
    ("missing unit", _delete("memory.bandwidth.unit"), "memory.bandwidth.unit", ["missing"]),
    ("wrong unit kind", _set("memory.bandwidth.unit", "GB"), "memory.bandwidth.unit", ["GB/s", "Gb/s"]),
    ("unit on a count", _set("devices_per_node.unit", "GPU"), "devices_per_node.unit", ["unknown field"]),
    ("typo at top level", _rename("devices_per_node", "devices_per_nod"), "devices_per_nod",
     ["unknown field", "did you mean 'devices_per_node'"]),
    ("typo in a section", _rename("intra_node.step_latency", "step_latncy"), "intra_node.step_latncy",
     ["unknown field", "did you mean 'step_latency'"]),
    ("extra key in a quantity", _set("memory.bandwidth.sorce", "x"), "memory.bandwidth.sorce",
     ["unknown field"]),
    ("wrong schema id", _set("schema", "autoshard-hardware-profile/0"), "schema",
     ["autoshard-hardware-profile/1"]),
]  # fmt: skip


@pytest.mark.parametrize(("case", "edit", "field", "expected"), CORPUS, ids=[c[0] for c in CORPUS])
def test_bad_profile_names_file_field_and_expectation(
    tmp_path: Path, case: str, edit: Callable[[dict[str, Any]], None], field: str, expected: list[str]
) -> None:
    message = _error(_write(tmp_path, _mutated(edit)))
    assert f"field '{field}'" in message, message
    for words in expected:
        assert words in message, f"{case}: {words!r} not in {message!r}"


def test_top_level_not_an_object(tmp_path: Path) -> None:
    assert "(top level)" in _error(_write(tmp_path, "[1, 2, 3]"))


@pytest.mark.parametrize(
    ("unit", "scale"), [("Gb/s", 1e9 / 8), ("GB/s", 1e9), ("GiB/s", 2**30), ("MB/s", 1e6)]
)
def test_units_convert_to_si(tmp_path: Path, unit: str, scale: float) -> None:
    doc = _mutated(_set("inter_node.nic_bandwidth", {"value": 200, "unit": unit, "source": "test"}))
    p = load_profile(_write(tmp_path, doc))
    assert p.inter_node.nic_bandwidth == pytest.approx(200 * scale)
    assert UNITS["bandwidth"][unit] == scale


def test_zero_is_allowed_for_latency_and_ramp(tmp_path: Path) -> None:
    doc = _mutated(_set("intra_node.step_latency.value", 0))
    _set("compute.efficiency_half_time.value", 0)(doc)
    p = load_profile(_write(tmp_path, doc))
    assert p.intra_node.step_latency == 0 and p.compute.efficiency_half_time == 0


def test_missing_peak_for_a_dtype_is_a_profile_error() -> None:
    v100 = load_profile("v100x8")
    with pytest.raises(ProfileError, match=r"v100x8.*bfloat16.*float16"):
        v100.compute.peak("bfloat16", v100.name)
