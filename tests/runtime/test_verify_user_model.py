"""``verify`` of a user's model built on meta: a Hugging Face model is rebuilt small from its own config (its
class, 2 layers, the scaled sizes) and the real-size plan mapped onto it; a plain ``nn.Module`` on meta has
nothing to rebuild from and is refused in one line saying what to pass instead (new-user trial)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import autoshard
from autoshard.cli import main
from autoshard.errors import AutoshardError
from autoshard.runtime.scaled import scale_hf
from autoshard.runtime.verify import cluster_for
from autoshard.zoo import ModelCase, load_spec

USER = """
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM


def llama():
    config = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=8,
                         num_key_value_heads=2, vocab_size=1024, tie_word_embeddings=False, use_cache=False)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    return model, (torch.zeros(8, 32, dtype=torch.long, device="meta"),)


def plain():
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64))
    return model, (torch.zeros(8, 64, device="meta"),)
"""


def _meta_llama(kv: int) -> LlamaForCausalLM:
    config = LlamaConfig(hidden_size=512, intermediate_size=1024, num_hidden_layers=6, num_attention_heads=8,
                         num_key_value_heads=kv, vocab_size=4096, use_cache=False, attention_dropout=0.1)  # fmt: skip
    with torch.device("meta"):
        return LlamaForCausalLM(config)


@pytest.mark.parametrize(("kv", "small_kv"), [(2, 8), (8, 16), (1, 1)])
def test_a_hf_model_is_rebuilt_small_from_its_config(kv: int, small_kv: int) -> None:
    """GQA stays GQA, multi-head stays multi-head, multi-query stays multi-query; two layers, real weights."""
    ids = torch.zeros(4, 256, dtype=torch.long, device="meta")
    case = scale_hf(ModelCase("mine", _meta_llama(kv), (ids,), {"labels": ids}))
    config = case.model.config
    assert type(case.model) is LlamaForCausalLM and config.num_hidden_layers == 2
    assert (config.hidden_size, config.num_attention_heads, config.num_key_value_heads) == (128, 16, small_kv)
    assert config.head_dim == 8 and config.vocab_size == 512 and config.attention_dropout == 0.0
    assert all(p.device.type == "cpu" and p.dtype == torch.float32 for p in case.model.parameters())
    assert case.args[0].shape == case.kwargs["labels"].shape == (8, 16)


def test_inputs_that_are_not_tokens_are_refused() -> None:
    embeds = torch.zeros(4, 256, 512, device="meta")
    with pytest.raises(AutoshardError, match=r"input inputs_embeds of shape .* return a small copy"):
        scale_hf(ModelCase("mine", _meta_llama(2), (), {"inputs_embeds": embeds}))


def _plan(spec: str, path: Path) -> Path:
    case = load_spec(spec)
    plan = autoshard.plan(case.model, cluster_for("cpu", 4, (2, 2)), case.args, case.kwargs)
    plan.save(path)
    return path


@pytest.mark.slow
def test_verify_maps_a_meta_hf_plan_onto_a_small_rebuild(tmp_path: Path, capsys) -> None:
    (tmp_path / "mine.py").write_text(USER)
    spec = f"{tmp_path / 'mine.py'}:llama"
    plan = _plan(spec, tmp_path / "plan.json")
    assert main(["verify", "--plan", str(plan), "--model", spec]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"verify {spec} on mesh (2, 2) (float32): OK"), lines[0]
    assert "mapped onto a scaled-down copy on mesh (2, 2)" in lines[1]
    counts = next(line for line in lines if line.startswith("collectives per step: "))
    emitted, planned = counts.removeprefix("collectives per step: ").split(" (plan: ")
    assert emitted == planned.rstrip(")") and "all_reduce" in emitted  # collectives ran, as priced


def test_a_plain_module_on_meta_says_what_to_pass(tmp_path: Path, capsys) -> None:
    (tmp_path / "mine.py").write_text(USER)
    spec = f"{tmp_path / 'mine.py'}:plain"
    plan = _plan(spec, tmp_path / "plan.json")
    assert main(["verify", "--plan", str(plan), "--model", spec]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "builds a Sequential on the meta device" in err[0]
    assert "pass --model path/to/file.py:function returning a small copy with real weights" in err[0]
