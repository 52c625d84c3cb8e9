"""ZeRO-1's optimizer all-gathers as solver terms: the objective pays what ``Plan.optimizer_gathers`` lists.

Input: the builder's weighted uses, node records, strategies, copies per variable, the cluster and
:class:`~autoshard.problem.costs.CostOptions`.  Output: :class:`ZeroTerms`: edges, auxiliary nodes and node
terms appended to the :class:`~autoshard.search.SearchProblem`, and :meth:`ZeroTerms.complete`, the states of
its auxiliary nodes for a choice of the variables.

The price (:mod:`autoshard.problem.zero_gathers` says why and what the runtime runs).  For a parameter ``p``
running strategy ``a``, let ``g[a, x]`` be the seconds of ZeRO-1's all-gather on mesh axis ``x`` (zero where
``a`` does not replicate ``p`` on ``x``; its size does not depend on the other axes' reductions:
:func:`~autoshard.problem.zero_gathers.gather_pieces`), times the layer copies ``p`` stands for.  Use ``j``
running strategy ``b_j`` yields a gradient ``Partial`` on the axes ``P_j(b_j)``.  The step pays::

    Z(a, b_1 .. b_k) = sum over axes x not in  P_1(b_1) ∩ .. ∩ P_k(b_k)  of g[a, x]

-- a gather on every replicated axis that some use does not reduce.  Written for the solver:

- **no use**: nothing reduces; ``sum_x g[a, x]`` joins ``p``'s node cost;
- **one use** (every weight of a transformer layer, norms included): ``Z`` is pairwise, an edge
  ``p → consumer`` with ``M[a, b] = sum_{x not in P(b)} g[a, x]`` (summed with the parameter's own edge);
- **several uses** (a tied embedding read by the embedding and the head): an auxiliary node whose state is a
  set ``T`` of axes, among the subsets of the axes some use can reduce; ``p → node``:
  ``sum_{x not in T} g[a, x]``; ``node → use j``: 0 when ``T ⊆ P_j(b_j)``, ``inf`` otherwise.  The feasible
  ``T`` are the subsets of the intersection, costs fall as ``T`` grows, so the optimum takes the intersection
  itself and pays ``Z`` exactly (as the fan-out nodes' sets form, :mod:`autoshard.search.fanout`).

Exact for any number of uses; with ``k`` mesh axes of size > 1 a node has at most ``2^k`` states.  Without
training or ``shard_optimizer`` there are no terms.

Example::

    terms = zero_terms(uses, infos, template, strategies, mult, cluster, opts, offset=len(names))
    edges += terms.edges(index)          # and terms.add_to(node_costs, index)
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from autoshard.cluster import Cluster
from autoshard.problem.context import plain_cluster
from autoshard.problem.costs import CostOptions
from autoshard.problem.graph import NodeInfo
from autoshard.problem.zero_gathers import gather_pieces, param_uses, partial_axes, trainable
from autoshard.search import Edge
from autoshard.strategies import OpStrategy

__all__ = ["ReducedNode", "ZeroTerms", "axis_seconds", "zero_terms"]


@dataclass(frozen=True, slots=True, eq=False)
class ReducedNode:
    """The auxiliary node of a parameter with several uses: its state is a set of reduced axes."""

    param: str  # the parameter's variable node
    uses: tuple[tuple[str, int], ...]  # (consumer variable, input position)
    states: tuple[frozenset[int], ...]  # every subset of ``axes``, the empty set first
    producer: np.ndarray  # [S_param, K]: the gathers on the axes a state does not reduce
    consumers: tuple[np.ndarray, ...]  # per use [S_consumer, K]: 0 where it reduces the state's axes
    reduces: tuple[np.ndarray, ...]  # per use, per strategy: bit mask of the axes it reduces

    def state(self, chosen: Mapping[str, int]) -> int:
        """The state the optimum takes for a choice of the variables: the axes every use reduces."""
        common = ~0
        for (consumer, _), masks in zip(self.uses, self.reduces, strict=True):
            common &= int(masks[chosen[consumer]])
        return self.states.index(frozenset(a for a in _axes(self.states) if common >> a & 1))


def _axes(states: Sequence[frozenset[int]]) -> frozenset[int]:
    return frozenset().union(*states)


@dataclass(frozen=True, slots=True)
class ZeroTerms:
    """The solver terms of every parameter's ZeRO-1 gathers (module docstring); auxiliary nodes ``offset …``."""

    node_terms: tuple[tuple[str, np.ndarray], ...]  # (parameter variable, [S] seconds) of unused parameters
    pairs: tuple[tuple[str, str, np.ndarray], ...]  # (parameter, consumer, [S_p, S_c]) of one-use parameters
    nodes: tuple[ReducedNode, ...]
    offset: int

    def add_to(self, node_costs: list[np.ndarray], index: Mapping[str, int]) -> None:
        for name, seconds in self.node_terms:
            node_costs[index[name]] = node_costs[index[name]] + seconds

    def edges(self, index: Mapping[str, int]) -> list[Edge]:
        out = [Edge(index[p], index[c], matrix) for p, c, matrix in self.pairs]
        for k, node in enumerate(self.nodes):
            out.append(Edge(index[node.param], self.offset + k, node.producer))
            out += [
                Edge(index[c], self.offset + k, m)
                for (c, _), m in zip(node.uses, node.consumers, strict=True)
            ]
        return out

    def names(self) -> list[str]:
        return [f"ZeRO-1 gathers of {node.param}" for node in self.nodes]

    def labels(self) -> list[tuple[str, ...]]:
        return [
            tuple("reduced on axes " + (", ".join(map(str, sorted(s))) or "none") for s in node.states)
            for node in self.nodes
        ]

    def complete(self, chosen: Mapping[str, int]) -> list[int]:
        """The state of every auxiliary node for a choice of the variables (name -> strategy index)."""
        return [node.state(chosen) for node in self.nodes]


def axis_seconds(
    info: NodeInfo, strategies: Sequence[OpStrategy], copies: int, cluster: Cluster
) -> np.ndarray:
    """``g[a, x]`` (module docstring): ``[S, mesh ndim]`` seconds of ZeRO-1's gather on each axis."""
    meta = info.outputs[0]
    assert meta is not None
    mesh = tuple(cluster.mesh_shape)
    out = np.zeros((len(strategies), len(mesh)))
    for a, strat in enumerate(strategies):
        for axis, piece in gather_pieces(meta.nbytes, strat.outputs[0], mesh):
            out[a, axis] = cluster.collective_time("all_gather", piece, axis=axis) * copies
    return out


def _masks(strategies: Sequence[OpStrategy], pos: int) -> np.ndarray:
    """Per consumer strategy, the bit mask of the axes its gradient of input ``pos`` is Partial on."""
    return np.array(
        [sum(1 << a for a in partial_axes(s.input_grads[pos])) for s in strategies], dtype=np.int64
    )


def _unreduced(masks: np.ndarray, ndim: int) -> np.ndarray:
    """``[S, ndim]`` 1.0 where a strategy's gradient is not Partial on the axis."""
    return np.array([[0.0 if int(m) >> x & 1 else 1.0 for x in range(ndim)] for m in masks]).reshape(-1, ndim)


def zero_terms(
    uses: Iterable,
    infos: Mapping[str, NodeInfo],
    template: Mapping[str, str],
    strategies: Mapping[str, tuple[OpStrategy, ...]],
    mult: Mapping[str, int],
    cluster: Cluster,
    opts: CostOptions,
    offset: int,
) -> ZeroTerms:
    """The terms of every trainable parameter variable (module docstring)."""
    if not (opts.training and opts.shard_optimizer):
        return ZeroTerms((), (), (), offset)
    plain = plain_cluster(cluster)
    ndim = len(plain.mesh_shape)
    by_param = param_uses(uses, template, infos)
    node_terms: list[tuple[str, np.ndarray]] = []
    pairs: list[tuple[str, str, np.ndarray]] = []
    nodes: list[ReducedNode] = []
    for name in strategies:
        if not trainable(infos[name]):
            continue
        g = axis_seconds(infos[name], strategies[name], mult.get(name, 1), plain)
        if not g.any():
            continue
        found = by_param.get(name, [])
        if not found:
            node_terms.append((name, g.sum(axis=1)))
            continue
        masks = [_masks(strategies[c], pos) for c, pos in found]
        if len(found) == 1:
            pairs.append((name, found[0][0], g @ _unreduced(masks[0], ndim).T))
            continue
        axes = sorted({x for m in masks for v in np.unique(m) for x in range(ndim) if int(v) >> x & 1})
        states = tuple(frozenset(s) for r in range(len(axes) + 1) for s in itertools.combinations(axes, r))
        keep = np.array([[0.0 if x in s else 1.0 for x in range(ndim)] for s in states])
        consumers = tuple(
            np.array([[0.0 if all(int(v) >> x & 1 for x in s) else np.inf for s in states] for v in m])
            for m in masks
        )
        nodes.append(ReducedNode(name, tuple(found), states, g @ keep.T, consumers, tuple(masks)))
    return ZeroTerms(tuple(node_terms), tuple(pairs), tuple(nodes), offset)
