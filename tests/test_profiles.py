"""Bundled hardware profiles: they load, every number has a source, they say what REFERENCE.md says."""

from __future__ import annotations

import doctest
import importlib
import json
import re
from pathlib import Path

import pytest

import hardware_profiles
from cost_models.profile import HardwareProfile, load_profile

BUNDLED = hardware_profiles.bundled_profiles()
PROFILE_DIR = Path(hardware_profiles.__file__).parent


def _numbers_without_source(node: object, path: str = "") -> list[str]:
    """Paths of JSON numbers that are not the ``value`` of an object with a non-empty ``source``."""
    bad: list[str] = []
    if isinstance(node, dict):
        for key, sub in node.items():
            here = f"{path}.{key}" if path else key
            if key == "value" and isinstance(sub, int | float) and not isinstance(sub, bool):
                source = node.get("source")
                if not (isinstance(source, str) and source.strip()):
                    bad.append(here)
            else:
                bad += _numbers_without_source(sub, here)
    elif isinstance(node, list):
        for i, sub in enumerate(node):
            bad += _numbers_without_source(sub, f"{path}[{i}]")
    elif isinstance(node, int | float) and not isinstance(node, bool):
        bad.append(path)
    return bad


def _count_numbers(node: object) -> int:
    if isinstance(node, dict):
        return sum(_count_numbers(v) for v in node.values())
    if isinstance(node, list):
        return sum(_count_numbers(v) for v in node)
    return int(isinstance(node, int | float) and not isinstance(node, bool))


def test_the_required_profiles_are_bundled() -> None:
    assert {"a100x8", "h100x8", "v100x8", "cpu"} <= set(BUNDLED)


@pytest.mark.parametrize("name", BUNDLED)
def test_every_number_has_a_source(name: str) -> None:
    doc = json.loads((PROFILE_DIR / f"{name}.json").read_text())
    assert _numbers_without_source(doc) == []
    profile = load_profile(name)
    # The loader keeps one source per number, so reports can cite them.
    assert len(profile.sources) == _count_numbers(doc)
    assert all(src.strip() for _, src in profile.sources)


def test_the_source_walker_finds_a_bare_number() -> None:
    assert _numbers_without_source({"a": {"value": 1, "source": " "}, "b": [2]}) == ["a.value", "b[0]"]


@pytest.mark.parametrize("name", BUNDLED)
def test_bundled_profile_loads_by_name_suffix_and_path(name: str) -> None:
    by_name = load_profile(name)
    assert isinstance(by_name, HardwareProfile)
    assert by_name.name == name
    assert load_profile(f"{name}.json") is by_name  # bundled loads are cached
    assert load_profile(PROFILE_DIR / f"{name}.json") == by_name
    assert hash(load_profile(str(PROFILE_DIR / f"{name}.json"))) == hash(by_name)


@pytest.mark.parametrize("name", BUNDLED)
def test_bundled_profiles_are_internally_consistent(name: str) -> None:
    p = load_profile(name)
    bus = p.intra_node.bus_bandwidth
    net_per_device = p.inter_node.bandwidth_per_device(p.devices_per_node)
    # The network is the slow link: each device's share of the NICs is below its in-node bus bandwidth.
    assert net_per_device < min(bus.all_reduce, bus.all_gather, bus.reduce_scatter, bus.all_to_all)
    assert p.inter_node.step_latency >= p.intra_node.step_latency
    peaks = dict(p.compute.peak_flops)
    assert all(peaks[low] <= peaks[high] for low, high in [("float32", "bfloat16"), ("float32", "float16")]
               if low in peaks and high in peaks)  # fmt: skip
    assert p.compute.launch_floor < 1e-4
    # The ramp stays under the floor, so small elementwise ops are priced by the floor (compute.py docstring).
    assert p.compute.efficiency_half_time <= p.compute.launch_floor


def test_profiles_carry_the_published_reference_figures() -> None:
    a100, h100, v100 = load_profile("a100x8"), load_profile("h100x8"), load_profile("v100x8")
    assert a100.intra_node.bus_bandwidth.all_reduce == pytest.approx(230e9)
    assert dict(a100.compute.peak_flops)["bfloat16"] == pytest.approx(312e12)
    assert a100.inter_node.nics_per_node * a100.inter_node.nic_bandwidth == pytest.approx(8 * 200e9 / 8)
    assert h100.intra_node.bus_bandwidth.all_reduce == pytest.approx(480e9)
    assert h100.intra_node.bus_bandwidth.all_gather == pytest.approx(370e9)
    assert h100.inter_node.nic_bandwidth == pytest.approx(400e9 / 8)  # 400 Gb/s in bytes
    assert v100.inter_node.nics_per_node * v100.inter_node.nic_bandwidth == pytest.approx(25e9 / 8)
    assert "bfloat16" not in dict(v100.compute.peak_flops)


@pytest.mark.parametrize("name", [n for n in BUNDLED if re.search(r"\d+GB", load_profile(n).device)])
def test_gpu_capacity_is_what_cuda_allocates_not_the_nominal_size(name: str) -> None:
    """A plan fills the budget: it must be CUDA's totalGlobalMem (``torch.cuda.get_device_properties().total_memory``),
    which is below the size in the device's name (nvidia-smi's 81920 MiB on an A100 80GB is not allocatable)."""
    profile = load_profile(name)
    nominal = int(re.search(r"(\d+)GB", profile.device).group(1)) * 2**30  # type: ignore[union-attr]
    assert profile.memory.capacity < nominal
    source = dict(profile.sources)["memory.capacity"]
    assert "totalGlobalMem" in source or source.startswith("measured"), source


def test_unknown_bundled_name_is_none() -> None:
    assert hardware_profiles.profile_resource("tpu_v9") is None
    assert hardware_profiles.profile_resource("a100x8.json") is not None


@pytest.mark.parametrize(
    "module",
    [
        "hardware_profiles",
        "cost_models",
        "cost_models.profile",
        "cost_models.compute",
        "cost_models.collectives",
        "cost_models.memory",
        "autoshard.cluster",
    ],
)
def test_docstring_examples_run(module: str) -> None:
    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
    assert result.attempted > 0
