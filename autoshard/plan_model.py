"""Is this the model the plan was made for?  Asked before anything expensive runs on a plan and a model.

A plan records its model's class (``Plan.model``), its parameter names (``Plan.param_placements``), its
graph nodes (``Plan.nodes``) and, when the CLI made it, the spec it was built from (``Plan.source["spec"]``: a
zoo name or ``path/to/file.py:function``).  ``verify --plan`` and ``explain`` take another ``--model`` too
(a plan file never runs code it names, and a model of your own may be rebuilt small), as does
``examples/train.py run`` (a checkpoint directory); a model the plan was not made for used to run the whole
check and fail late on a node it could not match, or pass on a same-class model of another size.  Two checks,
both one line:

* :func:`check_spec`, before any model is built: two zoo names that differ are two models.  A file on either
  side may build the same model (a small copy of it, say), so it is left to the next check.
* :func:`check_built`, once the model is built (on meta: no weights): its class, and, for a rebuild at the
  plan's own size, its parameter names (and shapes, when the plan records its :func:`identity`), must be
  the plan's.
* :func:`check_identity`, for a plan made from Python (``autoshard.plan`` records no spec, only the model's
  :func:`identity` in ``Plan.source["model"]``) given a zoo name: that model is built at its own size on meta
  and its identity compared, so a plan of llama3-8b is refused for llama3-70b as a ``search`` plan is.

Example::

    check_spec(load_plan("g.json"), "llama3-8b", "g.json")
    # PlanModelError: plan g.json was made for gpt2 (GPT2LMHeadModel, 97 graph nodes), not llama3-8b; ...
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

from autoshard.errors import PlanFileError

if TYPE_CHECKING:
    from torch import nn

    from autoshard.plans import Plan

__all__ = ["PlanModelError", "check_built", "check_identity", "check_spec", "identity", "is_file_spec"]


class PlanModelError(PlanFileError):
    """A plan was given a model it was not made for."""


def is_file_spec(spec: str) -> bool:
    """``path/to/file.py:function`` (else a zoo name), as :func:`autoshard.zoo.load_spec` reads it."""
    path, sep, _ = spec.rpartition(":")
    return bool(sep) and path.endswith(".py")


def check_spec(plan: Plan, spec: str | None, path: str | None = None) -> None:
    """Refuse ``spec`` when the plan records another zoo name; nothing is built or imported."""
    recorded = str(plan.source.get("spec") or "")
    if not spec or not recorded or is_file_spec(spec) or is_file_spec(recorded) or spec == recorded:
        return
    raise PlanModelError(_refusal(plan, spec, spec, path))


def identity(model: nn.Module) -> dict[str, Any]:
    """What tells a model from another of its class (``Plan.source["model"]``): ``{"class", "parameters"``
    (elements), ``"digest"`` (16 hex of the sha256 of every parameter's name and shape)``}``."""
    params = list(model.named_parameters())
    text = "\n".join(
        f"{name}:{'x'.join(map(str, p.shape))}" for name, p in sorted(params, key=lambda x: x[0])
    )
    return {
        "class": type(model).__name__,
        "parameters": sum(int(p.numel()) for _, p in params),
        "digest": hashlib.sha256(text.encode()).hexdigest()[:16],
    }


def check_identity(plan: Plan, spec: str | None, path: str | None = None) -> str:
    """Refuse the zoo model ``spec`` when its identity (built on meta at its own size) is not the one the plan
    records (a plan made from Python: no spec to compare, :func:`check_spec`).  Returns a one-line note when
    the plan records neither (it cannot be checked), else ``""``."""
    if not spec or plan.source.get("spec") or is_file_spec(spec):
        return ""  # nothing given; check_spec compared the names; a file may build a small copy: check_built
    recorded = plan.source.get("model")
    if not isinstance(recorded, dict):
        where = f"plan {path}" if path else "the plan"
        return (
            f"note: {where} records neither the spec nor the identity of its model (saved by an older "
            f"autoshard): cannot check that it was made for {spec}; re-save it to have it checked"
        )
    from autoshard import zoo

    built = identity(zoo.build(spec, device="meta").model)
    if built["digest"] != recorded.get("digest"):
        given = f"{spec} (a {built['class']} of {_count(built['parameters'])} parameters)"
        raise PlanModelError(_refusal(plan, spec, given, path))
    return ""


def _count(n: object) -> str:
    """``8.03B``, ``1.2M``, ``640``."""
    x = float(n) if isinstance(n, int | float) else 0.0
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if x >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:.0f}"


def check_built(
    plan: Plan,
    spec: str,
    model: nn.Module,
    *,
    scaled: bool,
    path: str | None = None,
    replan: str = "",
    model_required: bool = False,
) -> None:
    """Refuse a built ``model`` of another class than the plan's, or, unless ``scaled`` (a smaller copy with
    fewer layers), with other parameter names or shapes.  ``replan``: the command that plans ``spec`` (default: the
    ``autoshard search`` on the plan's cluster); ``model_required``: the command cannot run without --model (its
    weights directory), so the refusal never suggests dropping it."""
    built = type(model).__name__
    if built != plan.model:
        raise PlanModelError(_refusal(plan, spec, f"{spec}, a {built}", path, replan, model_required))
    if scaled:
        return
    names = {name for name, _ in model.named_parameters()}
    planned = set(plan.param_placements)
    if names != planned:
        extra, missing = sorted(names - planned), sorted(planned - names)
        differs = f"has {len(extra)} parameters the plan lacks ({extra[0]}, ...)" if extra else (
            f"lacks {len(missing)} of the plan's parameters ({missing[0]}, ...)"
        )  # fmt: skip
        raise PlanModelError(
            _refusal(plan, spec, f"{spec}, whose {built} {differs}", path, replan, model_required)
        )
    own, recorded = identity(model), plan.source.get("model")  # same names: their shapes (a wider copy)
    if isinstance(recorded, dict) and recorded.get("digest") not in (None, own["digest"]):
        given = f"{spec}, a {built} of {_count(own['parameters'])} parameters"
        raise PlanModelError(_refusal(plan, spec, given, path, replan, model_required))


def _refusal(
    plan: Plan, spec: str, given: str, path: str | None, replan: str = "", model_required: bool = False
) -> str:
    """``plan g.json was made for gpt2 (GPT2LMHeadModel, 97 graph nodes), not llama3-8b; re-plan ...``."""
    recorded = str(plan.source.get("spec") or "")
    nodes = f"{len(plan.nodes)} graph nodes"
    own = plan.source.get("model")
    if not recorded and isinstance(own, dict) and "parameters" in own:  # a plan saved from Python
        nodes = f"{_count(own['parameters'])} parameters, {nodes}"
    made_for = f"{recorded} ({plan.model}, {nodes})" if recorded else f"a {plan.model} ({nodes})"
    # else --model is needed: a plan never runs a file it names, nor a command without its weights directory
    own = recorded and not is_file_spec(recorded) and not model_required
    return (
        f"{f'plan {path}' if path else 'the plan'} was made for {made_for}, not {given}; re-plan "
        f"with `{replan or _search_line(plan, spec)}`, or "
        + ("drop --model to use the plan's own model" if own else "pass the --model the plan was made from")
    )


def _search_line(plan: Plan, spec: str) -> str:
    """The ``autoshard search`` that plans ``spec`` on the plan's own cluster and mesh."""
    nodes = int(plan.cluster.get("nodes", 1) or 1)
    profile = plan.cluster.get("profile", "PROFILE")
    return (
        f"autoshard search --profile {profile} --model {spec}{f' --nodes {nodes}' if nodes > 1 else ''} "
        f"--mesh {'x'.join(map(str, plan.mesh_shape))} --out PLAN.json"
    )
