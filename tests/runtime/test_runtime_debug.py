"""Debugging aids: the local-shape checker finds a wrongly localised size; a failing rank ends a launch."""

from __future__ import annotations

import pytest
import torch
from runtime_cases import LLAMA_MEGATRON, Model, model, plan

from autoshard.codegen import PlanMismatchError, parallel_info, parallelize
from autoshard.codegen.lower import LocalShapeChecker
from autoshard.codegen.shard import local_piece
from autoshard.errors import MeshError
from autoshard.plans import Plan
from autoshard.runtime.launch import LaunchError, launch


def _check_shapes(m: Model, p: Plan, corrupt: bool) -> str:
    module = parallelize(m.model, p, m.args, captured=m.captured)
    info = parallel_info(module)
    local = [
        local_piece(v, spec, (2,), info.comm.coord)
        for v, (_, spec, _) in zip(m.args, info.inputs, strict=True)
    ]
    if (
        corrupt
    ):  # heads split 2 ways: (4, 8, 2, 16) per device; (4, 8, 1, 32) has as many elements, wrong shape
        view = next(n for n in module.graph.nodes if n.name == "view")
        view.args = (view.args[0], [4, 8, 1, 32])
        module.recompile()
    try:
        checked = LocalShapeChecker(module).run(*local)
    except PlanMismatchError as e:
        return str(e)
    torch.testing.assert_close(checked, module(*local), rtol=0, atol=0)
    return "ok"


def _llama_megatron() -> tuple[Model, Plan]:
    """Built here, in the parent: forked ranks inherit it instead of each building their own."""
    return model("llama"), plan("llama", 2, None, tuple(LLAMA_MEGATRON.items()))


def test_local_shapes_are_the_plans() -> None:
    assert launch(_check_shapes, 2, *_llama_megatron(), False) == ["ok", "ok"]


def test_shape_checker_names_a_wrongly_localised_size() -> None:
    messages = launch(_check_shapes, 2, *_llama_megatron(), True)
    assert all("node view" in msg and "(4, 8, 1, 32)" in msg and "(4, 8, 2, 16)" in msg for msg in messages)


def _fails_on_rank_one() -> None:
    if torch.distributed.get_rank() == 1:
        raise ValueError("boom on purpose")


def test_a_failing_rank_ends_the_launch_with_its_traceback() -> None:
    with pytest.raises(LaunchError, match=r"(?s)rank 1 of 2 failed.*boom on purpose"):
        launch(_fails_on_rank_one, 2, timeout=30)


def _parallelize_on_wrong_world(m: Model, p: Plan) -> str:
    try:
        parallelize(m.model, p, m.args, captured=m.captured)
    except MeshError as e:
        return str(e)
    return "no error"


def test_a_plan_for_another_world_size_is_refused() -> None:
    m, p = _llama_megatron()  # planned for 2 devices
    messages = launch(_parallelize_on_wrong_world, 4, m, p)
    assert all("the plan is for 2 devices" in msg and "4 ranks" in msg for msg in messages)
