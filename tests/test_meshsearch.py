"""Mesh-shape search: the candidates, and the best mesh for a tensor-parallel-friendly model over nodes."""

from __future__ import annotations

import pytest

from autoshard import zoo
from autoshard.errors import MeshError
from autoshard.meshsearch import candidate_meshes, search_mesh


def test_candidates_one_node_are_canonical_factorisations() -> None:
    assert candidate_meshes(1, 8) == [(8,), (4, 2), (2, 2, 2)]


def test_candidates_across_nodes_fill_a_node_with_the_inner_axes() -> None:
    meshes = candidate_meshes(8, 8)
    assert meshes[:2] == [(64,), (8, 8)]
    assert (4, 2, 8) in meshes and (8, 4, 2) in meshes and (2, 2, 2, 8) in meshes
    assert (16, 4) not in meshes  # a hybrid axis (2 members per node) is only tried as the 1-D mesh
    assert (2, 4, 8) not in meshes  # inter-node axes non-increasing: (4, 2, 8) stands for it
    assert all(len(m) <= 2 for m in candidate_meshes(8, 8, max_axes=2))
    with pytest.raises(MeshError, match="max_axes"):
        candidate_meshes(8, 8, max_axes=0)


def test_auto_picks_inter_by_intra_node_2d_over_1d_for_a_tp_friendly_model() -> None:
    # Megatron MLP 8192 -> 32768 -> 8192, 16 x 4096 tokens on 2 nodes of 8: tensor parallel inside a node,
    # data parallel across nodes beats any plan on one 16-wide axis that crosses the nodes
    case = zoo.build("mlp", batch=16, seq=4096)
    found = search_mesh(case.model, "a100x8", case.args, case.kwargs, nodes=2, max_axes=2)
    assert found.mesh_shape == (2, 8)
    by_mesh = {c.mesh_shape: c for c in found.candidates}
    assert set(by_mesh) == {(16,), (2, 8)}
    wide = by_mesh[(16,)]  # planned slower, or pruned before planning by a bound above the 2 x 8 plan
    assert by_mesh[(2, 8)].step_seconds < (wide.bound if wide.pruned else wide.step_seconds)  # type: ignore[operator]
    assert found.plan.mesh_shape == (2, 8) and found.plan.predicted_step_time == by_mesh[(2, 8)].step_seconds
    assert any("runner-up 16:" in note for note in found.plan.notes)
