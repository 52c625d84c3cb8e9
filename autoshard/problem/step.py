"""The plan's step time as a critical path, and the memory no single node owns.

Input: a :class:`~autoshard.problem.build.BuiltProblem`, the chosen strategy per variable and the plan's
collectives (one record per layer copy, :class:`~autoshard.plans.Collective`).
Output: (predicted step seconds, exposed communication seconds) and a memory breakdown in bytes.

Step time follows :mod:`cost_models.overlap` under ``CostOptions.overlap``:

* gradient synchronisation (a backward collective that moves a *parameter's* gradient) of layer i overlaps
  the backward of layers i-1 … 0; the layers' syncs are fed to ``exposed_gradient_sync`` in backward order
  with each layer's backward compute, bucketed by ``bucket_bytes``.  Syncs of parameters outside the
  repeated layers (embedding, head, final norm) are counted exposed in full: the graph does not say where
  in backward they become ready, and the embedding's, the usual largest, is ready last;
* forward all-gathers of parameters (FSDP) are prefetched under the previous layer's forward
  (``exposed_prefetched_gathers``); those outside the layers are exposed;
* every other collective (tensor / sequence parallel, resharding) is exposed.

The solver prices a repeated layer's gradient sync once and the other copies as hidden (``cost_models.overlap``
says why), and every other collective in full; its objective equals this step time while each layer's sync
is shorter than its backward and no FSDP gather is exposed, and is below it otherwise.

Memory no single node owns (runtime reserve, gathered FSDP weights, the largest temporary) is part of the
solver's budget: :mod:`autoshard.problem.extras` writes it as solver terms and reads it back for the plan.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from autoshard.plans import Collective
from autoshard.problem.build import BuiltProblem
from autoshard.problem.costs import node_compute
from autoshard.strategies import OpStrategy
from cost_models.overlap import exposed_gradient_sync, exposed_prefetched_gathers

__all__ = ["critical_path"]


def _per_layer_compute(
    built: BuiltProblem, chosen: dict[str, OpStrategy]
) -> tuple[dict[int, float], dict[int, float]]:
    """(forward, backward) compute seconds of each repeated layer, one copy."""
    fwd: dict[int, float] = defaultdict(float)
    bwd: dict[int, float] = defaultdict(float)
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
    return fwd, bwd


def _moves_parameter(built: BuiltProblem, c: Collective) -> bool:
    info = built.infos.get(c.tensor)
    return info is not None and info.kind == "parameter"


def critical_path(
    built: BuiltProblem, chosen: dict[str, OpStrategy], collectives: Sequence[Collective], compute: float
) -> tuple[float, float]:
    """(step seconds, exposed communication seconds) of the plan (module docstring)."""
    policy = built.options.overlap
    fwd, bwd = _per_layer_compute(built, chosen)
    sync: dict[int | None, float] = defaultdict(float)
    sync_bytes: dict[int | None, float] = defaultdict(float)
    gather: dict[int | None, float] = defaultdict(float)
    regather: dict[int | None, float] = defaultdict(float)
    exposed = 0.0
    for c in collectives:
        if c.phase == "backward" and _moves_parameter(built, c):
            sync[c.layer] += c.seconds
            sync_bytes[c.layer] += c.nbytes
        elif c.phase == "forward" and c.kind == "all_gather" and _moves_parameter(built, c):
            gather[c.layer] += c.seconds
        elif c.phase == "regather":  # FSDP's backward re-gathers, prefetched like the forward ones
            regather[c.layer] += c.seconds
        else:
            exposed += c.seconds
    layers = sorted(set(fwd) | {k for k in (*sync, *gather, *regather) if k is not None})
    order = list(reversed(layers))  # backward visits the last layer first
    exposed += exposed_gradient_sync(
        [bwd.get(i, 0.0) for i in order] + [0.0],
        [sync.get(i, 0.0) for i in order] + [sync.get(None, 0.0)],
        policy,
        grad_bytes=[sync_bytes.get(i, 0.0) for i in order] + [sync_bytes.get(None, 0.0)],
    )
    exposed += gather.get(None, 0.0)
    gathered = [gather.get(i, 0.0) for i in layers]
    # gathers are per step (one per microbatch, resharded after forward); so is the compute hiding them
    hiding = [fwd.get(i, 0.0) * built.options.microbatches for i in layers]
    exposed += exposed_prefetched_gathers(gathered, hiding, policy.prefetch)
    # FSDP's backward re-gathers, in backward order under the backward of the layer after (per step too)
    again = [regather.get(i, 0.0) for i in order]
    behind = [bwd.get(i, 0.0) * built.options.microbatches for i in order]
    exposed += regather.get(None, 0.0) + exposed_prefetched_gathers(again, behind, policy.prefetch)
    return compute + exposed, exposed
