"""Memory no single node owns, written as solver terms so the memory budget sees it.

Input: the builder's edge uses, node records, strategies and :class:`~autoshard.problem.costs.CostOptions`.
Output: :class:`MemoryExtras`: auxiliary solver nodes for gathered FSDP weights and a per-node *peak* vector
for the largest temporary (:class:`~autoshard.search.SearchProblem` ``peak``); :func:`extra_memory` reads
the same terms back for a chosen plan (the plan's ``memory_breakdown``), so the plan's memory is the
memory the budget constrained.

Gathered weights.  A parameter stored with spec ``h`` and read by a consumer that wants spec ``w`` is
all-gathered before use when ``h -> w`` has an all-gather step; the gathered buffer (``Step.nbytes`` of the
last gather: the tensor unsharded over that axis, in the dtype it is gathered in --
:func:`~autoshard.problem.autocast.moved_itemsize`: bf16 under the amp recipe) lives while the consumer runs.
The path is the one the emitted program runs: codegen lowers every edge with
:func:`~autoshard.problem.moves.edge_steps` on the plan's *plain* cluster
(:func:`autoshard.codegen.parallelize.plan_cluster`: a Plan records no sequence layout in its cluster),
and the zigzag layout only adds its reordering copies to those steps (codegen/collectives.py).  So on a
:class:`~autoshard.problem.context.ZigzagCluster`, whose raised move prices may pick other (cheapest) paths
gathering other sizes, the sizes are still the plain cluster's paths' (:func:`runtime_steps`): a plan's
gathered memory does not depend on its sequence layout (planner_layout.py, F3).
The size depends on the *pair* of strategies, so each such parameter use gets an auxiliary node whose states
are the pairs ``(w, b)`` of a wanted spec and a buffer size that occur: an edge to the consumer allows only states with
its ``w``, an edge to the parameter only states whose ``b`` is what its ``h`` gathers into that ``w``
(``inf`` otherwise, no cost), and the node's memory is ``b``.  (Pairs ``(h, w)`` would do too; keying by
size merges the stored specs that gather the same bytes: 81 states become ~20 on a 2-D mesh.)  Exact and
pairwise: the solvers need no change, and without a budget the auxiliary nodes hold
no cost and fold away (``search/reduce``).  How much is counted follows torch's FSDP2
(``torch.distributed.fsdp.fully_shard``: each block is a unit resharded after forward, the root unit, here
everything outside the repeated blocks, is not, "since its parameters would typically be immediately
all-gathered for backward"):

* a repeated block's parameters: ``1 + prefetch`` blocks gathered at a time (``OverlapPolicy.prefetch``),
  once for the whole stack, not per layer;
* a parameter outside the blocks (embedding, head, leading layers that differ): gathered for the step, so
  every one counts (at the peak, the end of forward, the head is gathered next to the last block).

Largest temporary.  The largest local output of an op that backward does not keep is alive while the next
op runs, on top of everything kept: a max over nodes, given to the solver as ``SearchProblem.peak``
(:mod:`autoshard.search.peak` solves it exactly by thresholds).  Only the largest counts, once.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from autoshard.problem.autocast import moved_itemsize
from autoshard.problem.context import plain_cluster
from autoshard.problem.costs import CostOptions, _local_bytes
from autoshard.problem.graph import NodeInfo
from autoshard.problem.moves import StepCache
from autoshard.problem.shared import BuildCache
from autoshard.search import Edge
from autoshard.search.problem import format_bytes
from autoshard.strategies import OpStrategy
from cost_models.memory import PrecisionPolicy

__all__ = ["GatherNode", "MemoryExtras", "extra_memory", "memory_extras", "runtime_steps"]


@dataclass(frozen=True, slots=True)
class GatherNode:
    """One parameter use that may gather: states are ``(wanted spec id, gathered bytes)`` pairs."""

    producer: str  # the parameter's variable node
    consumer: str  # the consumer's variable node
    states: tuple[tuple[int, float], ...]
    memory: np.ndarray  # bytes per state, ``factor`` included
    have: np.ndarray  # per producer strategy, its stored spec id
    want: np.ndarray  # per consumer strategy, the spec id it wants
    sizes: dict[tuple[int, int], float]  # (stored, wanted) spec ids -> gathered bytes (``factor`` excluded)
    # the two edge matrices, made once: every build of the capture reads them (read-only)
    matrices: tuple[np.ndarray, np.ndarray] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        matrices = (self._producer_matrix(), self._consumer_matrix())
        for m in matrices:
            m.setflags(write=False)
        object.__setattr__(self, "matrices", matrices)

    def state(self, producer: int, consumer: int) -> int:
        """The state a (producer strategy, consumer strategy) pair implies."""
        w = int(self.want[consumer])
        return self.states.index((w, self.sizes[(int(self.have[producer]), w)]))

    def _producer_matrix(self) -> np.ndarray:
        """``[S_producer, states]``: 0 where the stored spec gathers exactly the state's bytes, else inf."""
        stored, row = np.unique(self.have, return_inverse=True)  # one row per distinct stored spec
        rows = [
            [0.0 if self.sizes[(int(h), w)] == size else np.inf for w, size in self.states] for h in stored
        ]
        return np.array(rows).reshape(len(stored), len(self.states))[row.reshape(-1)]

    def _consumer_matrix(self) -> np.ndarray:
        """``[S_consumer, states]``: 0 where the consumer wants the state's spec, else inf."""
        wanted = np.array([w for w, _ in self.states])
        return np.where(self.want[:, None] == wanted[None, :], 0.0, np.inf)


@dataclass(frozen=True, slots=True)
class MemoryExtras:
    """The auxiliary nodes (solver nodes ``offset …``) and per-variable temporary sizes."""

    gathers: tuple[GatherNode, ...]
    offset: int  # solver index of the first gather node
    temporary: tuple[np.ndarray, ...]  # per variable, bytes of the largest temporary per strategy
    notes: tuple[str, ...] = ()

    def complete(self, chosen: dict[str, int]) -> list[int]:
        """The state of every gather node for a choice of the variables (``chosen``: name -> index)."""
        return [g.state(chosen[g.producer], chosen[g.consumer]) for g in self.gathers]

    def labels(self, cache: StepCache) -> list[tuple[str, ...]]:
        """Per gather node, one label per state: ``gather 1.00 GiB into (R, R)`` or ``(S(0), R) as stored``."""
        return [
            tuple(
                f"gather {format_bytes(size)} into {cache.spec(w)}" if size else f"{cache.spec(w)} as stored"
                for w, size in g.states
            )
            for g in self.gathers
        ]

    def edges(self, index: dict[str, int]) -> list[Edge]:
        out: list[Edge] = []
        for k, g in enumerate(self.gathers):
            out.append(Edge(index[g.producer], self.offset + k, g.matrices[0]))
            out.append(Edge(index[g.consumer], self.offset + k, g.matrices[1]))
        return out


def memory_extras(
    uses: Iterable,
    infos: dict[str, NodeInfo],
    template: dict[str, str],
    variables: Sequence[str],
    strategies: dict[str, tuple[OpStrategy, ...]],
    keeps: dict[str, bool],
    opts: CostOptions,
    cache: StepCache,
    offset: int,
    shared: BuildCache | None = None,
) -> MemoryExtras:
    """Gather nodes for every parameter use that can all-gather, and the temporary of every variable.
    ``shared``: the builds of one capture keep the gather nodes and each variable's output sizes there
    (:mod:`autoshard.problem.shared`); only ``keeps`` and the prefetch depth differ between builds."""
    prefetch = 1 + opts.overlap.prefetch
    precision = opts.precision
    if shared is None:
        gathers = _gathers(uses, infos, template, strategies, runtime_steps(cache), prefetch, precision)
    else:
        owner = shared if shared.base is None else shared.base  # a zigzag cluster's: its plain cluster's
        steps = runtime_steps(owner.steps)
        gathers = owner.get(
            "gathers",
            (prefetch, precision),
            lambda: _gathers(uses, infos, template, strategies, steps, prefetch, precision),
        )
    temporary = tuple(_temporary(infos[v], strategies[v], keeps, opts, cache, shared) for v in variables)
    layers = {infos[g.producer].block[0] for g in gathers if infos[g.producer].block is not None}  # type: ignore[index]
    notes: tuple[str, ...] = ()
    if len(layers) > 1:  # not collapsed: each layer has its own variables, and their gathers are summed
        notes = (
            f"gathered FSDP weights of the {len(layers)} uncollapsed layers are summed in the memory budget (an "
            "upper bound: FSDP holds 1 + prefetch layers at a time); plan with blocks='auto' to count them once",
        )
    return MemoryExtras(gathers, offset, temporary, notes)


def runtime_steps(cache: StepCache) -> StepCache:
    """The step cache whose paths the emitted program runs: ``cache`` itself, or for a zigzag cluster its plain
    cluster's, with the same spec ids (codegen lowers on the plain cluster: module doc)."""
    plain = plain_cluster(cache.cluster)
    return cache if plain is cache.cluster else StepCache(plain, specs=cache)


def _gathers(
    uses: Iterable,
    infos: dict[str, NodeInfo],
    template: dict[str, str],
    strategies: dict[str, tuple[OpStrategy, ...]],
    cache: StepCache,
    prefetch: int,
    precision: PrecisionPolicy | None,
) -> tuple[GatherNode, ...]:
    gathers: list[GatherNode] = []
    seen: set[tuple[str, str, int, int]] = set()
    sized: dict[tuple, float] = {}  # (have, want, shape, itemsize) -> bytes: weights of one shape share pairs
    for use in uses:
        tu, tv = template[use.producer], template[use.consumer]
        key = (tu, tv, use.which, use.position)
        producer = infos[tu]
        if producer.kind != "parameter" or key in seen or tu == tv:
            continue
        seen.add(key)
        factor = prefetch if producer.block is not None else 1
        node = _gather_node(
            producer, tu, tv, use.which, use.position, strategies, cache, factor, precision, sized
        )
        if node is not None:
            for array in (node.memory, node.have, node.want):
                array.setflags(write=False)  # shared by every build of the capture
            gathers.append(node)
    return tuple(gathers)


def _gather_node(
    producer: NodeInfo,
    tu: str,
    tv: str,
    which: int,
    pos: int,
    strategies: dict[str, tuple[OpStrategy, ...]],
    cache: StepCache,
    factor: int,
    precision: PrecisionPolicy | None,
    sized: dict[tuple, float],
) -> GatherNode | None:
    meta = producer.outputs[which] if which < len(producer.outputs) else None
    if meta is None:
        return None
    itemsize = moved_itemsize(producer, which, precision)  # amp: the recipe's gather dtype
    have = np.array(
        [cache.intern(s.outputs[which] if which < len(s.outputs) else None) for s in strategies[tu]]
    )
    want = np.array([cache.intern(s.inputs[pos]) for s in strategies[tv]])
    shape = tuple(meta.shape)
    sizes = {}
    for h in np.unique(have).tolist():
        for w in np.unique(want).tolist():
            key = (h, w, shape, itemsize)
            found = sized.get(key)
            if found is None:
                found = sized[key] = _gathered(cache, h, w, shape, itemsize)
            sizes[h, w] = found
    if not any(sizes.values()):
        return None
    states = tuple(sorted({(w, size) for (_, w), size in sizes.items()}))
    memory = np.array([factor * size for _, size in states])
    return GatherNode(tu, tv, states, memory, have, want, sizes)


def _gathered(cache: StepCache, have: int, want: int, shape: tuple[int, ...], itemsize: int) -> float:
    """Bytes of the buffer an all-gather of ``have -> want`` leaves (0 when nothing is gathered)."""
    src, dst = cache.spec(have), cache.spec(want)
    if src is None or dst is None:
        return 0.0
    steps = cache.get(src, dst, shape, itemsize) or ()
    return float(max((s.nbytes for s in steps if s.kind == "all_gather"), default=0))


def _temporary(
    info: NodeInfo,
    strategies: tuple[OpStrategy, ...],
    keeps: dict[str, bool],
    opts: CostOptions,
    cache: StepCache,
    shared: BuildCache | None = None,
) -> np.ndarray:
    """Per strategy, the largest local output of ``info`` that backward does not keep (0 if it keeps it)."""
    kept = opts.training and keeps.get(info.name, True) and info.requires_grad
    if info.kind != "op" or info.is_view or kept:
        return np.zeros(len(strategies))
    if shared is None:
        return _largest_output(info, strategies, cache)
    return shared.get("largest output", info.name, lambda: _largest_output(info, strategies, cache)).copy()


def _largest_output(info: NodeInfo, strategies: tuple[OpStrategy, ...], cache: StepCache) -> np.ndarray:
    out = np.zeros(len(strategies))
    for k, strat in enumerate(strategies):
        for meta, spec in zip(info.outputs, strat.outputs, strict=False):
            if meta is not None:
                out[k] = max(out[k], _local_bytes(meta.nbytes, spec, cache.mesh_shape))
    return out


def extra_memory(extras: MemoryExtras | None, choice: Sequence[int], reserve: float) -> dict[str, float]:
    """The plan's ``memory_breakdown``: the same terms the budget saw, at the solver's choice."""
    gathered = largest = 0.0
    if extras is not None:
        gathered = sum(float(g.memory[choice[extras.offset + k]]) for k, g in enumerate(extras.gathers))
        largest = max((float(t[c]) for t, c in zip(extras.temporary, choice, strict=False)), default=0.0)
    return {"runtime reserve": reserve, "gathered weights": gathered, "largest temporary": largest}
