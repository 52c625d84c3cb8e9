"""A torch-free view of a captured graph: one small record per node, read once from ``node.meta``.

Input: a :class:`~autoshard.capture.Captured` (an fx graph whose nodes carry the capture stage's meta keys).
Output: ``tuple[NodeInfo, ...]`` in topological order, covering placeholders and call_function nodes (the fx
``output`` node becomes :attr:`NodeInfo.is_output` flags on the nodes it returns).

The planner's cost builder, block collapse and plan report only ever look at these records, so the fx graph
is walked exactly once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx as fx

from autoshard.capture import meta as cmeta
from autoshard.problem.autocast import autocast_dtype

__all__ = ["META_AFTER_BLOCK", "NodeInfo", "describe"]

META_AFTER_BLOCK = "autoshard_after_block"
"""``True`` on a pipeline stage's input placeholder whose value the whole model makes in a repeated block (the
previous stage's last layer): moves from it into the stage's first layer are that layer's, as between blocks
(:attr:`NodeInfo.after_block`; set by :mod:`autoshard.runtime.stage_plan`)."""

# Ops whose output aliases or re-labels their input: they allocate nothing that backward must keep.
_VIEW_OPS = frozenset(
    {
        "view", "_unsafe_view", "reshape", "permute", "transpose", "t", "expand", "slice", "select",
        "squeeze", "unsqueeze", "flatten", "unflatten", "alias", "detach", "contiguous", "getitem",
        "split", "split_with_sizes", "chunk", "unbind", "narrow", "as_strided", "view_as", "lift_fresh_copy",
        "_to_copy", "to", "type_as", "clone", "expand_as",
    }
)  # fmt: skip
# Ops whose backward costs about twice the forward (a gradient for each operand).
_MATMUL_OPS = frozenset(
    {"mm", "bmm", "addmm", "matmul", "linear", "baddbmm", "einsum", "scaled_dot_product_attention",
     "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
     "_scaled_dot_product_flash_attention_for_cpu", "convolution", "conv2d", "conv1d", "_grouped_mm",
     "grouped_mm_fallback", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "expert_mlp",
     "routed_experts"}
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """What the planner needs to know about one graph node."""

    name: str
    op: str  # short op name ("linear", "add") or "placeholder"
    target: str  # full target ("aten.linear.default") for messages
    kind: str  # "parameter" | "buffer" | "constant" | "user_input" | "op"
    fqn: str  # parameter/buffer fully qualified name, or "" for other nodes
    module: str  # user-module path, "" at the root
    inputs: tuple[str, ...]  # names of input nodes, aligned with fx's node.all_input_nodes
    input_outputs: tuple[int, ...]  # which output of each input node is consumed (getitem index or 0)
    outputs: tuple[cmeta.TensorMeta | None, ...]
    flops: int
    requires_grad: bool
    block: tuple[int, int] | None  # (block index, position in block) for repeated-layer nodes
    is_output: bool  # returned by the graph
    causal_mask: bool = False  # attention whose explicit mask is proven causal (capture/causal.py)
    grad_users: int = 0  # consumers needing its gradient (autograd sums theirs: problem/elementwise.py)
    kv_repeats: int = 1  # attention reading grouped-query K/V copies: heads per K/V head (capture/gqa.py)
    autocast_dtype: str = ""  # its output's dtype under the amp recipe (problem/autocast.py)
    after_block: bool = False  # a stage input the previous layer (a block) made in the whole model

    @property
    def is_view(self) -> bool:
        return self.op in _VIEW_OPS

    @property
    def is_matmul_like(self) -> bool:
        return self.op in _MATMUL_OPS

    @property
    def out_bytes(self) -> int:
        return sum(t.nbytes for t in self.outputs if t is not None)


def _short_op(node: fx.Node) -> tuple[str, str]:
    if node.op == "placeholder":
        return "placeholder", "placeholder"
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return target.overloadpacket.__name__, str(target)
    name = getattr(target, "__name__", str(target))
    return name, f"{getattr(target, '__module__', '')}.{name}".lstrip(".")


def _outputs(node: fx.Node) -> tuple[cmeta.TensorMeta | None, ...]:
    value = node.meta.get(cmeta.META_TENSOR)
    if value is None:
        return (None,)
    if isinstance(value, tuple):
        return value
    return (value,)


def _consumed_output(src: fx.Node, dst: fx.Node) -> int:
    """Index of ``src``'s outputs that ``dst`` reads: getitem selects one; everything else reads output 0."""
    if dst.op == "call_function" and getattr(dst.target, "__name__", "") == "getitem" and dst.args[0] is src:
        index = dst.args[1]
        return index if isinstance(index, int) else 0
    return 0


def _layer(path: str) -> str | None:
    """The repeated layer a module path lies in: its first numbered component (``model.layers.3`` of
    ``model.layers.3.mlp``, ``layer2`` of ``layer2.up``), None outside every numbered module."""
    parts = path.split(".") if path else []
    index = next((i for i, p in enumerate(parts) if p[-1:].isdigit()), None)
    return None if index is None else ".".join(parts[: index + 1])


def _grad_users(node: fx.Node) -> int:
    """Consumers in ``node``'s own layer that need its gradient.  A layer's output read by the next layer
    is left out, so every copy of a repeated block counts alike and a collapsed stack prices what the full
    one does (with or without the capture's block marks)."""
    here = _layer(node.meta.get(cmeta.META_MODULE, "") or "")
    return sum(
        1
        for u in node.users
        if u.meta.get(cmeta.META_REQUIRES_GRAD, False)
        and _layer(u.meta.get(cmeta.META_MODULE, "") or "") == here
    )


def describe(gm: fx.GraphModule) -> tuple[NodeInfo, ...]:
    """Read every placeholder and call_function node of ``gm`` into a :class:`NodeInfo`."""
    returned: set[str] = set()
    for node in gm.graph.nodes:
        if node.op == "output":
            returned.update(n.name for n in node.all_input_nodes)
    infos: list[NodeInfo] = []
    amp: dict[str, str] = {}  # each node's dtype under autocast (problem/autocast.py)
    model = next((t.dtype for n in gm.graph.nodes if n.meta.get(cmeta.META_KIND) == "parameter"
                  for t in _outputs(n) if t is not None and t.itemsize == 2), "bfloat16")  # fmt: skip
    for node in gm.graph.nodes:
        if node.op not in ("placeholder", "call_function"):
            continue
        op, target = _short_op(node)
        ins = tuple(node.all_input_nodes)
        first = _outputs(node)[0]
        kind = node.meta.get(cmeta.META_KIND, "op") if node.op == "placeholder" else "op"
        amp[node.name] = autocast_dtype(
            op, kind, first.dtype if first is not None else None, [amp.get(n.name, "") for n in ins], model
        )
        infos.append(
            NodeInfo(
                name=node.name,
                op=op,
                target=target,
                kind=kind,
                fqn=node.meta.get(cmeta.META_FQN, "") or "",
                module=node.meta.get(cmeta.META_MODULE, "") or "",
                inputs=tuple(n.name for n in ins),
                input_outputs=tuple(_consumed_output(n, node) for n in ins),
                outputs=_outputs(node),
                flops=int(node.meta.get(cmeta.META_FLOPS, 0) or 0),
                requires_grad=bool(node.meta.get(cmeta.META_REQUIRES_GRAD, False)),
                block=node.meta.get(cmeta.META_BLOCK),
                is_output=node.name in returned,
                causal_mask=bool(node.meta.get(cmeta.META_CAUSAL_MASK, False)),
                grad_users=_grad_users(node),
                kv_repeats=int(node.meta.get(cmeta.META_KV_REPEATS, 1)),
                autocast_dtype=amp[node.name],
                after_block=bool(node.meta.get(META_AFTER_BLOCK, False)),
            )
        )
    return tuple(infos)
