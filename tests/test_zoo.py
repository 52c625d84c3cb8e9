"""The model zoo: every name builds, specs load from files, bad names fail helpfully."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from autoshard import zoo
from autoshard.errors import AutoshardError

TINY = {"seed", "mlp-deep", "gpt2-tiny", "llama-tiny", "bert-tiny", "mixtral-tiny"}
PARAMS = {  # published parameter counts, millions (Mixtral: 46.7 B)
    "gpt2": 124.4,
    "gpt2-medium": 354.8,
    "gpt2-large": 774.0,
    "gpt2-xl": 1557.6,
    "llama3-8b": 8030.3,
    "llama3-70b": 70553.7,
    "mixtral-8x7b": 46702.8,
    "mlp": 536.9,
}


def test_names() -> None:
    assert set(zoo.names()) == TINY | set(PARAMS) | {"bert-base", "bert-large", "llama3-405b"}


@pytest.mark.parametrize("name", zoo.names())
def test_every_name_builds(name: str) -> None:
    case = zoo.build(name)
    params = list(case.model.parameters())
    device = "cpu" if name in TINY else "meta"
    assert {p.device.type for p in params} == {device}
    assert case.name == name and case.description
    assert not case.model.training  # eval: no dropout in the graph
    assert isinstance(case.args, tuple) and all(a.device.type == device for a in case.args)
    if name in PARAMS:
        assert sum(p.numel() for p in params) / 1e6 == pytest.approx(PARAMS[name], abs=0.1)


def test_shapes_from_reference() -> None:
    llama = zoo.build("llama3-70b").model
    cfg = llama.config
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads) == (
        8192,
        80,
        64,
        8,
    )
    assert (cfg.intermediate_size, cfg.vocab_size, cfg.rope_parameters["rope_theta"]) == (
        28672,
        128256,
        500000.0,
    )
    assert cfg.use_cache is False and cfg._attn_implementation == "sdpa"
    mixtral = zoo.build("mixtral-8x7b").model.config
    assert (mixtral.vocab_size, mixtral.num_local_experts, mixtral.num_experts_per_tok) == (32000, 8, 2)
    assert mixtral._experts_implementation == "grouped_mm"
    bert = zoo.build("bert-large").model.config
    assert (bert.hidden_size, bert.num_hidden_layers, bert.intermediate_size, bert.vocab_size) == (
        1024,
        24,
        4096,
        30522,
    )


def test_defaults_and_overrides() -> None:
    seed = zoo.build("seed")
    assert seed.args[0].shape == (2048, 512) and seed.args[0].dtype == torch.int64
    mlp = zoo.build("mlp")
    assert mlp.args[0].shape == (1, 1024, 8192) and mlp.args[0].dtype == torch.float32
    deep = zoo.build("mlp-deep", layers=5, batch=4)
    assert len(deep.model.layers) == 5 and deep.args[0].shape == (4, 256)
    llama = zoo.build("llama3-8b", batch=2, seq=128, layers=3, dtype=torch.float32)
    assert llama.args[0].shape == (2, 128) and len(llama.model.model.layers) == 3
    assert next(llama.model.parameters()).dtype == torch.float32
    assert next(zoo.build("llama3-8b").model.parameters()).dtype == torch.bfloat16
    tiny_on_meta = zoo.build("gpt2-tiny", device="meta")
    assert next(tiny_on_meta.model.parameters()).is_meta
    with pytest.raises(ValueError, match="positive"):
        zoo.build("seed", batch=0)


def test_model_case_is_frozen() -> None:
    case = zoo.build("mlp-deep")
    with pytest.raises(dataclasses.FrozenInstanceError):
        case.name = "other"  # type: ignore[misc]


def test_tiny_models_run() -> None:
    for name in ("gpt2-tiny", "llama-tiny", "bert-tiny", "mixtral-tiny"):
        case = zoo.build(name)
        with torch.no_grad():
            out = case.model(*case.args, **case.kwargs)
        assert torch.isfinite(out.logits.float()).all(), name


def test_unknown_name_lists_valid_names() -> None:
    with pytest.raises(zoo.UnknownModelError) as info:
        zoo.build("llama4-400b")
    assert isinstance(info.value, AutoshardError)
    assert (
        "llama4-400b" in str(info.value)
        and "llama3-70b" in str(info.value)
        and "gpt2-tiny" in str(info.value)
    )
    with pytest.raises(AutoshardError, match="valid names"):
        zoo.load_spec("nope")


def test_load_spec_from_file(tmp_path: Path) -> None:
    path = tmp_path / "my_models.py"
    path.write_text(
        "import torch\n"
        "from torch import nn\n"
        "def two():\n"
        "    return nn.Linear(4, 2), torch.zeros(3, 4)\n"
        "def three():\n"
        "    return nn.Linear(4, 2), (torch.zeros(3, 4),), {'extra': 1}\n"
        "def bad():\n"
        "    return 42\n"
    )
    case = zoo.load_spec(f"{path}:two")
    assert isinstance(case.model, torch.nn.Linear) and case.args[0].shape == (3, 4) and case.kwargs == {}
    assert case.name == f"{path}:two"
    assert zoo.load_spec(f"{path}:three").kwargs == {"extra": 1}
    assert zoo.load_spec("llama-tiny").name == "llama-tiny"
    with pytest.raises(zoo.UnknownModelError, match="must return"):
        zoo.load_spec(f"{path}:bad")
    with pytest.raises(zoo.UnknownModelError, match="defines no function 'missing'"):
        zoo.load_spec(f"{path}:missing")
    with pytest.raises(zoo.UnknownModelError, match="no such file"):
        zoo.load_spec(f"{tmp_path / 'absent.py'}:two")


def test_importing_the_zoo_does_not_import_transformers() -> None:
    code = "import sys, autoshard.zoo; assert 'transformers' not in sys.modules, 'transformers imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[1])
