"""What a verify run checked of a plan, and what the plan does that the run did not.

Input: the plan the user deploys, the plan the ranks ran (the same one, or its mapping onto a scaled-down
copy: :mod:`autoshard.runtime.mapping`) and the dtype they computed in.  Output: lines of
:class:`~autoshard.runtime.verdict.VerifyReport` -- the headline of the plan that ran
(:func:`autoshard.pipeline.summary.headline`), a warning per mesh axis on which most of the compute ran
replicated (:func:`replicated_warnings`), and what the deployed plan does that one forward and backward on gloo
does not run (:func:`not_run`).

Why: an OK said nothing of what it covered.  ``verify --model llama-tiny --mesh 2x2`` checked "TP 2 ×
replicated 2": one all-reduce, only the LM head split, the first axis idle; and ``verify --plan`` of an FSDP
plan with recomputation printed its forward all-gathers but not that its 416 backward re-gathers, its ZeRO-1
optimizer gathers, its bfloat16 and its 4 microbatches were never run.

Example::

    replicated_warnings(plan)   # ("WARNING axis 0 (2 wide) splits none of the compute: ...",)
    not_run(plan, mapped.plan, "float32", "bfloat16")
    # ("FSDP backward re-gathers: 416 (299 for recomputation) ...", ...)
"""

from __future__ import annotations

from autoshard.plans import Plan

__all__ = ["REPLICATED_SHARE", "also_ran", "exercised", "not_run", "plan_line", "replicated_warnings"]

REPLICATED_SHARE = 0.5
"""An axis that leaves at least this share of the weighted compute (matmuls, attention, embeddings, by compute
time) unsplit is warned about: its ranks mostly compute the same thing, so little of the check is distributed."""


def plan_line(plan: Plan) -> str:
    """The headline of ``plan`` (what ``autoshard search`` prints first)."""
    from autoshard.pipeline.summary import headline

    return headline(plan)


def exercised(plan: Plan) -> tuple[str, ...]:
    """``"module op: strategy"`` of every decision of ``plan`` that splits or reduces something."""
    return tuple(
        f"{n.module or '<root>'} {n.target}: {n.strategy}"
        for n in plan.nodes
        if "S(" in n.strategy or "P" in n.strategy
    )


def also_ran(ran: Plan) -> tuple[str, ...]:
    """What ``ran`` runs beyond one plain forward and backward, counted in the collectives line: recomputation
    (:mod:`autoshard.codegen.recompute`) and FSDP's backward re-gathers (:mod:`autoshard.runtime.reshard`)."""
    out = []
    if ran.recompute != "none":
        again = sum(c.recompute for c in ran.collectives if c.phase != "regather")
        blocks = "every block" if ran.recompute_blocks is None else f"{ran.recompute_blocks} block(s)"
        out.append(
            f"{ran.recompute} recomputation of {blocks}: {again} forward collectives re-issued in backward"
        )
    regathers = sum(c.phase == "regather" for c in ran.collectives)
    if regathers:
        out.append(f"FSDP reshard after forward: {regathers} backward re-gathers of weights freed after use")
    return tuple(out)


def replicated_warnings(plan: Plan) -> tuple[str, ...]:
    """One line per mesh axis (wider than 1, not the pipeline's) that splits less than half of the compute."""
    from autoshard.report.families import shares_of
    from autoshard.report.groups import PlanView

    if not any(n.compute_seconds > 0 for n in plan.nodes):  # no compute times: shares unknown
        return ()
    view = PlanView.of(plan)
    out = []
    for axis, size in enumerate(plan.mesh_shape):
        if size == 1 or (plan.pipeline is not None and axis == 0):
            continue
        split = min(1.0, sum(shares_of(view, axis)[0].values()))
        if 1.0 - split < REPLICATED_SHARE:
            continue
        out.append(
            f"WARNING axis {axis} ({size} wide) splits {split:.0%} of the compute: {1.0 - split:.0%} runs "
            f"replicated on its {size} ranks, so this check says little about that axis"
        )
    return tuple(out)


def not_run(deployed: Plan, ran: Plan, dtype: str, deployed_dtype: str | None = None) -> tuple[str, ...]:
    """What ``deployed`` does that running ``ran`` for one forward and backward in ``dtype`` did not; empty
    when the check ran all of it.  ``deployed_dtype``: the dtype of the deployed model's weights, if known."""
    out = []
    regathers = [c for c in deployed.collectives if c.phase == "regather"]
    if regathers and not any(c.phase == "regather" for c in ran.collectives):
        out.append(f"FSDP backward re-gathers: {len(regathers)}; the copy's plan gathers no weight")
    if deployed.recompute != "none" and ran.recompute == "none":
        out.append(f"{deployed.recompute} recomputation: the copy's plan keeps its activations")
    if deployed.optimizer_gathers:
        out.append(
            f"ZeRO-1 optimizer all-gathers: {len(deployed.optimizer_gathers)}; the check runs forward and "
            "backward, no optimizer step"
        )
    if deployed.microbatches > 1:  # one forward and backward of the whole batch, whatever the plan says
        out.append(
            f"{deployed.microbatches} microbatches per step: the check ran the whole batch as one and "
            "accumulated no gradients"
        )
    if deployed.precision == "amp":
        out.append(f"the amp recipe (bfloat16 autocast and gathers): the model ran in {dtype}")
    elif deployed_dtype is not None and deployed_dtype != dtype:
        out.append(
            f"{deployed_dtype} weights (the plan's {deployed.precision} recipe): the copy ran in {dtype}"
        )
    return tuple(out)
