"""The plan's step time as a critical path, and the memory no single node owns.

Input: a :class:`~autoshard.problem.build.BuiltProblem`, the chosen strategy per variable and the plan's
collectives (one record per layer copy, :class:`~autoshard.plans.Collective`).
Output: (predicted step seconds, exposed communication seconds) and a memory breakdown in bytes.

Step time follows :mod:`cost_models.overlap` under ``CostOptions.overlap``:

* gradient synchronisation (a backward collective that moves a *parameter's* gradient) is ready when the
  backward of the parameter's first consumer ends (:mod:`autoshard.problem.ready`: a repeated layer, or an
  op outside the layers -- an MLP's fc1 and fc2, a transformer's head and embedding) and overlaps the
  backward of every unit after it; the syncs are fed to ``exposed_gradient_sync`` in backward order with
  each unit's backward compute, bucketed by ``bucket_bytes``.  The report states the result
  (:class:`~cost_models.overlap.SyncExposure`: how much is exposed, and the last bucket that always shows);
  the buckets themselves (``Plan.grad_buckets``: members, bytes, the unit after which each is issued) are
  what the runtime issues (:mod:`autoshard.runtime.overlap`);
* forward all-gathers of parameters (FSDP) are prefetched under the previous layer's forward
  (``exposed_prefetched_gathers``); those outside the layers are exposed;
* every other collective (tensor / sequence parallel, resharding) is exposed.

The solver prices a repeated layer's gradient sync once and the other copies as hidden (``cost_models.overlap``
says why), and every other collective in full; its objective equals this step time while each layer's sync
is shorter than its backward, no FSDP gather is exposed and no sync outside the layers hides, and is below
it otherwise.  The lower-bound problem takes out what may hide (:mod:`autoshard.problem.unpaid`).

Memory no single node owns (runtime reserve, gathered FSDP weights, the largest temporary) is part of the
solver's budget: :mod:`autoshard.problem.extras` writes it as solver terms and reads it back for the plan.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from autoshard.plans import Collective
from autoshard.problem.build import BuiltProblem
from autoshard.problem.costs import node_compute
from autoshard.problem.ready import Backward, Unit, backward_units, priced_buckets, unit_backward
from autoshard.strategies import OpStrategy
from cost_models.overlap import GradBucket, SyncExposure, exposed_prefetched_gathers, sync_schedule

__all__ = ["critical_path"]


def _per_layer_compute(
    built: BuiltProblem, chosen: dict[str, OpStrategy]
) -> tuple[dict[int, float], dict[Unit, float]]:
    """Forward compute of each repeated layer (one copy), backward compute of every unit (one microbatch)."""
    fwd: dict[int, float] = defaultdict(float)
    bwd: dict[Unit, float] = defaultdict(float)
    for name in built.variables:
        info = built.infos[name]
        if info.block is None:
            continue
        inputs = tuple(built.infos[s] for s in info.inputs)
        f, b = node_compute(info, chosen[name], built.cluster, built.options, inputs)
        layers = range(built.num_blocks) if built.num_blocks > 1 else (info.block[0],)
        for layer in layers:
            fwd[layer] += f
            bwd[layer] += b
    for name, info in built.infos.items():  # every op outside the layers (each copy of a further run too)
        if info.block is None and info.kind == "op":
            bwd[name] += unit_backward(built, name, chosen[built.template[name]])
    return fwd, bwd


def _moves_parameter(built: BuiltProblem, c: Collective) -> bool:
    info = built.infos.get(c.tensor)
    return info is not None and info.kind == "parameter"


def _sync_unit(built: BuiltProblem, units: Backward, c: Collective) -> Unit | None:
    """The unit after whose backward ``c`` (a gradient sync) may start: its layer copy, or where the
    parameter's gradient is ready (module docstring)."""
    if built.infos[c.tensor].block is not None:
        return c.layer
    return units.ready.get(c.tensor)


def critical_path(
    built: BuiltProblem, chosen: dict[str, OpStrategy], collectives: Sequence[Collective], compute: float
) -> tuple[float, float, SyncExposure | None, tuple[GradBucket, ...]]:
    """(step seconds, exposed communication seconds, the gradient sync's share, its buckets) of the plan
    (module docstring); the share is None where nothing is synchronised."""
    policy = built.options.overlap
    units = backward_units(built)
    fwd, bwd = _per_layer_compute(built, chosen)
    syncs: dict[Unit, dict[str, list[float]]] = defaultdict(dict)  # unit -> parameter -> [seconds, bytes]
    collected: dict[Unit, list[Collective]] = defaultdict(list)  # unit -> its syncs (Plan.grad_buckets)
    gather: dict[int | None, float] = defaultdict(float)
    regather: dict[int | None, float] = defaultdict(float)
    exposed = stray = 0.0
    for c in collectives:
        if c.phase == "backward" and _moves_parameter(built, c):
            unit = _sync_unit(built, units, c)
            if unit is None or unit not in units.index:  # no consumer in the graph: nothing hides it
                stray += c.seconds
                continue
            collected[unit].append(c)
            entry = syncs[unit].setdefault(c.node, [0.0, 0.0])
            entry[0] += c.seconds
            entry[1] += c.nbytes
        elif c.phase == "forward" and c.kind == "all_gather" and _moves_parameter(built, c):
            gather[c.layer] += c.seconds
        elif c.phase == "regather":  # FSDP's backward re-gathers, prefetched like the forward ones
            regather[c.layer] += c.seconds
        else:
            exposed += c.seconds
    # backward visits the last unit first; a unit's gradients are all ready as its backward ends and join a
    # bucket together (a bucket closes at a unit's end: what keeps one copy per repeated layer a tight bound)
    backward, seconds, nbytes = [], [], []
    for u in reversed(units.order):
        backward.append(bwd.get(u, 0.0) if units.hides(u) else 0.0)
        seconds.append(sum(sec for sec, _ in syncs[u].values()) if u in syncs else 0.0)
        nbytes.append(sum(size for _, size in syncs[u].values()) if u in syncs else 0.0)
    order = list(reversed(units.order))
    hidden, last = sync_schedule(backward, seconds, policy, grad_bytes=nbytes)
    buckets = priced_buckets(order, collected, seconds, nbytes, policy.bucket_bytes)  # what the runtime runs
    total = sum(seconds) + stray
    grad_sync = None
    if total > 0:
        names = tuple(n for j in last for n in reversed(syncs[order[j]]))  # the runtime's order: bias first
        grad_sync = SyncExposure(total, hidden + stray, names, sum(seconds[j] for j in last))
    exposed += hidden + stray
    layers = sorted(
        {u for u in units.order if isinstance(u, int)} | {k for k in (*gather, *regather) if k is not None}
    )
    exposed += gather.get(None, 0.0)
    gathered = [gather.get(i, 0.0) for i in layers]
    # gathers are per step (one per microbatch, resharded after forward); so is the compute hiding them
    hiding = [fwd.get(i, 0.0) * built.options.microbatches for i in layers]
    exposed += exposed_prefetched_gathers(gathered, hiding, policy.prefetch)
    # FSDP's backward re-gathers, in backward order under the backward of the layer after (per step too)
    again = [regather.get(i, 0.0) for i in reversed(layers)]
    behind = [bwd.get(i, 0.0) * built.options.microbatches for i in reversed(layers)]
    exposed += regather.get(None, 0.0) + exposed_prefetched_gathers(again, behind, policy.prefetch)
    return compute + exposed, exposed, grad_sync, buckets
