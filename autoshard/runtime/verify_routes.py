"""Routing decisions pinned to the single-device run's, so that ``verify`` compares the sharded computation and
not how a near-tie between two experts' router scores breaks.

Why: a mixture-of-experts router picks each token's experts by ``topk`` of its scores.  A split plan computes
those scores with the same arithmetic in another order (a router logit summed from pieces, a bfloat16 product
rounded elsewhere), so where the k-th and the (k+1)-th scores are nearly tied the distributed run can choose
another expert than the single-device one.  That token's output and its experts' gradients then move by
O(|value|), not by rounding, and no tolerance covers it; the plan is not wrong.  Every ``topk`` in the graph is
such a discrete choice, so verify pins all of them.

How:

1. :func:`record_routes` runs the reference forward under a ``TorchDispatchMode`` that keeps every
   ``aten.topk`` call's indices and, per row, its *margin* (the k-th minus the (k+1)-th score: how near the
   choice was to a tie).  The calls are matched, in order and by shape, to the ``aten.topk`` nodes of the
   captured graph; each node's indices are placed as the plan places that output (:class:`ReferenceRoute`).
   Calls that do not match the graph's nodes (a top-k the capture pruned as unused) pin nothing, and the
   report says so.
2. On each rank, :func:`pin_routes` rewrites those nodes of the emitted module (and of its recomputed blocks)
   to :class:`PinnedTopk`: the rank's piece of the reference's indices
   (:func:`~autoshard.codegen.shard.local_piece`), and the values gathered from the rank's own scores at them
   -- what ``topk`` returns for those indices, so gradients reach the router exactly as ``topk``'s backward
   sends them.  It still ranks its own scores to count the rows whose chosen set of experts differs
   (global row numbers, so a row computed on several ranks counts once).
3. :func:`route_note` sums it up for the verdict (:class:`RoutePins`, printed by ``str(report)``).

A pipelined check (:mod:`autoshard.runtime.verify_pipeline`) runs its reference microbatch by microbatch, as
the stages do (gradients accumulated), and :func:`record_staged_routes` keeps every microbatch's choices of
every stage's ``topk`` nodes (matched in stage order, then graph order, by shape): a route then holds one
choice per microbatch (:attr:`ReferenceRoute.microbatches`), and a stage's :class:`PinnedTopk` hands out the
piece of the microbatch its stage is running (``microbatch``: the chunk id torch's schedule passes the stage).

Example::

    out, routes, _ = record_routes(captured, strategies, lambda: model(ids))  # parent: the reference forward
    outs, staged, _ = record_staged_routes(stages, [lambda: model(ids[:2]), lambda: model(ids[2:])])  # pipelined
    flipped = pin_routes(module, routes, mesh, coord, zigzag)     # each rank, before running its module
    note = route_note(routes, [flipped_rank0, flipped_rank1])     # "routing: 2 of 128 token routes ..."
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from torch import fx, nn
from torch.utils._python_dispatch import TorchDispatchMode

from autoshard.capture import Captured
from autoshard.codegen.shard import local_piece
from autoshard.errors import AutoshardError
from autoshard.placement import ShardingSpec
from autoshard.strategies import OpStrategy
from autoshard.strategies.local import bind

__all__ = [
    "PinnedTopk",
    "ReferenceRoute",
    "RoutePins",
    "pin_routes",
    "record_routes",
    "record_staged_routes",
    "route_note",
]

aten = torch.ops.aten
T = TypeVar("T")


@dataclass(frozen=True)
class ReferenceRoute:
    """One ``topk`` node of the graph and what the single-device forward chose there."""

    node: str  # the captured (and emitted) node's name
    module: str  # the module that called it, e.g. "model.layers.1.mlp.gate"
    spec: str  # how the plan places the indices output, e.g. "(R, S(0))"
    dim: int  # the ranked dim
    indices: torch.Tensor  # the reference's chosen indices, global shape
    margins: torch.Tensor  # per row (the indices' shape without ``dim``): k-th minus (k+1)-th score
    microbatches: int = 0  # a pipelined check's: indices and margins stacked on a leading microbatch dim


@dataclass(frozen=True, slots=True)
class RoutePins:
    """What pinning did in one verify run: how many choices were pinned and how many would have differed."""

    layers: int  # topk nodes pinned
    routes: int  # rows (one token's choice of experts in one layer)
    flipped: int  # rows whose distributed choice differed from the reference's
    margin: float  # the largest reference margin among the flipped rows (0 when none flipped)
    where: tuple[str, ...] = ()  # "module xN" for every top-k layer with flipped rows
    unpinned: str = ""  # why the choices could not be pinned (then ``flipped`` is unknown, 0)

    def __str__(self) -> str:
        where = f"{self.routes} token routes in {self.layers} top-k layer{'' if self.layers == 1 else 's'}"
        if self.unpinned:
            return (
                f"routing: top-k choices not pinned to the reference's ({where}): {self.unpinned}; a near-tie the "
                "split run breaks the other way shows as a MISMATCH in that layer's experts"
            )
        if not self.flipped:
            return f"routing: the reference's top-k choices pinned on every rank ({where}); none would have flipped"
        tie = (
            "exact ties in the reference's scores"
            if self.margin == 0
            else f"reference score margins up to {self.margin:.1e}"
        )
        routes = f"{self.flipped} route{'' if self.flipped == 1 else 's'}"
        return (
            f"routing: {self.flipped} of {where} would have flipped ({', '.join(self.where)}: the split run's "
            f"scores break a near-tie the other way, {tie}); {routes} pinned to the reference on every rank, "
            "so the experts' sharded arithmetic is what is compared"
        )


class _RecordTopk(TorchDispatchMode):
    """Keeps ``(indices, margins, dim)`` of every ``aten.topk`` call, in call order."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[torch.Tensor, torch.Tensor, int]] = []

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        if func is aten.topk.default:
            b = bind(func, args, kwargs or {})
            x, k, dim = b["self"], int(b["k"]), int(b["dim"]) % max(b["self"].dim(), 1)
            margins = _margins(x.detach(), k, dim, bool(b["largest"]))
            self.calls.append((out[1].detach().clone(), margins, dim))
        return out


def _margins(x: torch.Tensor, k: int, dim: int, largest: bool) -> torch.Tensor:
    """Per row, how far apart the k-th and the (k+1)-th scores are (inf where there is no (k+1)-th)."""
    if x.shape[dim] <= k:
        return torch.full(x.select(dim, 0).shape, torch.inf)
    ranked = x.float().sort(dim, descending=largest).values
    return (ranked.select(dim, k - 1) - ranked.select(dim, k)).abs()


def _unpinned(calls: Sequence[tuple[torch.Tensor, torch.Tensor, int]], why: str) -> RoutePins | None:
    rows = sum(m.numel() for _, m, _ in calls)
    return RoutePins(len(calls), rows, 0, 0.0, unpinned=why) if calls else None


def record_routes(
    captured: Captured, strategies: Mapping[str, OpStrategy], forward: Callable[[], T]
) -> tuple[T, tuple[ReferenceRoute, ...], RoutePins | None]:
    """``forward()``'s result, the routing choices it made (one per ``topk`` node of ``captured``, module doc)
    and None; or, when the forward's ``topk`` calls are not the graph's (one pruned as unused), no choices and
    the note saying they are not pinned."""
    recorder = _RecordTopk()
    with recorder:
        result = forward()
    nodes = _topk_nodes(captured)
    why = _unmatched(nodes, recorder.calls)
    if why:
        return result, (), _unpinned(recorder.calls, why)
    routes = [_route(n, strategies, *call) for n, call in zip(nodes, recorder.calls, strict=True)]
    return result, tuple(routes), None


def record_staged_routes(
    stages: Sequence[tuple[Captured, Mapping[str, OpStrategy]]], forwards: Sequence[Callable[[], T]]
) -> tuple[list[T], tuple[tuple[ReferenceRoute, ...], ...], RoutePins | None]:
    """A pipelined check's reference: every microbatch's ``forwards[k]()`` result, and per stage (``stages``:
    each stage's capture and strategies, in stage order) the routes of its ``topk`` nodes, each holding the
    choices of every microbatch (module doc); or, when a microbatch's ``topk`` calls are not the stages'
    nodes in order, no routes and the note saying they are not pinned."""
    results, calls = [], []
    for forward in forwards:
        recorder = _RecordTopk()
        with recorder:
            results.append(forward())
        calls.append(recorder.calls)
    nodes = [(index, node) for index, (captured, _) in enumerate(stages) for node in _topk_nodes(captured)]
    for ran in calls:
        why = _unmatched([node for _, node in nodes], ran)
        if why:
            return results, (), _unpinned([c for ran in calls for c in ran], f"{why} (one microbatch)")
    staged: list[list[ReferenceRoute]] = [[] for _ in stages]
    for i, (index, node) in enumerate(nodes):
        indices = torch.stack([ran[i][0] for ran in calls])
        margins = torch.stack([ran[i][1] for ran in calls])
        route = _route(node, stages[index][1], indices, margins, calls[0][i][2])
        staged[index].append(dataclasses.replace(route, microbatches=len(calls)))
    return results, tuple(tuple(routes) for routes in staged), None


def _topk_nodes(captured: Captured) -> list[fx.Node]:
    return [n for n in captured.graph_module.graph.nodes if n.target is aten.topk.default]


def _unmatched(nodes: Sequence[fx.Node], calls: Sequence[tuple[torch.Tensor, torch.Tensor, int]]) -> str:
    """Why the forward's ``topk`` calls are not the graph's ``topk`` nodes (in order, by shape), or ""."""
    shapes = [tuple(n.meta["val"][1].shape) for n in nodes]
    ran = [tuple(i.shape) for i, _, _ in calls]
    if shapes == ran:
        return ""
    return (
        f"the model ran top-k of shapes {ran}, its captured graph holds {shapes}, so they cannot be matched"
    )


def _route(
    node: fx.Node,
    strategies: Mapping[str, OpStrategy],
    indices: torch.Tensor,
    margins: torch.Tensor,
    dim: int,
) -> ReferenceRoute:
    strategy = strategies.get(node.name)
    spec = strategy.outputs[1] if strategy is not None and len(strategy.outputs) > 1 else None
    if spec is None or spec.partial_axes():
        raise AutoshardError(f"topk node {node.name} has no placed indices output in the plan ({strategy})")
    stack = node.meta.get("nn_module_stack") or {}
    module = str(list(stack.values())[-1][0]) if stack else ""
    return ReferenceRoute(node.name, module, str(spec), dim, indices, margins)


class PinnedTopk:
    """``topk`` of this rank's scores that returns the reference's choice (its piece of it) instead of its own,
    and notes the global rows where its own choice differs (``flipped``).  A pipelined stage's holds one piece
    (and its rows) per microbatch and hands out the one ``microbatch()`` names."""

    __name__ = "pinned_topk"
    __qualname__ = "pinned_topk"

    def __init__(
        self,
        indices: torch.Tensor | Sequence[torch.Tensor],
        rows: torch.Tensor | Sequence[torch.Tensor],
        dim: int,
        flipped: set[int],
        microbatch: Callable[[], int] | None = None,
    ) -> None:
        self.pieces = (indices,) if isinstance(indices, torch.Tensor) else tuple(indices)
        self.row_pieces = (rows,) if isinstance(rows, torch.Tensor) else tuple(rows)
        self.dim, self.flipped, self.microbatch = dim, flipped, microbatch

    def __call__(
        self, x: torch.Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor]:
        which = self.microbatch() if self.microbatch is not None else 0
        index, rows = self.pieces[which].to(x.device), self.row_pieces[which]
        want = (*x.shape[: self.dim], k, *x.shape[self.dim + 1 :])
        if tuple(index.shape) != want:
            raise AutoshardError(
                f"pinned top-k: this rank's piece of the reference choices is {tuple(index.shape)}, its scores "
                f"give {want}: the plan's placement of the routing indices does not match the emitted layout"
            )
        with torch.no_grad():
            own = aten.topk.default(x, k, dim, largest, sorted)[1]
            differs = (own.sort(self.dim).values != index.sort(self.dim).values).any(self.dim)
            self.flipped.update(int(r) for r in rows[differs.cpu()].tolist())
        return x.gather(self.dim, index), index

    def __repr__(self) -> str:
        return "autoshard.runtime.verify_routes.pinned_topk"


def _local_rows(
    route: ReferenceRoute,
    spec: ShardingSpec,
    mesh: Sequence[int],
    coord: Sequence[int],
    zigzag_axis: int | None,
) -> list[torch.Tensor]:
    """The global row numbers (row-major over the indices' shape without the ranked dim) this rank holds, one
    tensor per microbatch of a pipelined check's route (one in all otherwise)."""
    rows = torch.arange(route.margins.numel()).reshape(route.margins.shape)
    if not route.microbatches:
        whole = rows.unsqueeze(route.dim).expand(route.indices.shape)
        return [local_piece(whole, spec, mesh, coord, zigzag_axis).select(route.dim, 0)]
    pieces = []
    for k in range(route.microbatches):
        whole = rows[k].unsqueeze(route.dim).expand(route.indices[k].shape)
        pieces.append(local_piece(whole, spec, mesh, coord, zigzag_axis).select(route.dim, 0))
    return pieces


def pin_routes(
    module: nn.Module,
    routes: Sequence[ReferenceRoute],
    mesh: Sequence[int],
    coord: Sequence[int],
    zigzag_axis: int | None = None,
    microbatch: Callable[[], int] | None = None,
) -> dict[str, set[int]]:
    """Rewrite every ``topk`` node named in ``routes``, in ``module`` and its submodules (recomputed blocks), to
    a :class:`PinnedTopk` holding this rank's piece (of every microbatch, for a pipelined stage: ``microbatch``
    says which one runs); returns node name -> the set of flipped global rows it fills as the module runs.
    Raises :class:`AutoshardError` when a route's node is not in the module."""
    flipped: dict[str, set[int]] = {r.node: set() for r in routes}
    by_name = {r.node: r for r in routes}
    found: set[str] = set()
    for sub in module.modules():
        if not isinstance(sub, fx.GraphModule):
            continue
        changed = False
        for node in sub.graph.nodes:
            route = by_name.get(node.name)
            if route is None or node.op != "call_function" or node.target is not aten.topk.default:
                continue
            spec = ShardingSpec.parse(route.spec)
            whole = list(route.indices) if route.microbatches else [route.indices]
            pieces = [local_piece(w, spec, mesh, coord, zigzag_axis) for w in whole]
            rows = _local_rows(route, spec, mesh, coord, zigzag_axis)
            node.target = PinnedTopk(pieces, rows, route.dim, flipped[route.node], microbatch)
            found.add(route.node)
            changed = True
        if changed:
            sub.recompile()
    missing = sorted(set(by_name) - found)
    if missing:
        raise AutoshardError(
            f"the emitted module has no topk node {', '.join(missing)} to pin routing choices on"
        )
    return flipped


def route_note(routes: Sequence[ReferenceRoute], ranks: Sequence[Mapping[str, set[int]]]) -> RoutePins | None:
    """The ranks' flipped rows, united per node (a row several ranks hold counts once); None without routes."""
    if not routes:
        return None
    flipped, margin, where = 0, 0.0, []
    for route in routes:
        rows = sorted(set().union(*(r.get(route.node, set()) for r in ranks)))
        flipped += len(rows)
        if rows:
            margin = max(margin, float(route.margins.reshape(-1)[rows].max()))
            where.append(f"{route.module or route.node} x{len(rows)}")
    total = sum(r.margins.numel() for r in routes)
    return RoutePins(len(routes), total, flipped, margin, tuple(where))
