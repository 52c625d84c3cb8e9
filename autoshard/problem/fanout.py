"""One redistribution per (tensor, target layout): group the uses of a tensor and build its fan-out node.

Input: the weighted uses of :func:`autoshard.problem.build._edge_weights` (template producer, template
consumer, output, input position, weight in the full model).  Output: a :class:`Sharing` that says which
uses are priced alone (an ordinary edge) and which share one fan-out node
(:mod:`autoshard.search.fanout` has the exact formulation), and :func:`fanout_arrays`, the node costs and
edges of those nodes, appended after the graph's own variables.

Grouping, per template producer output and weight (the weights of ``build``'s module docstring):

- uses of one tensor with the same weight form one group: inside a layer (weight N: the norm's output read
  by q, k and v), from one layer into the next (N - 1: the residual read by the next norm and add), from
  outside into the first layer (1);
- a tensor made outside the repeated layers and read by every layer (an attention mask, RoPE tables) is
  one tensor: all layers pick the same strategy, so they want the same layout and share one
  redistribution.  Its weight is 1, not N, and it joins the producer's other weight-1 uses;
- a use whose producer and consumer share a template (a node feeding its own copy in the next layer)
  stays an edge (it is folded into the node cost).

Left out, said here: a layer's output read both inside its own layer and by the next layer (weights N
and N - 1) forms two groups, so a layout both want is priced twice (codegen moves it once).  No
transformer in the zoo has that shape.

Element of a consumer strategy: ``(forward spec wanted, gradient spec given back)``, interned ids.  Two
consumers with the same element run the same redistribution both ways, which is what codegen shares.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from autoshard.problem.autocast import moved_itemsize
from autoshard.problem.costs import CostOptions, StepCache, dual_spec, repeats
from autoshard.problem.graph import NodeInfo
from autoshard.problem.pairs import SpecPairs, spec_pairs
from autoshard.problem.recompute import rerun_share
from autoshard.problem.runs import RunPosition, reads_into_run
from autoshard.problem.runs import relation as run_relation
from autoshard.problem.shared import BuildCache
from autoshard.search import Edge
from autoshard.search import fanout as search_fanout
from autoshard.search.fanout import FanOutNode, best_state, fanout_node, shareable
from autoshard.strategies import OpStrategy

__all__ = [
    "FanOut",
    "Group",
    "Sharing",
    "UseKey",
    "complete_choice",
    "element_of",
    "fanout_arrays",
    "split_uses",
]

UseKey = tuple[str, str, int, int]  # (template producer, template consumer, which output, input position)


@dataclass(frozen=True, slots=True)
class Group:
    """Uses of one producer output with one weight: candidates for one fan-out node."""

    producer: str
    which: int
    weight: int
    entries: tuple[tuple[str, int], ...]  # (template consumer, input position)


@dataclass(frozen=True)
class Sharing:
    """Which uses are ordinary edges (with their weight) and which groups get a fan-out node."""

    single: dict[UseKey, int]
    groups: tuple[Group, ...]

    def group_of(self) -> dict[UseKey, Group]:
        return {(g.producer, c, g.which, p): g for g in self.groups for c, p in g.entries}


@dataclass(frozen=True)
class FanOut:
    """A fan-out node of the built problem: its variable index and the group it prices."""

    index: int
    group: Group
    node: FanOutNode


def split_uses(
    uses: Sequence,
    infos: Mapping[str, NodeInfo],
    template: Mapping[str, str],
    n_blocks: int,
    runs: Mapping[str, RunPosition] | None = None,
) -> Sharing:
    """Aggregate uses by template key (as ``build`` did) and group those one redistribution can serve.
    ``runs``: nodes of further runs of identical blocks (:mod:`autoshard.problem.runs`)."""
    runs = runs or {}
    weights: dict[UseKey, int] = defaultdict(int)
    relation: dict[UseKey, str] = {}
    for use in uses:
        key = (template[use.producer], template[use.consumer], use.which, use.position)
        weights[key] += use.weight
        in_run = run_relation(use.producer, use.consumer, runs)
        relation.setdefault(key, in_run or _relation(infos[use.producer], infos[use.consumer]))
    single: dict[UseKey, int] = {}
    by_tensor: dict[tuple[str, int, int, str], list[tuple[str, int]]] = defaultdict(list)
    for (tu, tv, which, pos), weight in weights.items():
        if n_blocks > 1 and infos[tu].block is None and infos[tv].block is not None:
            weight = 1  # one tensor read by every layer: one layout for all, moved once
        elif reads_into_run(tu, tv, runs):
            weight = 1  # the same for every block of a further run
        meta = infos[tu].outputs[which] if which < len(infos[tu].outputs) else None
        if tu == tv or meta is None:
            single[(tu, tv, which, pos)] = weight
        else:
            by_tensor[(tu, which, weight, relation[(tu, tv, which, pos)])].append((tv, pos))
    groups = []
    for (tu, which, weight, _), entries in by_tensor.items():
        if len(entries) == 1:
            single[(tu, entries[0][0], which, entries[0][1])] = weight
        else:
            groups.append(Group(tu, which, weight, tuple(entries)))
    return Sharing(single, tuple(groups))


def _relation(producer: NodeInfo, consumer: NodeInfo) -> str:
    """Which copy of a block producer a use reads: the same layer's, the previous layer's, or the last
    layer's (read outside); uses of one template producer in different relations read different tensors."""
    if producer.block is None:
        return "outside"
    if consumer.block is None:
        return "leaves"
    return "same" if producer.block[0] == consumer.block[0] else "next"


def element_of(
    producer: NodeInfo, dst: OpStrategy, pos: int, opts: CostOptions, cache: StepCache
) -> tuple[int, int]:
    """``(forward spec id, gradient spec id)`` a consumer strategy needs of this input (-1 for none)."""
    want = cache.intern(dst.inputs[pos])
    grad = cache.intern(dst.input_grads[pos]) if opts.training and producer.requires_grad else -1
    return want, grad


def fanout_arrays(
    sharing: Sharing,
    infos: Mapping[str, NodeInfo],
    index: Mapping[str, int],
    strategies: Mapping[str, tuple[OpStrategy, ...]],
    opts: CostOptions,
    cache: StepCache,
    shared: BuildCache | None = None,
) -> tuple[list[FanOut], list[Group], list[str]]:
    """Fan-out nodes (indices from ``len(index)`` on), the groups with nothing to share (their uses are
    ordinary edges, exactly priced), and one note per kind of upper bound, naming the modules it touches.
    ``shared``: the builds of one capture keep each group's elements and tables there
    (:mod:`autoshard.problem.shared`)."""
    fans: list[FanOut] = []
    unshared: list[Group] = []
    per_use: list[str] = []  # producers whose uses are priced one by one although they could share
    inexact: list[str] = []  # producers whose fan-out node prices two shared layouts as one
    for group in sharing.groups:
        consumer = infos[group.entries[0][0]]  # the uses of a group share their relation to the blocks
        node, entries = _group_node(group, infos[group.producer], consumer, strategies, opts, cache, shared)
        if node is None:
            unshared.append(group)
            if shareable(entries):
                per_use.append(group.producer)
            continue
        fans.append(FanOut(len(index) + len(fans), group, node))
        if not node.exact:
            inexact.append(group.producer)
    notes = []
    if per_use:
        notes.append(
            f"{_where(per_use, infos)}: their consumers can combine too many layouts to price one "
            f"redistribution per layout (over {search_fanout.MAX_FANOUT_STATES} states); each is priced once "
            "per consumer (an upper bound)"
        )
    if inexact:
        notes.append(
            f"{_where(inexact, infos)}: their consumers want too many layout combinations to price sharing "
            "exactly; two layouts each shared by several of them are priced as if one were not shared "
            "(an upper bound)"
        )
    return fans, unshared, notes


def _where(producers: Sequence[str], infos: Mapping[str, NodeInfo], shown: int = 3) -> str:
    """``"7 ops' outputs (in model.layers.0.mlp, model.layers.0.self_attn, model.norm and 2 more)"``: how
    many, and the user modules that make them (fx node names mean nothing to a reader); a repeated layer's
    ops are those of its template, the first layer."""
    modules = sorted({infos[p].module or "the model's top level" for p in producers})
    more = f" and {len(modules) - shown} more" if len(modules) > shown else ""
    listed = ", ".join(modules[:shown]) + more
    ops = "1 op's output" if len(producers) == 1 else f"{len(producers)} ops' outputs"
    repeated = any(infos[p].block is not None for p in producers)  # captured once, in the first block
    return f"{ops} (in {listed}{'; the first repeated layer stands for all' if repeated else ''})"


def _group_node(
    group: Group,
    producer: NodeInfo,
    consumer: NodeInfo,
    strategies: Mapping[str, tuple[OpStrategy, ...]],
    opts: CostOptions,
    cache: StepCache,
    shared: BuildCache | None = None,
) -> tuple[FanOutNode | None, list[np.ndarray]]:
    key = (group, opts.training, opts.precision)

    def make() -> _Elements:
        def ids() -> _Ids:  # no collective price: a zigzag cluster's build reads its plain cluster's
            return _ids(group, producer, strategies, opts, cache)

        pairs = ids() if shared is None else shared.get("fanout pairs", key, ids)
        forward, back = (p.table(cache.prices) if p is not None else None for p in pairs.pairs)
        assert forward is not None
        return _Elements(pairs.entries, (forward, back.T if back is not None else None))

    found = make() if shared is None else shared.get("fanout", key, make)
    share = rerun_share(producer, consumer, opts)  # recomputed blocks re-issue, FSDP re-gathers (as extract)

    def node() -> FanOutNode | None:
        element_cost = _priced(producer, found.tables, opts)
        if share:  # the shared move is re-run once: by the recomputed blocks, or re-gathered after forward
            again = _priced(producer, found.tables, replace(opts, training=False))
            element_cost = element_cost + again * share
        return fanout_node(element_cost * group.weight, found.entries, search_fanout.MAX_FANOUT_STATES)

    if shared is None:
        return node(), found.entries
    # all the node reads of the options (_priced, repeats): builds that agree share it (never changed)
    return shared.latest("fanout node", key, (share, opts.microbatches), node), found.entries


@dataclass(frozen=True, slots=True)
class _Elements:
    """A group's elements and their redistribution tables (only ``training``, ``precision`` change them)."""

    entries: list[np.ndarray]  # per consumer, its element per strategy
    tables: tuple[np.ndarray, np.ndarray | None]  # _tables: [S_producer, E] forward, backward (or None)


@dataclass(frozen=True, slots=True)
class _Ids:
    """A group's elements and the spec pairs of their tables (:func:`_pairs`): no collective prices them."""

    entries: list[np.ndarray]  # per consumer, its element per strategy
    pairs: tuple[SpecPairs, SpecPairs | None]  # forward, backward (or None)


def _ids(
    group: Group,
    producer: NodeInfo,
    strategies: Mapping[str, tuple[OpStrategy, ...]],
    opts: CostOptions,
    cache: StepCache,
) -> _Ids:
    ids: dict[tuple[int, int], int] = {}
    entries = []
    for name, pos in group.entries:
        elems = [element_of(producer, s, pos, opts, cache) for s in strategies[name]]
        entries.append(np.array([ids.setdefault(e, len(ids)) for e in elems]))
    src = strategies[group.producer]
    return _Ids(entries, _pairs(producer, group.which, src, list(ids), opts, cache))


def _pairs(
    producer: NodeInfo,
    which: int,
    src_list: tuple[OpStrategy, ...],
    elements: list[tuple[int, int]],
    opts: CostOptions,
    cache: StepCache,
) -> tuple[SpecPairs, SpecPairs | None]:
    """The spec pairs of ``[S_producer, E]``: one forward redistribution of element ``e`` from strategy
    ``a``, and the gradient's way back (None when no gradient flows)."""
    meta = producer.outputs[which]
    assert meta is not None
    outs = [s.outputs[which] if which < len(s.outputs) else None for s in src_list]
    have = [cache.intern(o) for o in outs]
    want = [w for w, _ in elements]
    # whole tables, each distinct spec pair priced once (problem/pricing.py), equal to cache.time per pair
    size = moved_itemsize(producer, which, opts.precision)  # under amp: the producer's autocast dtype
    forward = spec_pairs(have, want, meta.shape, size, cache)
    if not (opts.training and producer.requires_grad):
        return forward, None
    duals = [cache.intern(dual_spec(o)) if o is not None else -1 for o in outs]
    grads = [g for _, g in elements]
    back = moved_itemsize(producer, which, opts.precision, gradient=True)
    return forward, spec_pairs(grads, duals, meta.shape, back, cache)


def _tables(
    producer: NodeInfo,
    which: int,
    src_list: tuple[OpStrategy, ...],
    elements: list[tuple[int, int]],
    opts: CostOptions,
    cache: StepCache,
) -> tuple[np.ndarray, np.ndarray | None]:
    """``[S_producer, E]`` seconds of one forward redistribution of element ``e`` from strategy ``a``, and of
    the gradient's way back (None when no gradient flows)."""
    forward, back = _pairs(producer, which, src_list, elements, opts, cache)
    return forward.table(cache.prices), (back.table(cache.prices).T if back is not None else None)


def _priced(
    producer: NodeInfo, tables: tuple[np.ndarray, np.ndarray | None], opts: CostOptions
) -> np.ndarray:
    """Seconds per step from :func:`_tables`: forward per microbatch, backward as :func:`repeats` says."""
    parameter = producer.kind == "parameter"
    fwd_times = repeats(opts, parameter=parameter, backward=False)  # per step: microbatches, or once
    bwd_times = repeats(opts, parameter=parameter, backward=True)
    forward, backward = tables
    cost = forward * fwd_times
    if opts.training and producer.requires_grad and backward is not None:
        cost = cost + backward * bwd_times
    return cost


def _element_cost(
    producer: NodeInfo,
    which: int,
    src_list: tuple[OpStrategy, ...],
    elements: list[tuple[int, int]],
    opts: CostOptions,
    cache: StepCache,
) -> np.ndarray:
    """``C[a, e]``: forward + backward seconds of element ``e`` when the producer runs ``a`` (one layer)."""
    return _priced(producer, _tables(producer, which, src_list, elements, opts, cache), opts)


def fanout_edges(fans: Sequence[FanOut], index: Mapping[str, int]) -> list[Edge]:
    """Producer → F and F → consumer edges of every fan-out node."""
    edges: list[Edge] = []
    for fan in fans:
        edges.append(Edge(index[fan.group.producer], fan.index, fan.node.producer_cost))
        for (consumer, _), matrix in zip(fan.group.entries, fan.node.consumer_costs, strict=True):
            edges.append(Edge(fan.index, index[consumer], matrix))
    return edges


def complete_choice(
    fans: Sequence[FanOut], choice: Mapping[str, int], strategies: Mapping[str, tuple[OpStrategy, ...]]
) -> list[int]:
    """The best state of every fan-out node once the variables' strategy indices ``choice`` are fixed."""
    return [
        best_state(fan.node, choice[fan.group.producer], [choice[c] for c, _ in fan.group.entries])
        for fan in fans
    ]
