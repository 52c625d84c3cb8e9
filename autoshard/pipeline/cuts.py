"""What each pipeline stage runs of the plan's collectives, and what cutting the model into stages adds.

Input: the winning :class:`~autoshard.pipeline.search.Candidate` (its whole-model problem and solution on the
stage sub-mesh) and the intra-op collectives extracted from it; or, for :func:`stage_collectives`, a
pipelined :class:`~autoshard.plans.Plan` alone.
Output: ``Plan.collectives`` as the stages run them -- the same records the runtime's stage plans list
(:mod:`autoshard.runtime.stage_plan` runs the whole plan's decisions, so the two agree record for record):

- the whole-model extract lists a tensor made outside the layers and read by every layer (rotary tables,
  an attention mask) moved once, at the first layer that wants the layout; each stage holding layers runs
  that move itself, so it is listed again at the first layer of every later stage;
- a stage ending inside the layer stack sends its last layer's output whole: one left ``Partial`` (a row-split
  projection's sum not yet reduced) is reduced before the send, once per microbatch, listed at that layer;
  the next stage receives it reduced, so its first layer's forward reductions of that tensor (the whole
  model's ``P -> R`` or ``P -> S(d)`` into the input norm) do not run there: they leave the list (their
  ``R -> X`` is a local step, and a use that stays ``P`` takes the received value by a free ``R -> P``).

:func:`stage_collectives` reads the result back per stage: a record belongs to the stage owning its module
(a layer's module, the embedding's, the head's), a module no stage owns (rotary tables, the model's root)
to every stage; records on the pipeline axis (a tied weight's sum) belong to the pipeline, not a stage.
Pure: no torch.
"""

from __future__ import annotations

import dataclasses

from autoshard.pipeline.search import Candidate
from autoshard.plans import Collective, Plan
from autoshard.problem.build import BuiltProblem
from autoshard.problem.extract import COLLECTIVE_KINDS
from autoshard.problem.layers import LayerNamer
from autoshard.problem.moves import output_fix_steps

__all__ = ["cut_collectives", "per_step", "stage_collectives"]


def cut_collectives(
    candidate: Candidate, intra: tuple[Collective, ...], prefix: str | None, first: int
) -> tuple[tuple[Collective, ...], tuple[Collective, ...]]:
    """The records the stage cut adds to the whole-model extract's ``intra`` and those of ``intra`` it takes
    away (module doc), on the sub-mesh."""
    split, built = candidate.split, candidate.built
    assert split is not None
    namer = LayerNamer(built, prefix, first)
    chunks = len(split.bounds) - 1
    starts = [split.bounds[c] for c in range(1, chunks)]  # the first layer of every chunk but the first
    shared = _read_by_every_layer(candidate, namer)
    added: list[Collective] = []
    for c in intra:
        if (
            c.layer is None
            or c.tensor not in shared
            or c.layer >= (starts[0] if starts else built.num_blocks)
        ):
            continue
        for start in starts:  # the first chunk's move is listed; every later chunk runs its own
            added.append(
                dataclasses.replace(c, layer=start, module=_relayer(c.module, c.layer, start, namer))
            )
    m = candidate.microbatches
    for k in range(chunks - 1):
        last = split.bounds[k + 1] - 1
        for name, steps in _cut_fixes(candidate):
            info = built.infos[name]
            for step in steps:
                seconds = built.cluster.collective_time(step.kind, step.nbytes, axis=step.mesh_axis) * m
                where = namer.module(info.module, last)
                record = Collective(
                    step.kind, step.nbytes, "forward", step.mesh_axis, "output", name, where, seconds
                )
                added.append(dataclasses.replace(record, layer=last))
    reduced = {
        (c.tensor, c.layer + 1, c.mesh_axis) for c in added if c.node == "output" and c.layer is not None
    }
    dropped = tuple(
        c
        for c in intra
        if c.phase == "forward"
        and c.kind in _REDUCING
        and (c.tensor, c.layer, c.mesh_axis) in reduced
        and _in_layer(built, c.node)  # a final norm after the last layer is no stage's first layer
    )
    return tuple(added), dropped


def _in_layer(built: BuiltProblem, node: str) -> bool:
    info = built.infos.get(node)
    return info is not None and info.block is not None


_REDUCING = frozenset({"all_reduce", "reduce_scatter"})  # the steps of a Partial's reduction


def _relayer(module: str, old: int, new: int, namer: LayerNamer) -> str:
    if not namer.prefix:
        return module
    return module.replace(f"{namer.prefix}.{namer.first + old}", f"{namer.prefix}.{namer.first + new}", 1)


def _read_by_every_layer(candidate: Candidate, namer: LayerNamer) -> set[str]:
    """Template names of non-parameter tensors made outside the layers that more than one layer reads."""
    built = candidate.built
    found: set[str] = set()
    for use in built.edges:
        u = built.infos[use.producer]
        if u.block is not None or u.kind in ("parameter", "buffer"):
            continue
        if built.infos[use.consumer].block is not None and len(namer.layers_of_edge(use)) > 1:
            found.add(built.template[use.producer])
    return found


def _cut_fixes(candidate: Candidate) -> list[tuple[str, tuple]]:
    """(node, collective steps) reducing each tensor a layer hands the next when the plan leaves it Partial."""
    built, solution = candidate.built, candidate.solution
    chosen = dict(zip(built.variables, solution.choice[: len(built.variables)], strict=True))
    fixes, seen = [], set()
    for use in built.edges:
        u, v = built.infos[use.producer], built.infos[use.consumer]
        if u.block is None or v.block is None or u.block[0] == v.block[0] or u.name in seen:
            continue
        seen.add(u.name)
        template = built.template[u.name]
        steps = output_fix_steps(
            u, built.strategies[template][chosen[template]], built.cache, built.options.precision
        )
        steps = tuple(s for s in steps if s.kind in COLLECTIVE_KINDS)
        if steps:
            fixes.append((template, steps))
    return fixes


def stage_collectives(plan: Plan, index: int) -> tuple[Collective, ...]:
    """Stage ``index``'s records of ``plan.collectives`` on its sub-mesh (mesh axes without the pipeline's;
    module doc)."""
    pipe = plan.pipeline
    assert pipe is not None, "a plan without stages has no stage collectives"
    whole = len(plan.mesh_shape) > 1 and plan.mesh_shape[pipe.mesh_axis] == pipe.degree
    axis = pipe.mesh_axis if whole and pipe.degree > 1 else None
    # modules holding parameters belong to one stage; the others (rotary tables) run on every stage
    holders = {p.rpartition(".")[0] for p in plan.param_placements}
    held = {m for m in holders for m in _prefixes(m)}
    owners = {m: s.index for s in pipe.stages for m in s.modules if m in held}
    mine = []
    for c in plan.collectives:
        if axis is not None and c.mesh_axis == axis:
            continue  # the pipeline's own (tied weights' sum)
        owner = _owner(c.module, owners)
        if owner is None or owner == index:
            shift = 1 if axis is not None and c.mesh_axis > axis else 0
            mine.append(dataclasses.replace(c, mesh_axis=c.mesh_axis - shift))
    return tuple(mine)


def _prefixes(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def _owner(module: str, owners: dict[str, int]) -> int | None:
    parts = module.split(".")
    for i in range(len(parts), 0, -1):
        found = owners.get(".".join(parts[:i]))
        if found is not None:
            return found
    return None


def per_step(plan: Plan, c: Collective) -> int:
    """How often one step runs record ``c``: a parameter's gradient synchronisation once, everything else
    once per microbatch (:func:`~autoshard.problem.costs.repeats`)."""
    return 1 if c.phase == "backward" and c.node in plan.param_placements else plan.microbatches
