"""A plan given a ``--model`` it was not made for: one line, exit 2, before anything is built when the names
tell (``autoshard.plan_model``), else once the model is built on meta, before its capture."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_support import Result

from autoshard import zoo
from autoshard.plan_model import PlanModelError, check_built, check_spec
from autoshard.plans import Plan, load_plan


def _one_line(r: Result) -> str:
    assert r.code == 2 and r.out == "" and r.err.count("\n") == 1, (r.code, r.out, r.err)
    assert r.err.startswith("autoshard: error: ") and "Traceback" not in r.err
    return r.err.removeprefix("autoshard: error: ").strip()


@pytest.mark.parametrize("command", [("verify", "--plan"), ("explain",)])
def test_another_zoo_model_is_refused_before_it_is_built(
    cli: Callable[..., Result],
    mlp_files: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
    command: tuple[str, ...],
) -> None:
    def never(*_: object, **__: object) -> None:
        raise AssertionError("a model was built for a plan it does not fit")

    monkeypatch.setattr(zoo, "build", never)
    monkeypatch.setattr(zoo, "load_spec", never)
    path = str(mlp_files["plan"])
    nodes = len(load_plan(path).nodes)
    line = _one_line(cli(*command, path, "--model", "seed"))
    assert line == (
        f"plan {path} was made for mlp (MLP, {nodes} graph nodes), not seed; re-plan with `autoshard search "
        "--profile a100x8 --model seed --mesh 8 --out PLAN.json`, or drop --model to use the plan's own model"
    )


def test_explain_of_a_plan_without_its_spec_checks_the_built_model(
    cli: Callable[..., Result], mlp_files: dict[str, Path], tmp_path: Path
) -> None:
    """An API plan records no spec: the model is built (on meta) and its class compared before the capture."""
    data = json.loads(mlp_files["plan"].read_text())
    data["source"] = {}
    path = tmp_path / "api.json"
    path.write_text(json.dumps(data))
    line = _one_line(cli("explain", str(path), "--model", "seed"))
    assert line.startswith(
        f"the plan was made for a MLP ({len(data['nodes'])} graph nodes), not seed, a SeedTextModel;"
    )
    assert line.endswith("or pass the --model the plan was made from")


def test_a_same_class_model_of_another_depth_is_refused_at_full_size(deep_plan: Plan) -> None:
    """mlp-deep of 2 layers planned, 8 given (the class matches, its parameters do not): refused for a rebuild
    at the plan's size (explain), accepted for verify's scaled-down copy, which has fewer layers by design."""
    plan = deep_plan
    deeper = zoo.build("mlp-deep", layers=8, device="meta").model
    with pytest.raises(PlanModelError, match=r"not mlp-deep, whose DeepMLP has 12 parameters the plan lacks"):
        check_built(plan, "mlp-deep", deeper, scaled=False)
    check_built(plan, "mlp-deep", deeper, scaled=True)
    check_built(plan, "mlp-deep", zoo.build("mlp-deep", layers=2, device="meta").model, scaled=False)


def test_a_file_on_either_side_is_left_to_the_built_model(deep_plan: Plan) -> None:
    """A model file may build the planned model (a small copy of it, say): only two zoo names are refused
    unbuilt."""
    plan = deep_plan
    for recorded, given in [("mlp-deep", "mine.py:small"), ("mine.py:big", "mlp-deep"), ("mlp-deep", None)]:
        check_spec(dataclasses.replace(plan, source={"spec": recorded}), given)
    check_spec(dataclasses.replace(plan, source={}), "gpt2")  # nothing recorded: the built model tells
    with pytest.raises(
        PlanModelError, match=r"^the plan was made for mlp-deep \(DeepMLP, \d+ graph nodes\), not mlp;"
    ):
        check_spec(dataclasses.replace(plan, source={"spec": "mlp-deep"}), "mlp")


@pytest.fixture(scope="module")
def deep_plan() -> Plan:
    """mlp-deep with 2 layers on 2 CPU devices (planned on meta, well under a second)."""
    import autoshard
    from autoshard.runtime.verify import cluster_for

    case = zoo.build("mlp-deep", layers=2, device="meta")
    return autoshard.plan(case.model, cluster_for("cpu", 2), case.args, case.kwargs)


def test_verify_refuses_another_model_for_a_plan_saved_from_python(
    cli: Callable[..., Result], deep_plan: Plan, tmp_path: Path
) -> None:
    """``autoshard.plan`` records its model's identity (Plan.source["model"]): mlp-deep of 2 layers saved from
    Python is refused for the zoo's 8-layer mlp-deep (same class: verify's scaled copy alone let it pass)."""
    assert set(deep_plan.source) == {"model"} and deep_plan.source["model"]["class"] == "DeepMLP"
    path = tmp_path / "api.json"
    deep_plan.save(path)
    line = _one_line(cli("verify", "--plan", str(path), "--model", "mlp-deep"))
    assert line.startswith(f"plan {path} was made for a DeepMLP (") and "not mlp-deep (a DeepMLP of " in line
    assert line.endswith("or pass the --model the plan was made from")
    with pytest.raises(PlanModelError, match="not mlp-deep, a DeepMLP of"):  # explain: the same digest check
        check_built(
            dataclasses.replace(
                deep_plan, source={"model": {**deep_plan.source["model"], "digest": "0" * 16}}
            ),
            "mlp-deep",
            zoo.build("mlp-deep", layers=2, device="meta").model,
            scaled=False,
        )


def test_verify_of_a_plan_without_identity_says_once_it_cannot_check(
    cli: Callable[..., Result], deep_plan: Plan, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from autoshard.runtime import verify

    path = tmp_path / "old.json"
    dataclasses.replace(deep_plan, source={}).save(path)
    monkeypatch.setattr(verify, "run_verify", lambda *_, **__: dataclasses.make_dataclass("R", ["ok"])(True))
    r = cli("verify", "--plan", str(path), "--model", "mlp-deep")
    assert r.code == 0 and r.err.count("\n") == 1, (r.code, r.err)
    assert r.err.startswith(f"note: plan {path} records neither the spec nor the identity of its model")
    assert r.err.count("cannot check that it was made for mlp-deep") == 1
