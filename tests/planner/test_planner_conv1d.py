"""``"column"`` / ``"row"`` on GPT-2's ``Conv1D`` (weight stored ``[in, out]``, run as ``addmm(bias, x, w)``)
work as on ``nn.Linear``: column splits the output features (weight dim 1, bias too), row the input features
(weight dim 0, bias whole, added once after the reduce).  Found by a new user: planning with
``{"*.c_attn": "column", "*.c_proj": "row"}`` failed with "addmm ... has no column-parallel strategy".
And a strategy tuple for ``addmm`` names its tensors in the op's own order: bias, input, weight."""

from __future__ import annotations

import functools

import pytest
import torch

import autoshard
from autoshard import zoo
from autoshard.capture import capture
from autoshard.errors import AnnotationError
from autoshard.runtime.verify import cluster_for, verify

MEGATRON = {"*.c_attn": "column", "*.c_fc": "column", "*.c_proj": "row"}  # attn.c_proj and mlp.c_proj
# the same layout as split tuples in addmm's own order: (bias, input, weight [in, out])
TUPLES = {
    "*.c_attn": ((2,), (1, 1), (1, 2)),
    "*.attn.c_proj": ((1,), (1, 2), (2, 1)),
    "*.c_fc": ((2,), (1, 1), (1, 2)),
    "*.mlp.c_proj": ((1,), (1, 2), (2, 1)),
}


@functools.cache
def _gpt2():
    """Tiny GPT-2 (2 layers) in float64 with labels, captured once."""
    torch.manual_seed(0)
    case = zoo.build("gpt2-tiny", batch=4, seq=8)
    model = case.model.to(torch.float64)
    kwargs = {"labels": torch.zeros(4, 8, dtype=torch.long)}
    return model, case.args, kwargs, capture(model, case.args, kwargs, blocks="full")


def _plan(annotations, mesh: tuple[int, ...] | None = None) -> autoshard.Plan:
    model, args, kwargs, captured = _gpt2()
    cluster = cluster_for("cpu", 2 if mesh is None else 4, mesh)
    return autoshard.plan(model, cluster, args, kwargs, captured=captured, annotations=annotations)


def test_column_row_on_conv1d_is_megatron() -> None:
    plan = _plan(MEGATRON)
    addmms = {n.module: n.strategy for n in plan.nodes if n.target == "aten.addmm.default"}
    # addmm(bias, x, weight): column S(0), R, S(1) -> S(1); row R, S(1), S(0) -> P (layer 1 shares layer 0's)
    h = "transformer.h.0"
    assert addmms[f"{h}.attn.c_attn"] == addmms[f"{h}.mlp.c_fc"] == "S(0), R, S(1) -> S(1)"
    assert addmms[f"{h}.attn.c_proj"] == addmms[f"{h}.mlp.c_proj"] == "R, S(1), S(0) -> P"
    stored = plan.param_placements
    assert (
        stored["transformer.h.0.attn.c_attn.weight"] == stored["transformer.h.1.mlp.c_fc.weight"] == ("S(1)",)
    )
    assert stored["transformer.h.0.attn.c_attn.bias"] == ("S(0)",)
    assert stored["transformer.h.0.mlp.c_proj.weight"] == ("S(0)",)
    assert stored["transformer.h.0.mlp.c_proj.bias"] == ("R",)
    assert plan.collective_counts("forward")["all_reduce"] == 4  # one per row projection per layer
    # priced exactly as the same layout written as split tuples
    assert plan.predicted_step_time == pytest.approx(_plan(TUPLES).predicted_step_time)
    assert plan.pinned == ("annotations",) and plan.unpinned_step_time is not None


def test_conv1d_pattern_holds_on_every_axis_of_a_2d_mesh() -> None:
    plan = _plan({"*.c_attn": "column@0", "*.mlp.c_proj": "row"}, mesh=(2, 2))
    stored = plan.param_placements
    assert stored["transformer.h.0.attn.c_attn.weight"][0] == "S(1)"  # column@0: output features, axis 0
    assert set(stored["transformer.h.0.attn.c_attn.weight"]) <= {"S(1)", "R"}
    assert stored["transformer.h.0.mlp.c_proj.weight"][1] == "S(0)"  # row: input features, last axis
    assert set(stored["transformer.h.0.mlp.c_proj.weight"]) <= {"S(0)", "R"}


@pytest.mark.parametrize(
    ("tuples", "said"),
    [
        # numbered as for linear (input, weight): the bias comes first in addmm
        (((1, 1), (1, 2)), r"takes its tensors in its own order "
         r"\(bias \(192,\), input \(32, 64\), weight \(64, 192\)\)"),
        (((1,), (1, 1), (1, 2), (1,)), r"one split tuple per tensor in that order"),
        (((1,), (2, 1), (1, 2)), r"whose tensors are \(bias .*, input .*, weight .*\) in that order; valid ones "
                                 r"include .*\(\(2,\), \(1, 1\), \(1, 2\)\)"),
    ],
)  # fmt: skip
def test_addmm_tuples_are_read_in_the_ops_own_order(tuples, said) -> None:
    with pytest.raises(AnnotationError, match=said):
        _plan({"*.c_attn": tuples})


def test_conv1d_megatron_matches_eager_on_two_gloo_ranks() -> None:
    model, args, kwargs, captured = _gpt2()
    report = verify(model, args, kwargs, plan=_plan(MEGATRON), captured=captured, name="gpt2-conv1d-megatron")
    assert report.ok, str(report)
    assert report.emitted == report.planned and report.ranks_agree
    assert {"forward all_reduce", "backward all_reduce"} <= set(report.emitted), report.emitted
    assert len(report.grads) == len(list(model.parameters()))
    assert max(d.max_abs for d in report.outputs) < 1e-9


class _Mixed(torch.nn.Module):
    """A Conv1D (``[in, out]``) feeding an nn.Linear (``[out, in]``): one pattern, each weight's own dims."""

    def __init__(self) -> None:
        from transformers.pytorch_utils import Conv1D

        super().__init__()
        self.up, self.down = Conv1D(32, 8), torch.nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


def test_conv1d_column_into_linear_row() -> None:
    with torch.device("meta"):
        model = _Mixed()
    x = torch.zeros(4, 6, 8, device="meta")
    plan = autoshard.plan(
        model, cluster_for("cpu", 2, None), (x,), annotations={"up": "column", "down": "row"}
    )
    stored = plan.param_placements
    assert (stored["up.weight"], stored["up.bias"]) == (("S(1)",), ("S(0)",))  # Conv1D: output features dim 1
    assert (stored["down.weight"], stored["down.bias"]) == (("S(1)",), ("R",))  # Linear: input features dim 1
    assert plan.collective_counts("forward") == {
        "all_reduce": 1
    }  # Megatron: one all-reduce, nothing gathered
