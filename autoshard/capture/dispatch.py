"""Fuse a routed-experts block (route, sort, expert MLP, weight, unsort, sum) into one node, so that expert
parallelism can move tokens to their experts by all-to-all.

transformers (5.x, ``grouped_mm_experts_forward``) runs the routed experts of Mixtral, Qwen3-MoE and
DeepSeek-V3 as::

    perm = sort(top_k_index.flatten())                       # (T*k,) token-expert pairs sorted by expert
    offs = cumsum(histc(sorted ids, E))                      # rows per expert, cumulated
    y = expert_mlp(hidden[perm // k], gate_up, down, offs)   # capture.experts fused the two grouped matmuls
    out = (y * top_k_weights.flatten()[perm, None])[inverse(perm)].view(T, k, H).sum(1)

Per op, the sort ranks every token of the batch, so a token split of ``hidden`` must be gathered before it
(Megatron's all-gather dispatcher).  As one node, :func:`routed_experts` keeps the tokens where they are and
lets its rule (``autoshard.strategies.rules.dispatch``) offer the all-to-all dispatcher besides: every device
sorts its own tokens' ``k`` copies by expert, sends each row to the device holding its expert, runs its
experts, and sends the rows back (:func:`autoshard.codegen.dispatch.all_to_all_routed_experts`).

:func:`fuse_routed_experts` replaces the nodes of one experts module (``meta["nn_module_stack"]``) when they
are exactly the form above around one :func:`~autoshard.capture.experts.expert_mlp` node: the op names of
the region are checked against that form, and anything else (biases, sentinel masks, a post-expert norm)
leaves the region as it is.  The weights keep their transposes outside the node, so its operands are
``(hidden, gate_up, down, top_k_index, top_k_weights, act, use_aten)`` with the expert MLP's weight layout.

Reads ``meta["val"]`` and ``meta["nn_module_stack"]``; the new node takes the region output's meta.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import torch
from torch import fx

from autoshard.capture.experts import expert_mlp

__all__ = ["combine_rows", "fuse_routed_experts", "route_rows", "routed_experts"]

# The ops of transformers' grouped_mm experts forward besides the fused expert MLP (and the weight transposes).
_FORM = Counter(
    {"reshape": 2, "sort": 1, "getitem": 2, "floor_divide": 1, "index": 3, "histc": 1, "cumsum": 1,
     "expert_mlp": 1, "unsqueeze": 1, "mul": 1, "empty_like": 1, "arange": 1, "index_put_": 1, "view": 1,
     "sum": 1}
)  # fmt: skip
_OPTIONAL = frozenset({"to", "_to_copy"})  # the float cast histc needs on CPU, and the final dtype cast


def route_rows(index: torch.Tensor, n_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(perm, offs)``: the token-expert pairs of ``index`` (T, k) in expert order, and the cumulative rows
    per expert (transformers' histc on float ids, so CPU and the capture agree)."""
    sorted_ids, perm = torch.sort(index.reshape(-1))
    counts = torch.histc(sorted_ids.float(), bins=n_experts, min=0, max=n_experts - 1)
    return perm, torch.cumsum(counts, 0, dtype=torch.int32)


def combine_rows(y: torch.Tensor, weights: torch.Tensor, perm: torch.Tensor, k: int) -> torch.Tensor:
    """Weight the rows ``y`` (in ``perm`` order) by their routing weight and sum each token's ``k`` rows."""
    y = y * weights.reshape(-1)[perm].unsqueeze(-1)
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(perm.numel(), device=perm.device)
    return y[inverse].view(-1, k, y.shape[-1]).sum(1)


class _RoutedExperts:
    """The routed experts of one MoE layer on whole tensors (what the fused node computes on one device).

    A callable object so that the node's target prints the same in every process (as plan files name it).
    """

    __name__ = "routed_experts"
    __qualname__ = "routed_experts"

    def __call__(
        self,
        hidden: torch.Tensor,
        gate_up: torch.Tensor,
        down: torch.Tensor,
        index: torch.Tensor,
        weights: torch.Tensor,
        act: Callable[[torch.Tensor], torch.Tensor],
        use_aten: bool,
    ) -> torch.Tensor:
        k = index.shape[-1]
        perm, offs = route_rows(index, gate_up.shape[0])
        y = expert_mlp(hidden[perm // k], gate_up, down, offs, act, use_aten)
        return combine_rows(y, weights, perm, k).to(hidden.dtype)

    def __repr__(self) -> str:
        return "autoshard.capture.dispatch.routed_experts"


routed_experts = _RoutedExperts()


def _module_of(node: fx.Node) -> str | None:
    stack = node.meta.get("nn_module_stack")
    return str(list(stack.values())[-1][0]) if stack else None


def _name(node: fx.Node) -> str:
    target = node.target
    if target is expert_mlp:
        return "expert_mlp"
    if isinstance(target, torch._ops.OpOverload):
        return str(target.overloadpacket.__name__)
    return getattr(target, "__name__", str(target))


def _val(node: object) -> torch.Tensor | None:
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    return val if isinstance(val, torch.Tensor) else None


def _region(fused: fx.Node) -> tuple[list[fx.Node], fx.Node, tuple[fx.Node, fx.Node, fx.Node]] | None:
    """``(region nodes, its one output, (hidden, top_k_index, top_k_weights))`` around one expert MLP."""
    module = _module_of(fused)
    weights_in = {a for a in fused.args[1:3] if isinstance(a, fx.Node)}
    if module is None or len(weights_in) != 2 or any(len(w.users) != 1 for w in weights_in):
        return None
    region = [
        n
        for n in fused.graph.nodes
        if n.op == "call_function" and _module_of(n) == module and n not in weights_in
    ]
    names = Counter(_name(n) for n in region)
    if Counter({k: v for k, v in names.items() if k not in _OPTIONAL}) != _FORM:
        return None
    inside = set(region)
    leaving = [n for n in region if any(u not in inside for u in n.users)]
    sources = {a for n in region for a in n.all_input_nodes if a not in inside and a not in weights_in}
    x = fused.args[0]
    hidden = x.args[0] if isinstance(x, fx.Node) and _name(x) == "index" else None
    ints = [s for s in sources if (v := _val(s)) is not None and not v.is_floating_point()]
    floats = [s for s in sources if (v := _val(s)) is not None and v.is_floating_point() and s is not hidden]
    if len(leaving) != 1 or len(sources) != 3 or hidden not in sources or len(ints) != 1 or len(floats) != 1:
        return None
    h, i, w, out = _val(hidden), _val(ints[0]), _val(floats[0]), _val(leaving[0])
    if h is None or i is None or w is None or out is None or h.dim() != 2 or i.dim() != 2:
        return None
    if tuple(w.shape) != tuple(i.shape) or tuple(out.shape) != tuple(h.shape) or i.shape[0] != h.shape[0]:
        return None
    assert isinstance(hidden, fx.Node)
    return region, leaving[0], (hidden, ints[0], floats[0])


def fuse_routed_experts(gm: fx.GraphModule, *, recompile: bool = True) -> fx.GraphModule:
    """Replace each routed-experts region around a fused expert MLP by one :func:`routed_experts` node."""
    graph = gm.graph
    for fused in [n for n in graph.nodes if n.target is expert_mlp]:
        found = _region(fused)
        if found is None:
            continue
        region, out, (hidden, index, weights) = found
        _, gate_up, down, _, act, use_aten = fused.args
        with graph.inserting_before(out):
            node = graph.call_function(routed_experts, (hidden, gate_up, down, index, weights, act, use_aten))
        node.meta = dict(out.meta)
        out.replace_all_uses_with(node)
        for dead in reversed(region):
            graph.erase_node(dead)
    graph.lint()
    if recompile:
        gm.recompile()
    return gm
