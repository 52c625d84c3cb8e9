"""Training and checkpoints under autoshard equal single-device training; failures are reported, not hidden."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from runtime_cases import GPT2_MEGATRON, model, plan
from torch.utils import _pytree as pytree

from autoshard.codegen import collectives as coll
from autoshard.codegen import (
    full_state_dict,
    gather_outputs,
    load_full_state_dict,
    parallel_info,
    parallelize,
    shard_inputs,
)
from autoshard.codegen.shard import local_piece
from autoshard.plans import Plan
from autoshard.runtime.launch import launch
from autoshard.runtime.verify import main, verify

STEPS = 3
TRAIN_CASES = {
    # FSDP over both axes of a 2 x 2 mesh: sharded weights, replicated norms
    "llama-fsdp-2x2": (
        "llama",
        4,
        (2, 2),
        (("*_proj", ((2, 1, 1), (1, 1))), ("*_proj.weight", ("S(0)", "S(0)"))),
    ),
    # Megatron with the loss in the graph and GPT-2's tied embedding / LM head
    "gpt2-megatron-2": ("gpt2", 2, None, tuple(GPT2_MEGATRON.items())),
}


def _batches(name: str) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    m, gen = model(name), torch.Generator().manual_seed(1)
    draw = lambda t: torch.randint(0, 512, t.shape, generator=gen)  # noqa: E731
    return [(tuple(map(draw, m.args)), {k: draw(v) for k, v in m.kwargs.items()}) for _ in range(STEPS)]


def _tensors(outputs: Any) -> list[torch.Tensor]:
    """A model's outputs (a tensor, a tuple, a Hugging Face ModelOutput) as a flat list of tensors."""
    return [t for t in pytree.tree_leaves(outputs) if isinstance(t, torch.Tensor)]


def _out_grads(name: str) -> list[torch.Tensor]:
    """A fixed random gradient per model output: the loss is ``sum(output * grad)``."""
    m, gen = model(name), torch.Generator().manual_seed(2)
    with torch.no_grad():
        outs = _tensors(m.model(*m.args, **m.kwargs))
    return [torch.randn(o.shape, generator=gen, dtype=o.dtype) for o in outs]


def _single_device(name: str) -> dict[str, torch.Tensor]:
    reference = copy.deepcopy(model(name).model)
    opt = torch.optim.Adam(reference.parameters(), lr=1e-2)
    grads = _out_grads(name)
    for args, kwargs in _batches(name):
        opt.zero_grad()
        torch.autograd.backward(_tensors(reference(*args, **kwargs)), grads)
        opt.step()
    return {k: v.detach().clone() for k, v in reference.state_dict().items()}


def _train(name: str, p: Plan) -> tuple[dict[str, torch.Tensor], list[torch.Tensor]]:
    m = model(name)
    module = parallelize(m.model, p, m.args, m.kwargs, captured=m.captured)
    coord = parallel_info(module).comm.coord
    specs = [spec for spec, _ in parallel_info(module).outputs]
    opt = torch.optim.Adam(module.parameters(), lr=1e-2)
    grads = [
        local_piece(g, spec, p.mesh_shape, coord) for g, spec in zip(_out_grads(name), specs, strict=True)
    ]
    for args, kwargs in _batches(name):
        opt.zero_grad()
        torch.autograd.backward(_tensors(module(*shard_inputs(p, *args, **kwargs))), grads)
        opt.step()
    trained = full_state_dict(module)
    # checkpoint round trip: the initial weights back in, the initial outputs back out
    load_full_state_dict(module, m.model.state_dict())
    with torch.no_grad():
        first = _tensors(module(*shard_inputs(p, *m.args, **m.kwargs)))
    return trained, list(gather_outputs(module, tuple(first)))


def _named(key: str) -> Callable[[str], str]:
    return lambda message: f"{key}: {message}"


@pytest.mark.parametrize("case", sorted(TRAIN_CASES))
def test_three_adam_steps_equal_single_device_training(case: str) -> None:
    name, nproc, mesh, annotations = TRAIN_CASES[case]
    p = plan(name, nproc, mesh, annotations)
    trained, restored = launch(_train, nproc, name, p)[0]
    want = _single_device(name)
    initial = model(name).model.state_dict()
    assert set(trained) == set(want)  # every name, tied ones included
    assert any(not torch.equal(v, initial[k]) for k, v in want.items())  # the steps did change the weights
    # Adam divides by sqrt(v) + 1e-8: a gradient that is zero in exact arithmetic (GPT-2's key bias) but 1e-16
    # of rounding noise moves a weight by lr * 1e-8; any real difference moves it by ~lr = 1e-2
    for key, value in want.items():
        torch.testing.assert_close(trained[key], value, rtol=1e-7, atol=1e-8, msg=_named(key))
    m = model(name)
    with torch.no_grad():
        for got, ref in zip(restored, _tensors(m.model(*m.args, **m.kwargs)), strict=True):
            torch.testing.assert_close(got, ref, rtol=1e-9, atol=1e-11)


def test_verify_reports_a_wrong_collective(monkeypatch: pytest.MonkeyPatch) -> None:
    """An all-reduce that forgets to reduce: verify must say MISMATCH, not OK."""

    def keep_own(x: torch.Tensor, step: Any, comm: Any) -> tuple[torch.Tensor, int]:
        return x.clone(), x.numel() * x.element_size()

    monkeypatch.setitem(coll._RUNNERS, "all_reduce", keep_own)  # inherited by the forked ranks
    m = model("mlp")
    p = plan("mlp", 2, None, (("x", ("R",)), ("fc1", ((1, 1), (2, 1))), ("fc2", ((1, 2), (1, 2)))))
    report = verify(m.model, m.args, plan=p, captured=m.captured)
    assert not report.ok
    assert not all(d.ok for d in report.outputs)
    assert "MISMATCH" in str(report) and "FAIL" in str(report)


def test_cli_entry_verifies_a_model_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "tiny.py"
    spec.write_text(
        "import torch\n"
        "from autoshard.zoo import MLP\n"
        "def make():\n"
        "    torch.manual_seed(0)\n"
        "    return MLP(8, 16), torch.randn(4, 8)\n"
    )
    code = main(["--model", f"{spec}:make", "--nproc", "2", "--annotate", "x=S(0)"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "OK" in out and "forward all_gather" in out
