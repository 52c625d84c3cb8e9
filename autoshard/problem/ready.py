"""Where in backward each parameter's gradient is ready: the units the gradient-sync overlap is priced over.

Input: a :class:`~autoshard.problem.build.BuiltProblem`.  Output: :class:`Backward`, the step's backward as a
sequence of *units* in forward (graph) order -- one per repeated layer (a collapsed stack of N blocks stands
for layers 0 … N-1), one per other op node -- and the unit at which each parameter's gradient is complete.

Why this is the order the runtime sees: autograd runs the backward nodes in reverse order of their creation,
so the gradient of a parameter is complete once the backward of its *first* consumer in the graph has run;
DDP's buckets and :class:`~autoshard.runtime.overlap.GradSyncOverlap` issue its all-reduce from that
parameter's post-accumulate-grad hook.  A linear layer's weight and bias share one unit (one consumer); fc2
of an MLP is ready one layer before fc1, whose backward then hides fc2's sync
(:func:`autoshard.problem.step.critical_path`, :mod:`cost_models.overlap` item 2).

The lower-bound problem (:mod:`autoshard.problem.unpaid`) needs one unit whose sync is surely exposed:
:meth:`Backward.final` -- layer 0 of a collapsed stack (the solver charges that copy's sync; the other copies
are hidden), else the unit of the first parameter consumer (nothing before it has a backward to hide it).
The backward of the units after the final one (what runs before the first layer in a stack: the embedding's
scatter of its tokens' gradients) is not counted as hiding any sync (:meth:`Backward.hides`): it is short,
and what it hides, ``min(its time, the final unit's sync)``, is no linear term: a bound taking all of it off
every plan is loose wherever the final unit reduces less, and proves nothing there.  The step is then at
most that backward above what runs, never below.  So the sync of the final unit and all ready after it is
always exposed (a suffix bound).  Syncs ready before the final unit may all hide: even small ones that
would share the final unit's bucket (a small model) are issued early in a plan whose final unit reduces
nothing, and which plans do is not a linear term; so the bound is loose there, never above a step.

The buckets the step prices are recorded for the runtime (:func:`priced_buckets`, ``Plan.grad_buckets``):
``cost_models.overlap.SyncStream``'s buckets over these units, one record per mesh axis a bucket reduces
on, with its members' names, bytes and the unit after which it is issued; the runtime builds exactly those
and issues each as its last member's gradient arrives (:mod:`autoshard.runtime.overlap` says why that is
never later than priced).

Example::

    units = backward_units(built)
    units.ready["p_fc2_weight"], units.final()     # 'linear_1', 'linear'
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from autoshard.problem.costs import node_compute
from cost_models.overlap import GradBucket, sync_buckets

if TYPE_CHECKING:
    from autoshard.plans import Collective
    from autoshard.problem.build import BuiltProblem
    from autoshard.problem.graph import NodeInfo
    from autoshard.strategies import OpStrategy

__all__ = ["Backward", "Unit", "backward_units", "priced_buckets", "unit_backward", "unit_of"]

Unit = int | str
"""A repeated layer's index, or the name of an op node outside the repeated layers."""


@dataclass(frozen=True, slots=True)
class Backward:
    """The backward's units in forward order, and the unit at which each parameter's gradient is ready."""

    order: tuple[Unit, ...]  # forward (graph) order; backward visits them reversed
    ready: dict[str, Unit]  # parameter node -> the unit of its first consumer
    collapsed: bool  # a stack of N identical blocks was collapsed (the solver charges one copy's sync)
    index: dict[Unit, int]  # unit -> its position in ``order``

    def position(self, unit: Unit) -> int:
        return self.index[unit]

    def final(self) -> Unit | None:
        """The unit whose sync the lower bound keeps exposed (module docstring); None: no parameter."""
        if self.collapsed and 0 in self.order:
            return 0
        return next(iter(self.ready.values()), None)

    def hidden(self, parameter: str) -> bool:
        """Whether ``parameter``'s gradient is ready before the final unit's in backward (its sync may hide)."""
        unit, final = self.ready.get(parameter), self.final()
        if unit is None or final is None:
            return False
        return self.position(unit) > self.position(final)

    def hides(self, unit: Unit) -> bool:
        """Whether ``unit``'s backward counts as hiding syncs: not after the final unit's (module docstring)."""
        final = self.final()
        return final is None or self.position(unit) >= self.position(final)


def unit_of(info: NodeInfo) -> Unit:
    return info.block[0] if info.block is not None else info.name


def backward_units(built: BuiltProblem) -> Backward:
    """The units of ``built``'s step and where each parameter's gradient is ready (module docstring)."""
    order: list[Unit] = []
    seen: set[Unit] = set()
    ready: dict[str, Unit] = {}
    collapsed = built.num_blocks > 1
    for info in built.infos.values():
        if info.kind != "op":
            continue
        unit = unit_of(info)
        if unit not in seen:
            # a collapsed stack: its first block stands for every layer, in order
            new = list(range(built.num_blocks)) if collapsed and isinstance(unit, int) else [unit]
            order += [u for u in new if u not in seen]
            seen.update(new)
        for name in info.inputs:
            if built.infos[name].kind == "parameter" and name not in ready:
                ready[name] = unit
    return Backward(tuple(order), ready, collapsed, {u: i for i, u in enumerate(order)})


def unit_backward(built: BuiltProblem, name: str, strategy: OpStrategy) -> float:
    """Backward seconds of op node ``name`` under ``strategy`` (one microbatch, as the step prices it)."""
    info = built.infos[name]
    inputs = tuple(built.infos[s] for s in info.inputs)
    return node_compute(info, strategy, built.cluster, built.options, inputs)[1]


def priced_buckets(
    backward: Sequence[Unit],
    syncs: Mapping[Unit, Sequence[Collective]],
    seconds: Sequence[float],
    nbytes: Sequence[float],
    bucket_bytes: int,
) -> tuple[GradBucket, ...]:
    """The step's gradient buckets as :class:`~cost_models.overlap.SyncStream` forms them (``Plan.grad_buckets``).

    ``backward``: the units in backward order; ``syncs[u]``: the gradient syncs ready at unit ``u`` (one
    record per collective, as the plan lists them); ``seconds``/``nbytes``: each unit's, as the stream was
    fed.  Each stream bucket becomes one record per (mesh axis, kind) it reduces on, its members in
    backward order (within a unit the plan's last first: bias before weight), a member reduced twice on one
    axis counted once with both reductions' bytes."""
    records: list[GradBucket] = []
    for index, bucket in enumerate(sync_buckets(seconds, nbytes, bucket_bytes)):
        last = backward[bucket[-1]]
        unit = f"layer {last}" if isinstance(last, int) else last
        groups: dict[tuple[int, str], dict[str, int]] = {}
        for j in bucket:
            for c in reversed(syncs.get(backward[j], ())):
                members = groups.setdefault((c.mesh_axis, c.kind), {})
                members[c.node] = members.get(c.node, 0) + c.nbytes
        for (axis, kind), members in groups.items():
            total = sum(members.values())
            records.append(GradBucket(axis, kind, tuple(members), total, unit, index, bucket_bytes))
    return tuple(records)
