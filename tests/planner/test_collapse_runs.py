"""Every repeated run collapsed, not only one stack per graph (issue 16): encoder and decoder towers (T5) and
blocks held as numbered attributes (``self.layer0``, ``self.layer1``, ..).

The further runs stay in the graph and share block 0's solver variables; the plan lists every node.  The
collapsed optimum mapped onto the uncollapsed problem costs exactly what the collapsed problem claimed, and
equals the uncollapsed optimum.
"""

from __future__ import annotations

import functools

import pytest
import torch
import transformers
from torch import nn

import autoshard
from autoshard.capture import Captured, capture
from autoshard.capture.meta import META_RUN
from autoshard.codegen.assign import assign_strategies
from autoshard.problem.build import BuiltProblem, build_problem
from autoshard.problem.costs import CostOptions
from autoshard.search import evaluate, solve
from tests.planner.test_planner_costs import solver_optimum_step


def tiny_t5(layers: int = 4) -> tuple[nn.Module, tuple[torch.Tensor], dict[str, torch.Tensor]]:
    config = transformers.T5Config(
        vocab_size=64, d_model=16, d_kv=4, d_ff=32, num_layers=layers, num_decoder_layers=layers, num_heads=4,
        dropout_rate=0.0, use_cache=False, relative_attention_num_buckets=8,
    )  # fmt: skip
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = transformers.T5ForConditionalGeneration(config).eval()
    ids = torch.zeros(8, 6, dtype=torch.long)
    return model, (ids,), {"decoder_input_ids": ids.clone()}  # distinct tensors, as verify feeds them


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


class AttributeBlocks(nn.Module):
    """Identical blocks held as plain attributes ``layer0 .. layer3``, called one by one."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.embed = nn.Linear(width, width)
        self.layer0, self.layer1, self.layer2, self.layer3 = (Block(width) for _ in range(4))
        self.head = nn.Linear(width, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        x = self.layer3(self.layer2(self.layer1(self.layer0(x))))
        return self.head(x)


def _uncollapsed(cap):
    """The same capture with its further runs forgotten: every block's nodes are variables of their own."""
    for node in cap.graph_module.graph.nodes:
        node.meta.pop(META_RUN, None)
    return cap


def _map_choice(small: BuiltProblem, big: BuiltProblem, choice) -> list[int]:
    """The collapsed choice on the uncollapsed problem: the variable a node shares, else its own."""
    chosen = dict(zip(small.variables, choice, strict=True))
    mapped = []
    for name in big.variables:
        source = small.template[name]
        assert [str(s) for s in small.strategies[source]] == [str(s) for s in big.strategies[name]]
        mapped.append(chosen[source])
    return mapped


@functools.cache
def _t5_captures() -> tuple[Captured, Captured]:
    """Tiny T5 captured (runs collapsed) and captured again with its runs forgotten, once for every test here:
    building a problem or planning leaves a capture as it is."""
    model, args, kwargs = tiny_t5(4)
    return capture(model, args, kwargs), _uncollapsed(capture(model, args, kwargs))


def _exact(
    collapsed_cap: Captured, full_cap: Captured, cluster, opts: CostOptions | None = None
) -> tuple[BuiltProblem, float]:
    opts = opts or CostOptions()
    collapsed = build_problem(collapsed_cap, cluster, opts)
    full = build_problem(full_cap, cluster, opts)
    assert collapsed.runs and not full.runs
    assert len(collapsed.variables) < len(full.variables)
    solution = solve(collapsed.problem)
    assert solution.optimal
    on_full = evaluate(
        full.problem,
        full.full_choice(_map_choice(collapsed, full, solution.choice[: len(collapsed.variables)])),
    )
    assert on_full == pytest.approx(solution.objective, rel=1e-9)
    best_full = solve(full.problem)
    assert best_full.optimal
    assert best_full.objective == pytest.approx(on_full, rel=1e-9)
    return collapsed, solution.objective


def test_t5_collapses_both_towers() -> None:
    cap = _t5_captures()[0]
    assert cap.blocks is not None and (cap.blocks.prefix, cap.blocks.first, cap.blocks.captured_blocks) == (
        "decoder.block",
        1,
        2,
    )
    assert [r.blocks for r in cap.runs] == [("encoder.block.1", "encoder.block.2", "encoder.block.3")]


def test_attribute_blocks_are_a_run() -> None:
    cap = capture(AttributeBlocks(), (torch.randn(8, 16),))
    assert cap.blocks is None
    assert [r.blocks for r in cap.runs] == [("layer0", "layer1", "layer2", "layer3")]


class CalledTwice(AttributeBlocks):
    """The same modules, but ``layer2`` runs twice: its graph differs from the others'."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layer1(self.layer0(self.embed(x)))
        return self.head(self.layer3(self.layer2(self.layer2(x))))


def test_blocks_that_differ_in_the_graph_are_not_collapsed() -> None:
    cap = capture(CalledTwice(), (torch.randn(8, 16),))
    assert cap.runs == ()
    assert any("layer0.. not collapsed" in n for n in cap.notes), cap.notes


@pytest.mark.parametrize("mesh", [(8,), (2, 4)])
def test_t5_collapsed_optimum_is_exact_on_the_uncollapsed_problem(mesh) -> None:
    cluster = autoshard.load_cluster("a100x8", mesh=mesh)
    _exact(*_t5_captures(), cluster)


@pytest.mark.parametrize("mesh", [(8,), (2, 4)])
def test_attribute_blocks_collapsed_optimum_is_exact(mesh) -> None:
    """Without ZeRO-1: since its optimizer gathers are priced (problem/zero_terms.py), this 16-wide toy's
    optimum on 8 devices splits its first block and replicates the other three (0.67516 ms against 0.67563
    for the best shared choice), a plan collapsing does not consider by design (build.py: exact among plans
    that give identical blocks identical strategies).  Without them every block shares the optimum again."""
    cluster = autoshard.load_cluster("a100x8", mesh=mesh)
    model, x = AttributeBlocks(), torch.randn(64, 16)
    _exact(
        capture(model, (x,)), _uncollapsed(capture(model, (x,))), cluster, CostOptions(shard_optimizer=False)
    )


def test_plan_lists_every_block_of_a_run() -> None:
    """The plan reads as uncollapsed: codegen assigns every node of a full capture its decision."""
    model, args, kwargs = tiny_t5(4)
    plan = autoshard.plan(model, autoshard.load_cluster("a100x8", mesh=(2, 4)), args, kwargs)
    assert any("encoder.block.1..3 share one decision" in n for n in plan.notes), plan.notes
    assert {f"encoder.block.{i}.layer.0.SelfAttention.q.weight" for i in range(4)} <= set(
        plan.param_placements
    )
    strategies = assign_strategies(capture(model, args, kwargs, blocks="full"), plan)
    assert strategies


@pytest.mark.slow
def test_t5_plan_with_a_collapsed_tower_verifies_on_gloo() -> None:
    """Pin the MLP of one encoder block of the run (encoder.block.2) to Megatron column/row: the run shares
    the decision, so every block of it (1..3) runs its all-reduces; block 0 and the decoder are free."""
    from autoshard.runtime.verify import cluster_for, verify

    model, args, kwargs = tiny_t5(4)
    model = model.double()
    mlp = "encoder.block.2.layer.1.DenseReluDense"
    plan = autoshard.plan(
        model, cluster_for("cpu", 2), args, kwargs, annotations={f"{mlp}.wi": "column", f"{mlp}.wo": "row"}
    )
    assert any("encoder.block.1..3 share one decision" in n for n in plan.notes), plan.notes
    for i in (1, 2, 3):
        assert plan.param_placements[f"encoder.block.{i}.layer.1.DenseReluDense.wi.weight"] == ("S(0)",)
        assert plan.param_placements[f"encoder.block.{i}.layer.1.DenseReluDense.wo.weight"] == ("S(1)",)
    report = verify(model, args, kwargs, plan=plan, name="t5")
    assert report.ok, str(report)
    assert report.emitted == report.planned and report.ranks_agree
    # the row-parallel output of each of the run's three MLPs is summed forward, its input gradient backward
    assert report.emitted.get("forward all_reduce", 0) >= 3, report.emitted
    assert report.emitted.get("backward all_reduce", 0) >= 3, report.emitted


def test_check_export_cuts_the_encoder_tower(monkeypatch) -> None:
    """The planned graph holds every encoder block; the 3-block check export of the decoder holds two."""
    import autoshard.capture.export as export

    model, args, kwargs = tiny_t5(5)
    depths: list[tuple[int, int]] = []
    real = export._export

    def counting(m, a, k):
        depths.append((len(m.encoder.block), len(m.decoder.block)))
        return real(m, a, k)

    monkeypatch.setattr(export, "_export", counting)
    cap = capture(model, args, kwargs)
    assert depths == [(5, 3), (3, 4)]  # (encoder, decoder) blocks: block 0 of each is outside its run
    assert any("3 blocks add exactly one block" in n for n in cap.notes), cap.notes
    assert [len(r.blocks) for r in cap.runs] == [4]


@pytest.mark.parametrize("which", ["t5", "attributes"])
def test_plan_figures_are_the_collapsed_objective(which: str) -> None:
    """Every block of a run listed with the shared decision adds up to what the solver priced once.

    Every kind of parallelism forbidden: replicated, these toys' optimum before ZeRO-1's gathers were priced
    (then the step was the objective exactly).  Priced, a replicated plan pays every block's optimizer gathers,
    and the heads now sum their outputs to get a Partial gradient instead (one all-reduce rather than gathers):
    the step then differs from the objective by what of that gradient sync hides or shows (problem/step.py:
    the objective assumes a sync outside the layers does not hide), never by more, and not by the run."""
    model, args, kwargs = tiny_t5(4) if which == "t5" else (AttributeBlocks(), (torch.randn(64, 16),), {})
    cluster = autoshard.load_cluster("a100x8", mesh=(2, 4))
    plan = autoshard.plan(model, cluster, args, kwargs, forbid=("dp", "fsdp", "tp", "sp", "cp", "ep"))
    gathered = {c.module for c in plan.optimizer_gathers}
    assert gathered <= set(plan.param_placements)
    blocks = ("encoder.block.1.", "encoder.block.3.") if which == "t5" else ("layer1.", "layer3.")
    assert all(any(m.startswith(b) for m in gathered) for b in blocks)  # every block of the run pays its own
    sync = plan.grad_sync.seconds if plan.grad_sync is not None else 0.0
    if plan.solver.chosen.split(" = ")[0] == "solver optimum":
        assert abs(plan.predicted_step_time - plan.solver.objective) <= sync + 1e-9
    else:  # the ranking priced a faster candidate than the solver's optimum (planner_candidates): its step
        assert plan.predicted_step_time <= solver_optimum_step(plan) * (1 + 1e-5)  # is of another plan
    hidden = plan.grad_sync.seconds - plan.grad_sync.exposed if plan.grad_sync is not None else 0.0
    step = plan.compute_time + plan.communication_time - hidden  # communication: ZeRO-1's gathers too
    assert step == pytest.approx(plan.predicted_step_time)
    assert set(plan.param_placements) == {name for name, _ in model.named_parameters()}
