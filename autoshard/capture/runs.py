"""Further runs of identical blocks: every repeated structure besides the primary stack, collapsed by the search.

Input: the user's ``nn.Module``, the primary stack :func:`~autoshard.capture.blocks.find_repeated_blocks`
chose (or ``None``), and a captured graph in which every block of these further runs is present.
Output: ``META_RUN = (run, block, position)`` on every node of such a run, and one :class:`RunInfo` per run.

The primary stack (``BlockInfo``, ``META_BLOCK``) is what everything downstream reads: it may be cut to two
blocks at capture, its nodes are named ``block:<position>`` in a plan, the pipeline splits it into stages.
A further run is only a promise to the search that its blocks are identical, so that block ``i``'s node at
position ``p`` may share block 0's solver variable (:mod:`autoshard.problem.runs`); its nodes stay in the
graph and the plan lists every one of them with the shared decision, so a plan looks exactly as if nothing
had been collapsed.  Encoder-decoder models give one run per tower (T5: ``decoder.block`` primary,
``encoder.block`` a further run, each from block 1 since block 0 holds the relative position bias).

**Runs.** Children of one module that are (a) indexed ``0, 1, ..`` in a ``ModuleList`` / ``Sequential`` /
integer-keyed ``ModuleDict`` (the final run of identical children, as for the primary), or (b) attributes
named ``<stem><i>`` for consecutive ``i`` (``self.layer0``, ``self.layer1``, ..: the longest run of
identical ones ending at the highest index).  A run has at least two blocks, each holding at least two
weight matrices: single layers (a ResNet block's ``conv1`` / ``conv2``, a chain of ``Linear``) keep one
decision each, so that consecutive ones may alternate column / row (the primary's rule for
``Sequential``).  Runs are taken largest first (by parameters) and may not nest in or contain the
primary's blocks or an earlier run.

**Membership and equality** follow :mod:`autoshard.capture.blocks` (parameters by FQN, ops by the span rule,
signatures with block-relative names).  A run whose blocks do not decompose or differ is dropped with a note:
it is then planned at full depth, never mis-collapsed.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

from torch import fx, nn

from autoshard.capture.blocks import (
    BlockCandidate,
    BlockMismatch,
    _indexed_children,
    _last_run,
    _matrices,
    _partition,
    _structure,
    cut_blocks,
    signature_under,
)
from autoshard.capture.meta import META_BLOCK, META_RUN, RunInfo

__all__ = ["annotate_runs", "cut_runs", "find_runs"]

_NUMBERED = re.compile(r"^(.*?)(\d+)$")


@dataclass(frozen=True, slots=True)
class _Run:
    """A candidate run: children ``names`` (in block order) of the module at ``parent``."""

    parent: str
    names: tuple[str, ...]
    block_type: str
    param_numel: int

    def path(self, block: int) -> str:
        return f"{self.parent}.{self.names[block]}" if self.parent else self.names[block]


def _attribute_runs(module: nn.Module) -> list[list[tuple[str, nn.Module]]]:
    """Runs of children named ``<stem><i>`` with consecutive ``i``, one per stem (the final identical run)."""
    by_stem: dict[str, dict[int, tuple[str, nn.Module]]] = {}
    for name, child in module.named_children():
        match = _NUMBERED.match(name)
        if match and match.group(1) and not name.isdigit():
            by_stem.setdefault(match.group(1), {})[int(match.group(2))] = (name, child)
    runs = []
    for numbered in by_stem.values():
        top = max(numbered)
        low = top
        while low - 1 in numbered:
            low -= 1
        consecutive = [numbered[i] for i in range(low, top + 1)]
        first = _last_run([c for _, c in consecutive])
        runs.append(consecutive[first:])
    return runs


def _candidates(model: nn.Module) -> list[_Run]:
    out: list[_Run] = []
    for prefix, module in model.named_modules():
        children = _indexed_children(module) if prefix else None
        groups = _attribute_runs(module)
        if children and len(children) >= 2:
            names = [str(i) for i in range(len(children))]
            first = _last_run(children)
            groups.append(list(zip(names[first:], children[first:], strict=True)))
        for run in groups:
            if len(run) < 2 or not _structure(run[0][1])[1]:
                continue
            if _matrices(run[0][1]) < 2:
                continue  # single layers (conv1, conv2; a chain of Linear): one decision each, so they alternate
            numel = sum(p.numel() for _, c in run for p in c.parameters())
            out.append(_Run(prefix, tuple(n for n, _ in run), type(run[0][1]).__name__, numel))
    return out


def _nested(a: str, b: str) -> bool:
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


def find_runs(model: nn.Module, primary: BlockCandidate | None) -> list[_Run]:
    """Further runs of identical blocks, largest first, none nesting in the primary or in each other."""
    taken: list[str] = []
    if primary is not None:
        taken += [f"{primary.prefix}.{primary.first + i}" for i in range(primary.num_blocks)]
    runs: list[_Run] = []
    for run in sorted(_candidates(model), key=lambda r: -r.param_numel):
        paths = [run.path(i) for i in range(len(run.names))]
        if any(_nested(p, t) for p in paths for t in taken):
            continue
        runs.append(run)
        taken += paths
    return runs


def annotate_runs(gm: fx.GraphModule, runs: Sequence[_Run], notes: list[str]) -> tuple[RunInfo, ...]:
    """Write ``META_RUN`` on the nodes of every run whose blocks check out; note the others."""
    infos: list[RunInfo] = []
    for run in runs:
        try:
            blocks = _partition(gm, run.parent, len(run.names), names=run.names)
            claimed = [n for b in blocks for n in b if META_RUN in n.meta or META_BLOCK in n.meta]
            if claimed:
                raise BlockMismatch(f"{claimed[0].name} already belongs to another repeated run")
            reference = signature_under(blocks[0], run.path(0) + ".")
            for i, block in enumerate(blocks[1:], start=1):
                if signature_under(block, run.path(i) + ".") != reference:
                    raise BlockMismatch(f"{run.path(i)} differs from {run.path(0)} in the graph")
        except BlockMismatch as e:
            notes.append(f"repeated blocks {run.path(0)}.. not collapsed: {e}")
            continue
        index = len(infos)
        for i, block in enumerate(blocks):
            for position, node in enumerate(block):
                node.meta[META_RUN] = (index, i, position)
        infos.append(
            RunInfo(tuple(run.path(i) for i in range(len(run.names))), run.block_type, len(blocks[0]))
        )
        notes.append(f"{len(blocks)} identical blocks {run.path(0)}..{run.names[-1]} share one decision each")
    return tuple(infos)


@contextmanager
def cut_runs(
    model: nn.Module, runs: Sequence[_Run], found: Sequence[RunInfo], keep: int
) -> Iterator[frozenset[str]]:
    """Temporarily keep the first ``keep`` blocks of every annotated run held in an indexed container (the
    3-block check export of the primary stack needs no full-depth encoder); yields the module paths of the
    blocks left out.  Attribute-held blocks are called by name, so they are never cut."""
    left_out: set[str] = set()
    with ExitStack() as stack:
        for info in found:
            run = next(r for r in runs if r.path(0) == info.blocks[0])
            if len(run.names) <= keep or not all(n.isdigit() for n in run.names):
                continue
            first = int(run.names[0])
            stack.enter_context(
                cut_blocks(model, BlockCandidate(run.parent, len(run.names), "", 0, first), keep)
            )
            left_out.update(info.blocks[keep:])
        yield frozenset(left_out)


def nodes_under(gm: fx.GraphModule, found: Sequence[RunInfo], blocks: frozenset[str]) -> frozenset[str]:
    """Names of the nodes of a run's ``blocks`` (module paths) in an annotated graph."""
    return frozenset(
        n.name
        for n in gm.graph.nodes
        if META_RUN in n.meta and found[n.meta[META_RUN][0]].blocks[n.meta[META_RUN][1]] in blocks
    )
