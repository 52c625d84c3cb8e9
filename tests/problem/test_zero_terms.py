"""ZeRO-1's optimizer gathers in the solver's objective (problem/zero_terms.py): exact, brute-forced on tiny
problems against the plan's list (problem/zero_gathers.py) that the step pays."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from torch import nn

from autoshard import zoo
from autoshard.capture import capture
from autoshard.placement import ShardingSpec
from autoshard.problem.build import BuiltProblem, build_problem
from autoshard.problem.costs import CostOptions
from autoshard.problem.zero_gathers import gather_pieces, reduced_axes, zero_gathers
from autoshard.runtime.verify import cluster_for
from autoshard.search import SearchProblem, evaluate


class _Tied(nn.Module):
    """One weight read by two products (a tied embedding and head in miniature), one read once, one bias
    read by nothing but an add."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(16, 16))
        self.v = nn.Parameter(torch.randn(16, 16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.linear(x, self.w)
        return torch.nn.functional.linear(torch.relu(h) @ self.v, self.w)


def _built(mesh: tuple[int, ...], **opts: object) -> BuiltProblem:
    captured = capture(_Tied(), (torch.randn(8, 16),), {})
    return build_problem(captured, cluster_for("cpu", math.prod(mesh), mesh), CostOptions(**opts))  # type: ignore[arg-type]


def _zero_only(built: BuiltProblem) -> SearchProblem:
    """The built problem's ZeRO terms alone: node terms, pair edges and the reduced-axes nodes' edges."""
    p, zero = built.problem, built.zero
    assert zero is not None
    costs = [np.zeros(len(c)) for c in p.node_costs]
    index = {name: k for k, name in enumerate(built.variables)}
    zero.add_to(costs, index)
    return SearchProblem(node_costs=tuple(costs), edges=tuple(zero.edges(index)), names=p.names)


def _listed(built: BuiltProblem, choice: dict[str, int]) -> float:
    pick = {n: built.strategies[built.template[n]][choice[built.template[n]]] for n in built.infos}
    return math.fsum(c.seconds for c in zero_gathers(built, pick))


@pytest.mark.parametrize("mesh", [(2,), (2, 2)])
def test_the_objective_pays_exactly_the_listed_gathers_for_every_choice(mesh: tuple[int, ...]) -> None:
    """Every choice of the parameters and their consumers (the rest pay no ZeRO term; on 2 x 2 a sample):
    the terms at the completed choice equal the plan's list, and no state of the auxiliary node is cheaper
    (exactness)."""
    built = _built(mesh)
    zero = built.zero
    assert zero is not None and len(zero.nodes) == 1 and len(zero.pairs) == 1  # w: two uses; v: one
    only = _zero_only(built)
    relevant = sorted(
        {zero.nodes[0].param, *(c for c, _ in zero.nodes[0].uses), zero.pairs[0][0], zero.pairs[0][1]}
    )
    base = dict.fromkeys(built.variables, 0)
    aux = len(built.variables) + len(built.fanouts) + len(built.extras.gathers if built.extras else ())
    checked = priced = 0
    every = itertools.product(*(range(len(built.strategies[v])) for v in relevant))
    rng = np.random.default_rng(0)  # 2 x 2: 810,000 choices; 400 at random (1-D: all 900)
    sample = [tuple(int(rng.integers(len(built.strategies[v]))) for v in relevant) for _ in range(400)]
    for picks in every if len(mesh) == 1 else sample:
        choice = base | dict(zip(relevant, picks, strict=True))
        full = built.full_choice([choice[v] for v in built.variables])
        got = evaluate(only, full)
        assert got == pytest.approx(_listed(built, choice), rel=1e-12, abs=1e-18)
        states = len(zero.nodes[0].states)
        best = min(evaluate(only, (*full[:aux], s)) for s in range(states))
        assert got == pytest.approx(best, rel=1e-12, abs=1e-18)
        checked, priced = checked + 1, priced + (got > 0)
    assert checked > 100 and 0 < priced < checked  # some choices reduce every replicated axis, some do not


def test_a_gather_is_sized_as_the_runtime_gathers_it() -> None:
    """Innermost axis first, each gather's buffer the piece gathered so far: the size of one axis's gather
    does not depend on whether the other axis is reduced."""
    assert gather_pieces(1024.0, ShardingSpec.parse("(R, R)"), (2, 4)) == ((1, 512.0), (0, 1024.0))
    assert gather_pieces(1024.0, ShardingSpec.parse("(R, S(0))"), (2, 4)) == ((0, 256.0),)
    assert gather_pieces(1024.0, ShardingSpec.parse("(S(0), S(1))"), (2, 4)) == ()
    # the axes every use reduces: one use with a replicated gradient keeps the axis gathered
    both, one = ShardingSpec.parse("(P, P)"), ShardingSpec.parse("(P, R)")
    assert reduced_axes([both, one]) == frozenset({0}) and reduced_axes([]) == frozenset()


def test_without_sharded_optimizer_or_training_there_is_nothing_to_pay() -> None:
    for opts in ({"shard_optimizer": False}, {"training": False}):
        built = _built((2,), **opts)
        assert built.zero is not None and not (built.zero.pairs or built.zero.nodes or built.zero.node_terms)


def test_a_replicated_choice_pays_the_gathers_the_runtime_runs() -> None:
    """The defect: a fully replicated plan claimed sharded optimizer state at no communication.  Priced, the
    replicated choice of every node pays an all-gather per weight, as the plan lists them."""
    built = _built((2,))
    only = _zero_only(built)
    replicated = {
        v: k
        for v in built.variables
        for k, s in reversed(list(enumerate(built.strategies[v])))
        if all(spec is None or spec.is_replicated() for spec in (*s.inputs, *s.outputs))
    }
    choice = dict.fromkeys(built.variables, 0) | replicated
    full = built.full_choice([choice[v] for v in built.variables])
    pick = {n: built.strategies[built.template[n]][choice[built.template[n]]] for n in built.infos}
    assert {c.module for c in zero_gathers(built, pick)} == {"w", "v"}
    listed = _listed(built, choice)
    assert listed > 0 and evaluate(only, full) == pytest.approx(listed, rel=1e-12)


def test_on_a_moe_the_terms_add_no_node_and_no_neighbour() -> None:
    """Mixtral-tiny op by op (the capture whose plan slowed 7x after these terms; the cause was elsewhere,
    autoshard/planner_experts.py): every weight has one use, so each gather is a pair on an edge the problem
    already has.  Same nodes and the same neighbours: the same elimination width and tables."""
    case = zoo.build("mixtral-tiny")
    captured = capture(case.model, case.args, dict(case.kwargs), fuse_experts=False)
    cluster = cluster_for("cpu", 4, (2, 2))
    priced, free = (build_problem(captured, cluster, CostOptions(shard_optimizer=z)) for z in (True, False))
    assert priced.zero is not None and priced.zero.pairs and not priced.zero.nodes

    def neighbours(p: SearchProblem) -> set[tuple[int, int]]:
        return {(min(e.u, e.v), max(e.u, e.v)) for e in p.edges}

    assert priced.problem.num_nodes == free.problem.num_nodes
    assert len(priced.problem.edges) == len(free.problem.edges) + len(priced.zero.pairs)
    assert neighbours(priced.problem) == neighbours(free.problem)
