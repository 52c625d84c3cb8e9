"""The figures of a plan beside its baseline: step time and its split, memory against capacity, what the
figures assume, the price of pins and the comparison with data parallel.

Input: a :class:`~autoshard.plans.Plan` and optionally a :class:`Baseline` (the same model planned as pure
data parallel, or why that is impossible).  Output: report lines (:func:`figure_lines`), part of
:func:`autoshard.report.table.render`.

Example::

    lines = figure_lines(plan, Baseline.of(dp_plan), width=100, budget=None)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from autoshard.plans import Collective, Plan
from autoshard.report.labels import axes_text, fmt_bytes, fmt_seconds, wrap
from cost_models.memory import RECIPES, itemsize
from cost_models.overlap import SyncExposure
from cost_models.profile import canonical_dtype

__all__ = [
    "Baseline",
    "figure_lines",
    "memory_parts",
    "param_memory",
    "recipe_note",
    "recipe_text",
    "recompute_text",
]


@dataclass(frozen=True, slots=True)
class Baseline:
    """The figures of a comparison plan (pure data parallel), or why there is none (``step_time`` is None)."""

    name: str
    step_time: float | None = None
    compute: float = 0.0
    communication: float = 0.0
    memory: float = 0.0
    param_memory: float = 0.0
    device_memory: float = 0.0
    reason: str = ""
    # memory no node owns (runtime reserve, gathered weights, largest temporary): not activations
    unowned: float = 0.0
    # its recomputation (recompute_text); "" when not recorded (a report saved before it was)
    recompute: str = ""

    @classmethod
    def of(cls, plan: Plan, name: str = "data parallel") -> Baseline:
        return cls(
            name,
            plan.predicted_step_time,
            plan.compute_time,
            plan.communication_time,
            plan.memory_per_device,
            param_memory(plan),
            plan.device_memory,
            unowned=sum(plan.memory_breakdown.values()),
            recompute=recompute_text(plan),
        )

    @classmethod
    def impossible(cls, reason: str, name: str = "data parallel") -> Baseline:
        """The baseline ``name`` has no plan; the solver's "no plan fits ..." is said of ``name``'s plans only
        (new-user trial: under a fitting plan, "no plan fits" read as if this plan did not fit either)."""
        kind = name.replace(" ", "-")
        for generic in ("no plan", "every plan", "the least-memory plan"):
            reason = reason.replace(generic, f"{generic.removesuffix(' plan')} {kind} plan")
        return cls(name, reason=reason)

    @classmethod
    def from_report(cls, report: dict[str, Any]) -> Baseline | None:
        """Read back the ``baseline`` block of :func:`report_data` (``None`` when absent or malformed)."""
        data = report.get("baseline")
        if not isinstance(data, dict):
            return None
        fields = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        try:
            return cls(**fields)
        except TypeError:
            return None

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def memory_parts(plan: Plan) -> dict[str, float]:
    """The memory per device in parts that sum to it: parameter state (the parameters' nodes),
    activations (the rest of the nodes' share) and ``Plan.memory_breakdown``'s terms (reserve, gathered
    weights, largest temporary).  Every part is non-negative, else the plan's total and its breakdown
    disagree: an internal error (new-user trial: a pipelined plan read "activations -187.7 MiB")."""
    params = param_memory(plan)
    unowned = math.fsum(plan.memory_breakdown.values())
    parts = {"parameter state": params, "activations": plan.memory_per_device - params - unowned}
    parts |= plan.memory_breakdown
    slack = 1e-9 * max(plan.memory_per_device, 1.0)  # rounding of a total summed in another order
    negative = {k: v for k, v in parts.items() if v < -slack}
    if negative:
        listed = ", ".join(f"{k} {v:.6g} B" for k, v in parts.items())
        raise AssertionError(
            f"internal: the memory per device of the plan for {plan.model} ({plan.memory_per_device:.6g} B) "
            f"splits into negative parts: {listed}"
        )
    return parts


def figure_lines(plan: Plan, baseline: Baseline | None, width: int, budget: float | None) -> list[str]:
    dp = baseline if baseline is not None and baseline.step_time is not None else None
    parts = memory_parts(plan)  # reserve, gathered weights, temporary: shown in _assumptions
    state = "  weights, grads, optimizer" if plan.training else "  weights only"
    names = ("step time", "  compute", _comm_label(plan), "memory per device", state)
    mine: tuple[float, ...] = (plan.predicted_step_time, plan.compute_time, plan.communication_time)
    mine += (plan.memory_per_device, parts["parameter state"], max(0.0, parts["activations"]))
    theirs: tuple[float, ...] = ()
    if dp is not None and dp.step_time is not None:
        waited = (
            dp.step_time - dp.compute
        )  # beside a pipelined plan's: the row's meaning, not every collective
        comm = waited if plan.pipeline is not None else dp.communication
        theirs = (dp.step_time, dp.compute, comm, dp.memory, dp.param_memory)
        theirs += (dp.memory - dp.param_memory - dp.unowned,)
    lines = [f"{'predicted step time, memory':<30}{'this plan':>12}" + (f"{dp.name:>16}" if dp else "")]
    for i, name in enumerate((*names, "  activations")):
        fmt = fmt_seconds if i < 3 else fmt_bytes
        lines.append(f"  {name:<28}{fmt(mine[i]):>12}" + (f"{fmt(theirs[i]):>16}" if theirs else ""))
    lines.append(_capacity(plan, budget))
    named = baseline.name if baseline is not None else None
    comparison = _comparison(plan, baseline, width) + _replicated(plan, named, width)
    return lines + _assumptions(plan, width) + _price(plan, width) + comparison


def _comm_label(plan: Plan) -> str:
    """What the communication figure is: every collective's time (ZeRO-1's optimizer gathers included), or
    with pipeline stages what the busiest pipeline rank waits for (new-user trial: both read
    "communication", and the first left the gathers out)."""
    return "  communication waited for" if plan.pipeline is not None else "  communication (all)"


def _price(plan: Plan, width: int) -> list[str]:
    """The price of what the user pinned (``Plan.pinned``: annotations, forbidden kinds), named as given:
    the pinned plan's step time beside the unpinned optimum's.  Nothing when nothing was pinned, even where a
    wider problem was priced (``cp_layout="auto"`` compares layouts, not pins: new-user trial)."""
    free = plan.unpinned_step_time
    if free is None or not plan.pinned:
        return []
    extra = plan.predicted_step_time / free - 1 if free else 0.0
    cost = f"{extra:+.1%}" if extra >= 0.0005 else "no extra cost"
    kinds = [p.removeprefix("no ") for p in plan.pinned if p.startswith("no ")]
    named = ["your annotations"] * ("annotations" in plan.pinned) + [f"forbidding {', '.join(kinds)}"] * bool(
        kinds
    )
    what = " and ".join(named) or "the plan's pins"  # a pin kind this report does not name yet
    mesh = "x".join(map(str, plan.mesh_shape))
    pinned = f"price of {what}: {fmt_seconds(plan.predicted_step_time)} pinned"
    searched = plan.meshes_searched
    if plan.unpinned_mesh:  # the unpinned optimum over the same meshes (search --price-pins meshes)
        other = "x".join(map(str, plan.unpinned_mesh))
        text = (
            f"{pinned} on mesh {mesh} vs {fmt_seconds(free)} unpinned optimum on mesh {other}, the best "
            f"of the {searched} meshes searched ({cost})"
        )
        return wrap(text, width, "    ", "  ")
    text = f"{pinned} vs {fmt_seconds(free)} unpinned optimum on mesh {mesh} ({cost})"
    if searched > 1:  # new-user trial: "+3.5 %" read as against every mesh, where another one was faster
        text += (
            f"; of the {searched} meshes searched, only this one was planned unpinned (search "
            "--price-pins meshes plans them all)"
        )
    return wrap(text, width, "    ", "  ")


def recompute_text(plan: Plan) -> str:
    """``selective on 8 blocks, none on the rest``: Plan.recompute, on the first recompute_blocks blocks."""
    if plan.recompute_blocks is not None and plan.recompute != "none":
        blocks = f"{plan.recompute_blocks} block{'s' * (plan.recompute_blocks != 1)}"
        return f"{plan.recompute} on {blocks}, none on the rest"
    return plan.recompute


def _assumptions(plan: Plan, width: int) -> list[str]:
    """Two lines: what the figures assume (dtypes, optimizer, micro-batches, recompute; overlap, memory)."""
    recompute = recompute_text(plan)
    batches = f"{plan.microbatches} micro-batch{'es' * (plan.microbatches > 1)}"
    batches = ", ".join(filter(None, (priced_shape(plan), batches)))
    first = f"assumes: {recipe_text(plan.precision)}, {batches}, recompute {recompute}"
    overlap = plan.overlap.describe()
    if not plan.training:  # a forward pass: nothing to sync, no optimizer, no activations kept for backward
        weights = recipe_text(plan.precision, training=False)
        first = f"assumes: inference: no gradients, no optimizer state; {weights}, {batches}"
        overlap = overlap.split(", ", 1)[1]  # the gradient sync policy does not apply
    exposed = plan.predicted_step_time - plan.compute_time
    memory = " + ".join(f"{k} {fmt_bytes(v)}" for k, v in plan.memory_breakdown.items() if v > 0)
    second = f"overlap: {overlap}; {fmt_seconds(exposed)} comm exposed" + (f"; + {memory}" if memory else "")
    zero = zero_text(plan) if plan.training else ""
    third = wrap(zero, width, "    ", "  ") if zero else []
    sync = plan.grad_sync  # what of the gradient sync is exposed and why (problem/step.py)
    if sync is not None and plan.pipeline is not None:
        third += wrap(_stage_sync(plan, sync), width, "    ", "  ")
    elif sync is not None:
        buckets = len({b.index for b in plan.grad_buckets})  # stream buckets (one record per axis each)
        third += wrap(
            sync.describe(fmt_seconds, plan.overlap.overlap_grad_sync, buckets), width, "    ", "  "
        )
    return wrap(first, width, "    ", "  ") + wrap(second, width, "    ", "  ") + third


def _stage_sync(plan: Plan, sync: SyncExposure) -> str:
    """A pipelined plan's gradient sync: the busiest pipeline rank's (the one the step's communication
    names), once per step after the schedule, so its exposed part lies inside the step's exposed
    communication (new-user trial: the whole model's sync beside a stage's step contradicted it)."""
    head = f"grad sync (the busiest pipeline rank's stages, once per step) {fmt_seconds(sync.seconds)}"
    if sync.exposed <= 1e-12:
        return f"{head}, none exposed: all of it hides under its last microbatch's backward"
    return (
        f"{head}, {fmt_seconds(sync.exposed)} exposed (part of the {fmt_seconds(plan.communication_time)} "
        "comm above): what its last microbatch's backward does not hide"
    )


def zero_group(plan: Plan) -> str:
    """The devices one parameter's Adam state is sharded over: all of them, or with pipeline stages those
    of one stage (its data-parallel group; new-user trial: "128 devices" where a stage has 16)."""
    if plan.pipeline is None:
        return f"{plan.num_devices} devices"
    stages = plan.mesh_shape[plan.pipeline.mesh_axis]
    return f"the {plan.num_devices // max(1, stages)} devices of each pipeline stage"


def priced_shape(plan: Plan) -> str:
    """The global input the figures are for, from the first input: "batch 8 × seq 4096" for token ids or
    hidden states, "batch 8" otherwise; '' when the plan records none (new-user trial: never stated)."""
    shape, dtype = next(iter(plan.input_shapes.values()), ((), ""))
    if len(shape) >= 2 and ("int" in dtype or len(shape) >= 3):
        return f"batch {shape[0]} × seq {shape[1]}"
    return f"batch {shape[0]}" if shape else ""


def zero_split(plan: Plan, c: Collective, fqn: str) -> bool:
    """Whether ZeRO-1 (runtime/zero.py) runs this backward all-reduce of parameter ``fqn``'s gradient as a
    reduce-scatter and an all-gather of the updated weights: on an axis where ``fqn`` is replicated, not a
    pipeline's stage axis (its stages hold other parameters)."""
    spec, stages = plan.param_placements.get(fqn, ()), plan.pipeline and plan.pipeline.mesh_axis
    replicated = c.mesh_axis < len(spec) and spec[c.mesh_axis] == "R" and c.mesh_axis != stages
    return plan.training and c.phase == "backward" and c.kind == "all_reduce" and replicated


def zero_text(plan: Plan) -> str:
    """Where the sharded optimizer state's collectives are (ZeRO-1: every parameter's Adam state split over
    the devices on which the parameter is replicated): inside the gradient all-reduces (a reduce-scatter and
    an all-gather each), and ``Plan.optimizer_gathers`` where a gradient is not reduced.  A plan never
    claims sharded state without naming them (new-user trial: a replicated plan said "Adam sharded" and
    listed no collective)."""
    params = set(plan.param_placements)
    mesh = plan.mesh_shape
    stages = None if plan.pipeline is None else plan.pipeline.mesh_axis  # its stages hold other parameters
    if stages is not None and plan.num_devices == mesh[stages]:  # new-user trial: "over the 1 devices"
        return "optimizer: Adam state not sharded (each pipeline stage runs on 1 device)"
    replicated = any(
        p == "R" and mesh[a] > 1 and a != stages
        for spec in plan.param_placements.values()
        for a, p in enumerate(spec)
    )
    if not replicated:
        return "" if plan.num_devices == 1 else "optimizer: Adam state split as the parameters are stored"
    nodes = {n.name: n.module for n in plan.nodes if n.target == "placeholder" and n.module in params}
    split = sum(
        zero_split(plan, c, c.module if c.module in params else nodes[c.tensor])
        for c in plan.collectives
        if c.tensor in nodes
    )
    synced = any(c.phase == "backward" and c.tensor in nodes for c in plan.collectives)
    gathers = plan.optimizer_gathers
    where = []
    if split:
        where.append(
            f"{split} gradient all-reduce{'s' * (split != 1)} of replicated weights (the bwd rows marked ZeRO-1) "
            f"{'runs' if split == 1 else 'each run'} as a reduce-scatter of the gradient, then an all-gather of "
            "the updated weights"
        )
    if gathers:  # priced in the step (autoshard.problem.zero_terms); an older file's step did not pay them
        moved, seconds = (
            fmt_bytes(sum(c.nbytes for c in gathers)),
            fmt_seconds(sum(c.seconds for c in gathers)),
        )
        axes = axes_text(sorted({c.mesh_axis for c in gathers}))
        count = f"{len(gathers)} all-gather{'s' * (len(gathers) != 1)}"
        paid = (
            "in the step, after backward"
            if plan.optimizer_gathers_priced
            else "not in this file's step (saved by an older autoshard: search again to price them)"
        )
        where.append(
            f"{count} of updated weights on {axes} where gradients are not reduced ({moved}, {seconds}, {paid})"
        )
    if not where and synced:  # every replicated weight's gradient reduced where it is sharded: nothing split
        return f"optimizer: Adam state sharded over {zero_group(plan)} (ZeRO-1)"
    if not where:  # a file saved before Plan.optimizer_gathers: its gathers were never listed
        return (
            f"optimizer: Adam state sharded over {zero_group(plan)} (ZeRO-1); this plan file lists none "
            "of its all-gathers (saved by an older autoshard: search again)"
        )
    return f"optimizer: Adam state sharded over {zero_group(plan)} (ZeRO-1): {'; '.join(where)}"


_SHORT = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def recipe_text(name: str, training: bool = True) -> str:
    """The precision recipe a plan was priced under (``Plan.precision``), in the report's words, read from
    its :class:`~cost_models.memory.PrecisionPolicy`: bf16 -> ``captured dtypes, Adam (fp32 master +
    moments) sharded``; amp -> ``amp: fp32 weights + bf16 autocast copies, fp32 grads, foreach AdamW (fp32
    moments) sharded``.  Without ``training``: only what the weights are."""
    policy = RECIPES.get(name)
    if policy is None:  # the model's own dtypes; 16-bit weights get an fp32 master copy (fused AdamW)
        return "captured dtypes, Adam (fp32 master + moments) sharded" if training else "captured dtypes"
    weights = f"{name}: {_short(policy.param_dtype)} weights"
    if policy.autocast is not None:
        weights += f" + {_short(policy.autocast)} autocast copies"
    if not training:
        return weights
    recipe = policy.recipe()
    master = "fp32 master + " if policy.master_weights and itemsize(policy.param_dtype) < 4 else ""
    kind = "fused" if policy.fused_optimizer else "foreach"
    grads = "fp32" if recipe.gradients == 4 else _short(policy.grad_dtype)
    return f"{weights}, {grads} grads, {kind} AdamW ({master}fp32 moments) sharded"


def recipe_note(plan: Plan, runner: str, runs: str) -> str:
    """One line, newline-ended, when ``runner`` runs ``plan`` under another recipe than it was priced for
    (``runs``: what it runs instead); "" for the bf16 recipe (the captured dtypes, which runners keep)."""
    if plan.precision == "bf16":
        return ""
    return (
        f"note: the plan was priced for {recipe_text(plan.precision)}; {runner} runs {runs}, not that "
        "recipe\n"
    )


def _short(dtype: str) -> str:
    name = canonical_dtype(dtype)
    return _SHORT.get(name, name)


def _capacity(plan: Plan, budget: float | None) -> str:
    limit = budget if budget is not None else plan.device_memory
    what = f"memory budget {fmt_bytes(limit)}" if budget is not None else f"device memory {fmt_bytes(limit)}"
    share = plan.memory_per_device / limit if limit else 0.0
    return f"  {what}: this plan uses {share:.0%}"


def param_memory(plan: Plan) -> float:
    fqns = set(plan.param_placements)
    return sum(n.memory_bytes for n in plan.nodes if n.target == "placeholder" and n.module in fqns)


def _comparison(plan: Plan, baseline: Baseline | None, width: int) -> list[str]:
    if baseline is None:
        return []
    if baseline.step_time is None:
        return wrap(f"{baseline.name}: {baseline.reason}", width, "    ", "  ")
    ratio = baseline.step_time / plan.predicted_step_time if plan.predicted_step_time else 1.0
    verdict = f"as fast as {baseline.name} (within 0.5%)"
    if ratio >= 1.005:
        verdict = f"{ratio:.2f}x faster than {baseline.name}"
    elif ratio < 0.995:  # only when annotations or a budget constrain this plan more than the baseline
        verdict = f"{1 / ratio:.2f}x slower than {baseline.name}"
    lines = [f"  this plan is {verdict}"]
    if baseline.recompute and plan.training and baseline.recompute != recompute_text(plan):
        # new-user trial: 8B --forbid tp read 41.4 GiB of activations beside data parallel's 36.3 and 1.152 s
        # of compute beside 1.164 s with nothing saying that data parallel, unable to fit without, recomputed
        text = (
            f"{baseline.name} recomputes {baseline.recompute} (this plan: {recompute_text(plan)}): its compute "
            "includes the recomputed forward, its activations only what that keeps"
        )
        lines += wrap(text, width, "    ", "  ")
    return lines


def _replicated(plan: Plan, baseline: str | None, width: int) -> list[str]:
    """Ops without a rule run whole on every device, in this plan and in the baseline alike: say so."""
    if not plan.replicated_ops:
        return []
    share = sum(plan.replicated_ops.values())
    ops = ", ".join(sorted(plan.replicated_ops, key=lambda op: -plan.replicated_ops[op]))
    text = (
        f"warning: {share:.1%} of the forward FLOPs run replicated on every device (no sharding rule: {ops})"
    )
    if baseline is not None:
        text += f"; {baseline} replicates them too, so the comparison does not show their cost"
    return wrap(text, width, "    ", "  ")
