"""Emitted modules on real gloo ranks (2 and 4, and a 2 x 2 mesh) against the single-device model, float64:
every output and parameter gradient, the collectives each rank ran against the plan, and the ranks against
each other (``autoshard.verify`` does all three)."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
from runtime_cases import GPT2_DP, GPT2_MEGATRON, LLAMA_MEGATRON, model, plan

from autoshard.runtime.verify import verify
from autoshard.strategies import UnsupportedOpWarning

# id: (model, nproc, mesh, annotations, collectives that must appear)
CASES: dict[str, tuple[str, int, tuple[int, ...] | None, dict[str, Any], set[str]]] = {
    "seed-free-2": ("seed", 2, None, {}, set()),
    "seed-vocab-megatron-2": (
        "seed", 2, None,
        {"ids": ("S(0)",), "embed": "vocab", "proj": ((1, 1, 1), (2, 1)), "head": ((1, 1, 2), (1, 2))},
        {"forward all_reduce", "backward all_reduce"},
    ),
    "mlp-megatron-2": ("mlp", 2, None, {"x": ("R",), "fc1": ((1, 1), (2, 1)), "fc2": ((1, 2), (1, 2))},
                       {"forward all_reduce", "backward all_reduce"}),
    "mlp-megatron-4": ("mlp", 4, None, {"x": ("R",), "fc1": ((1, 1), (4, 1)), "fc2": ((1, 4), (1, 4))},
                       {"forward all_reduce", "backward all_reduce"}),
    # Megatron over both axes of a 2 x 2 mesh (nested shards), the input gathered over axis 0 first
    "mlp-megatron-2x2": ("mlp", 4, (2, 2), {"x": ("S(0)", "R"), "fc1": ((1, 1), (4, 1)), "fc2": ((1, 4), (1, 4))},
                         {"forward all_gather", "forward all_reduce", "backward all_reduce"}),
    "mlp-dp-4": ("mlp", 4, None, {"fc1": ((4, 1), (1, 1)), "fc2": ((4, 1), (1, 1))}, {"backward all_reduce"}),
    "mlp-free-4": ("mlp", 4, None, {"x": ("S(0)",)}, {"forward all_gather"}),
    "inplace-all-to-all-2": ("inplace", 2, None, {"fc1": ((2, 1), (1, 1)), "fc2": ((1, 2), (1, 2))},
                             {"forward all_to_all", "backward all_to_all"}),
    "gpt2-megatron-2": ("gpt2", 2, None, GPT2_MEGATRON, {"forward all_reduce", "backward all_reduce"}),
    "gpt2-dp-4": ("gpt2", 4, None, GPT2_DP, {"backward all_reduce"}),
    "llama-megatron-2": ("llama", 2, None, LLAMA_MEGATRON, {"forward all_reduce", "backward all_reduce"}),
    "llama-fsdp-4": ("llama", 4, None, {"*_proj": ((4, 1, 1), (1, 1)), "*_proj.weight": ("S(0)",)},
                     {"forward all_gather", "backward reduce_scatter"}),
    "llama-fsdp-2x2": ("llama", 4, (2, 2), {"*_proj": ((2, 1, 1), (1, 1)), "*_proj.weight": ("S(0)", "S(0)")},
                       {"forward all_gather", "backward reduce_scatter"}),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(CASES))
def test_emitted_module_matches_single_device(case: str) -> None:
    name, nproc, mesh, annotations, must = CASES[case]
    m = model(name)
    p = plan(name, nproc, mesh, tuple(annotations.items()))
    # a case that forces no collective (must == set()) checks replication on purpose
    report = verify(
        m.model, m.args, m.kwargs, plan=p, captured=m.captured, name=case, allow_replicated=not must
    )
    assert report.ok, str(report)
    assert report.emitted == report.planned and report.ranks_agree
    assert must <= set(report.emitted), f"the forced plan lost its collectives: {report.emitted}"
    assert len(report.grads) == len(list(m.model.parameters()))
    assert max(d.max_abs for d in report.outputs) < 1e-9


def test_ops_without_rules_run_replicated_and_stay_right() -> None:
    m = model("unsupported")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        p = plan("unsupported", 2, None, (("fc1", ((2, 1), (1, 1))), ("fc2", ((2, 1), (1, 1)))))
    assert any(issubclass(w.category, UnsupportedOpWarning) and "roll" in str(w.message) for w in caught)
    report = verify(m.model, m.args, plan=p, captured=m.captured, name="unsupported")
    assert report.ok, str(report)
    assert {"forward all_gather", "backward all_reduce"} <= set(report.emitted)
