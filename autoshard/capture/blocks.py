"""Repeated-block detection: find the model's stack of identical layers and label their nodes.

Input: the user's ``nn.Module`` (to find the stack) and an annotated graph (``META_MODULE``, ``META_FQN``,
``META_OP``, ``META_TENSOR`` set). Output: ``META_BLOCK = (block_index, position)`` on every node of a block,
and a :class:`BlockInfo`.

**The stack.** In every container whose children are indexed ``0, 1, ..`` -- ``nn.ModuleList``,
``nn.Sequential``, an ``nn.ModuleDict`` keyed ``"0"``, ``"1"``, .. (torchtitan) -- the longest run of
structurally identical children (same class, same parameter names, shapes and dtypes) that ends at the last
child is a candidate, if it has at least two; the one holding the most parameters wins (``model.layers`` in
LLaMA, ``transformer.h`` in GPT-2, ``bert.encoder.layer``).  In a heterogeneous stack the run starts after
the leading layers that differ (DeepSeek-V3: three dense layers, then 58 MoE layers: ``first = 3``); the
leading layers are ordinary ops before the first block.  An ``nn.Sequential`` whose blocks hold fewer than two
weight matrices (``Linear -> ReLU``) is a plain layer chain, not a stack of layers: one decision per block
would forbid the column/row alternation between consecutive layers, so it is planned at full depth.

**Membership.** Block ``i`` is child ``first + i``.  It owns (a) parameter/buffer nodes whose FQN starts with
``f"{prefix}.{first + i}."`` and (b) every op node from the first to the last op whose module path is
``f"{prefix}.{first + i}"`` or lies under it,
in graph order — the *span* rule.  Measured on HF LLaMA, GPT-2, BERT and Mixtral (transformers 5), every op
of a layer already carries the layer's path (residual adds sit in the layer's own ``forward`` and carry
``model.layers.i``); the span rule also claims ops a block runs through a module outside it (a shared
rotary embedding called per layer), which belong to the block because they run once per block.
Membership fails (:class:`BlockMismatch`) when spans of two blocks overlap, or when ops belonging to no
block sit between two blocks (work done by the parent's loop between layers).

**Position.** A block's nodes, sorted in graph (topological) order, are numbered 0, 1, ...; export lists
parameter placeholders first in ``named_parameters`` order, so positions line up across blocks.

**Equality of blocks.** Two blocks are equal when their *signatures* are: per node, in position order, the
op name (``META_OP``), the result's ``TensorMeta``, and every argument with node references replaced by
``("local", position)`` for a node of the same block (its own parameters included) and ``("outside",)``
for any other node; constant arguments stay as they are.  A parameter/buffer node contributes its name
relative to the block (``"mlp.up_proj.weight"``) and its ``TensorMeta``.

**Extension.** A graph with ``k + 1`` blocks *extends* one with ``k`` blocks when the ops before the first
block (prefix) and after the last (suffix) have the same op names and ``TensorMeta`` in the same order,
every block of both graphs has the same signature, and the node counts differ by exactly one block.

Example::

    found = find_repeated_blocks(model)       # BlockCandidate(prefix="model.layers", num_blocks=32, ...)
    with cut_blocks(model, found, 2):
        ...                                    # model.model.layers holds layers 0 and 1 only
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from torch import fx, nn

from autoshard.capture.meta import (
    META_BLOCK,
    META_FLOPS,
    META_FQN,
    META_KIND,
    META_MODULE,
    META_OP,
    META_TENSOR,
    BlockInfo,
    TensorMeta,
)

__all__ = [
    "BlockCandidate",
    "BlockMismatch",
    "annotate_blocks",
    "block_signature",
    "check_extension",
    "cut_blocks",
    "find_repeated_blocks",
    "signature_under",
]

OP_KINDS = ("call_function", "call_method", "call_module")


class BlockMismatch(Exception):
    """The graph does not decompose into identical blocks; capture falls back and records why in ``notes``."""


@dataclass(frozen=True, slots=True)
class BlockCandidate:
    """A run of structurally identical children of a container: children ``first .. first + num_blocks - 1``
    of the ``ModuleList`` / ``Sequential`` / integer-keyed ``ModuleDict`` at ``prefix`` (the run ends at the
    container's last child)."""

    prefix: str
    num_blocks: int
    block_type: str
    param_numel: int
    first: int = 0


def _structure(module: nn.Module) -> tuple[Any, ...]:
    params = tuple((name, tuple(p.shape), p.dtype) for name, p in module.named_parameters())
    return (type(module), params)


def _indexed_children(module: nn.Module) -> list[nn.Module] | None:
    """The children of a container indexed ``0, 1, ..`` in order (ModuleList, Sequential, ModuleDict with
    keys ``"0"``, ``"1"``, ..), else ``None``."""
    if isinstance(module, nn.ModuleList | nn.Sequential):
        return list(module)
    if isinstance(module, nn.ModuleDict):
        keys = list(module.keys())
        if keys == [str(i) for i in range(len(keys))]:
            return list(module.values())
    return None


def _last_run(children: Sequence[nn.Module]) -> int:
    """Index of the first child of the longest run of identical children that ends at the last child."""
    last = _structure(children[-1])
    first = len(children) - 1
    while first > 0 and _structure(children[first - 1]) == last:
        first -= 1
    return first


def _matrices(module: nn.Module) -> int:
    """How many weight matrices (parameters of 2 dims or more) a block holds."""
    return sum(1 for p in module.parameters() if p.dim() >= 2)


def find_repeated_blocks(model: nn.Module) -> BlockCandidate | None:
    """The run of identical children (at least two, ending at the container's last child) holding the most
    parameters, or ``None``.  A heterogeneous stack -- dense layers, then MoE layers (DeepSeek-V3) -- yields
    its final run (``first`` = the number of leading layers that differ)."""
    best: BlockCandidate | None = None
    for prefix, module in model.named_modules():
        children = _indexed_children(module) if prefix else None
        if not children or len(children) < 2:
            continue
        first = _last_run(children)
        run = children[first:]
        if len(run) < 2 or not _structure(run[0])[1]:
            continue
        if isinstance(module, nn.Sequential) and _matrices(run[0]) < 2:
            continue  # a plain layer chain: planned at full depth, so consecutive layers may alternate
        numel = sum(p.numel() for c in run for p in c.parameters())
        if best is None or numel > best.param_numel:
            best = BlockCandidate(prefix, len(run), type(run[0]).__name__, numel, first)
    return best


def _subset(container: nn.Module, keep: int) -> nn.Module:
    """The same kind of container holding its first ``keep`` children under their own names."""
    if isinstance(container, nn.ModuleDict):
        return nn.ModuleDict(dict(list(container.items())[:keep]))
    children = _indexed_children(container)
    assert children is not None, f"{type(container).__name__} is not an indexed container"
    if isinstance(container, nn.Sequential):
        return nn.Sequential(*children[:keep])
    return nn.ModuleList(children[:keep])


@contextmanager
def cut_blocks(model: nn.Module, candidate: BlockCandidate, k: int) -> Iterator[None]:
    """Temporarily keep the children before the run and its first ``k`` blocks; the original is restored on
    exit."""
    parent_name, _, attr = candidate.prefix.rpartition(".")
    parent = model.get_submodule(parent_name)
    original = getattr(parent, attr)
    children = _indexed_children(original)
    assert children is not None and len(children) == candidate.first + candidate.num_blocks
    setattr(parent, attr, _subset(original, candidate.first + k))
    try:
        yield
    finally:
        setattr(parent, attr, original)


def _block_of_path(path: str, prefix: str, heads: dict[str, int]) -> int | None:
    """Block index of a module or parameter path (``heads``: child name -> block), or ``None``."""
    if prefix:
        if not path.startswith(prefix + "."):
            return None
        path = path[len(prefix) + 1 :]
    return heads.get(path.split(".", 1)[0])


def _partition(
    gm: fx.GraphModule, prefix: str, count: int, first: int = 0, names: Sequence[str] | None = None
) -> list[list[fx.Node]]:
    """Nodes of each of ``count`` blocks in graph order (see "Membership" in the module docstring): children
    ``first ..`` of ``prefix``, or the children called ``names`` (``layer0``, ``layer1``, ..)."""
    names = names if names is not None else [str(first + b) for b in range(count)]
    heads = {name: b for b, name in enumerate(names)}
    where = [f"{prefix}.{name}" if prefix else name for name in names]
    nodes = list(gm.graph.nodes)
    members: list[list[fx.Node]] = [[] for _ in range(count)]
    spans: list[list[int]] = [[] for _ in range(count)]
    for i, node in enumerate(nodes):
        if META_FQN in node.meta:
            block = _block_of_path(node.meta[META_FQN], prefix, heads)
            if block is not None:
                members[block].append(node)
        elif node.op in OP_KINDS:
            block = _block_of_path(node.meta[META_MODULE], prefix, heads)
            if block is not None:
                spans[block].append(i)
    if any(not s for s in spans):
        raise BlockMismatch(f"some of the {count} blocks under {prefix} have no ops in the graph")
    bounds = [(s[0], s[-1]) for s in spans]
    for b, ((_, last), (first_next, _)) in enumerate(itertools.pairwise(bounds)):
        if first_next <= last:
            raise BlockMismatch(f"ops of {where[b]} and {where[b + 1]} interleave in the graph")
        between = [n.name for n in nodes[last + 1 : first_next] if n.op in OP_KINDS]
        if between:
            raise BlockMismatch(f"ops {between[:5]} between {where[b]} and {where[b + 1]} belong to no block")
    for b, (first, last) in enumerate(bounds):
        members[b].extend(n for n in nodes[first : last + 1] if n.op in OP_KINDS)
    order = {n: i for i, n in enumerate(nodes)}
    return [sorted(m, key=order.__getitem__) for m in members]


def _arg_signature(arg: Any, local: dict[fx.Node, int]) -> Any:
    if isinstance(arg, fx.Node):
        return ("local", local[arg]) if arg in local else ("outside",)
    if isinstance(arg, (list, tuple)):
        return tuple(_arg_signature(a, local) for a in arg)
    if isinstance(arg, dict):
        return tuple((k, _arg_signature(v, local)) for k, v in sorted(arg.items()))
    return arg if isinstance(arg, (int, float, bool, str, type(None))) else str(arg)


def block_signature(block: Sequence[fx.Node], prefix: str, index: int) -> tuple[Any, ...]:
    """The block's signature (see "Equality of blocks" in the module docstring); ``index`` is the child's
    index in its container."""
    return signature_under(block, f"{prefix}.{index}.")


def signature_under(block: Sequence[fx.Node], own: str) -> tuple[Any, ...]:
    """The signature of a block whose parameters are named under ``own`` (``"model.layers.3."``)."""
    local = {n: p for p, n in enumerate(block)}
    sig: list[Any] = []
    for node in block:
        if META_FQN in node.meta:
            sig.append(("param", node.meta[META_FQN].removeprefix(own), str(node.meta[META_TENSOR])))
            continue
        args = _arg_signature((node.args, node.kwargs), local)
        sig.append((node.meta[META_OP], str(node.meta[META_TENSOR]), args))
    return tuple(sig)


def annotate_blocks(gm: fx.GraphModule, candidate: BlockCandidate, count: int) -> BlockInfo:
    """Write ``META_BLOCK`` on the nodes of ``count`` captured blocks; check they are identical."""
    first = candidate.first
    blocks = _partition(gm, candidate.prefix, count, first)
    reference = block_signature(blocks[0], candidate.prefix, first)
    for i, block in enumerate(blocks[1:], start=1):
        if block_signature(block, candidate.prefix, first + i) != reference:
            raise BlockMismatch(
                f"{candidate.prefix}.{first + i} differs from {candidate.prefix}.{first} in the graph"
            )
    for i, block in enumerate(blocks):
        for position, node in enumerate(block):
            node.meta[META_BLOCK] = (i, position)
    own = f"{candidate.prefix}.{first}."
    params = {
        n.meta[META_FQN].removeprefix(own): n.meta[META_TENSOR]
        for n in blocks[0]
        if n.op in ("placeholder", "get_attr") and n.meta.get(META_KIND) == "parameter"
    }
    return BlockInfo(
        prefix=candidate.prefix,
        num_blocks=candidate.num_blocks,
        captured_blocks=count,
        nodes_per_block=len(blocks[0]),
        block_type=candidate.block_type,
        block_params=params,
        block_flops=sum(n.meta[META_FLOPS] for n in blocks[0]),
        first=first,
    )


def _outside_signature(
    gm: fx.GraphModule, dropped: frozenset[str] = frozenset()
) -> tuple[list[Any], list[Any], int]:
    """(prefix ops, suffix ops, node count) of a block-annotated graph, ops as (name, TensorMeta), leaving out
    the nodes named in ``dropped``."""
    before: list[Any] = []
    after: list[Any] = []
    seen_block = False
    for node in gm.graph.nodes:
        if node.name in dropped:
            continue
        if META_BLOCK in node.meta:
            seen_block = seen_block or node.op in OP_KINDS  # block parameters sit before every op
        elif node.op in OP_KINDS or node.op == "output":
            (after if seen_block else before).append((node.meta[META_OP], _meta_str(node.meta[META_TENSOR])))
    return before, after, len(gm.graph.nodes) - len(dropped)


def _meta_str(meta: TensorMeta | tuple[TensorMeta | None, ...] | None) -> str:
    return str(meta) if not isinstance(meta, tuple) else str(tuple(str(m) for m in meta))


def check_extension(
    small: fx.GraphModule,
    big: fx.GraphModule,
    info_small: BlockInfo,
    info_big: BlockInfo,
    dropped: frozenset[str] = frozenset(),
) -> None:
    """Check that ``big`` (k + 1 blocks) equals ``small`` (k blocks) plus exactly one block.  ``dropped``:
    nodes of ``small`` that ``big`` was exported without (blocks of further runs cut to shorten the check
    export, :func:`autoshard.capture.runs.cut_runs`)."""
    if info_big.captured_blocks != info_small.captured_blocks + 1:
        raise BlockMismatch("check_extension needs graphs of k and k + 1 blocks")
    if info_small.nodes_per_block != info_big.nodes_per_block:
        raise BlockMismatch(
            f"a block has {info_small.nodes_per_block} nodes with {info_small.captured_blocks} blocks "
            f"but {info_big.nodes_per_block} with {info_big.captured_blocks}"
        )
    sig_small = block_signature(_block_nodes(small, 0), info_small.prefix, info_small.first)
    sig_big = block_signature(_block_nodes(big, 0), info_big.prefix, info_big.first)
    if sig_small != sig_big:
        raise BlockMismatch("block 0 differs between the k- and (k+1)-block graphs")
    before_s, after_s, count_s = _outside_signature(small, dropped)
    before_b, after_b, count_b = _outside_signature(big)
    if before_s != before_b:
        raise BlockMismatch("the ops before the first block differ between the k- and (k+1)-block graphs")
    if after_s != after_b:
        raise BlockMismatch("the ops after the last block differ between the k- and (k+1)-block graphs")
    if count_b - count_s != info_small.nodes_per_block:
        raise BlockMismatch(
            f"the (k+1)-block graph has {count_b - count_s} more nodes, "
            f"not one block's {info_small.nodes_per_block}"
        )


def _block_nodes(gm: fx.GraphModule, index: int) -> list[fx.Node]:
    nodes = [n for n in gm.graph.nodes if n.meta.get(META_BLOCK, (None,))[0] == index]
    return sorted(nodes, key=lambda n: n.meta[META_BLOCK][1])
