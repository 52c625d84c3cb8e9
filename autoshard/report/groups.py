"""A structural view of a saved plan: module groups, repeated layers collapsed, ops classified.

Input: a :class:`~autoshard.plans.Plan` (nothing else: ``autoshard show`` has only the JSON).
Output: a :class:`PlanView` — every op row of ``plan.nodes`` with its parsed strategy label, the *group* it
belongs to (``model.layers.0–31`` for the one decision per layer position the plan keeps, otherwise the
op's module such as ``lm_head``), the *part* of the model it is in (attention, MLP, experts, norm, embedding,
head) and its *kind* (matmul, attention, embedding, ...); the parameters by node name and FQN; and the
weight each matmul-like op reads.

Groups and parts come from module paths and op targets, the only structure a plan records.  Names that the
heuristics do not know land in the ``other`` part; nothing is dropped.

Example::

    view = PlanView.of(plan)
    [g.name for g in view.groups()]     # ['transformer.wte', 'transformer.h.0–11', 'lm_head', ...]
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Literal, NamedTuple, TypeVar

from autoshard.plans import Collective, NodePlan, Plan
from autoshard.report.labels import OpLabel, parse_label

__all__ = [
    "WEIGHT_LAYOUT",
    "Group",
    "OpKind",
    "OpRow",
    "Part",
    "PlanView",
    "WeightLayout",
    "collapse_layers",
    "layer_pattern",
    "op_name",
]

V = TypeVar("V", bound=Hashable)
Part = Literal["attention", "mlp", "experts", "norm", "embedding", "head", "other"]
OpKind = Literal["matmul", "grouped_mm", "attention", "embedding", "norm", "view", "other"]


class WeightLayout(NamedTuple):
    """Where a weighted op's operands sit and what the weight's dims mean."""

    weight: int  # operand index of the weight
    out_dim: int  # weight dim that indexes output features (split: column-parallel)
    in_dim: int  # weight dim that is contracted (split: row-parallel); the vocabulary for an embedding
    activation: int  # operand index of the activation (or the ids of an embedding)


WEIGHT_LAYOUT: dict[str, WeightLayout] = {
    "aten.linear.default": WeightLayout(1, 0, 1, 0),  # x, W[out, in], bias
    "aten.addmm.default": WeightLayout(2, 1, 0, 1),  # bias, x, W[in, out]  (GPT-2's Conv1D)
    "aten.mm.default": WeightLayout(1, 1, 0, 0),
    "aten.matmul.default": WeightLayout(1, 1, 0, 0),
    "aten._grouped_mm.default": WeightLayout(1, 2, 1, 0),  # x, W[experts, in, out], offsets
    "transformers.grouped_mm_fallback.default": WeightLayout(1, 2, 1, 0),
    # x, gate_up[experts, in, 2 x ffn], down, offsets (capture.experts)
    "autoshard.capture.experts.expert_mlp": WeightLayout(1, 2, 1, 0),
    # hidden, gate_up, down, top-k index and weights (capture.dispatch: the whole routed-experts block)
    "autoshard.capture.dispatch.routed_experts": WeightLayout(1, 2, 1, 0),
    "aten.embedding.default": WeightLayout(0, 1, 0, 1),  # W[vocab, hidden], ids
}

_VIEW_OPS = {
    "view", "reshape", "transpose", "permute", "unsqueeze", "squeeze", "expand", "slice", "select", "t",
    "contiguous", "getitem", "split", "chunk", "alias", "clone", "to", "_to_copy", "flatten", "unflatten",
}  # fmt: skip
_NORM_OPS = {"layer_norm", "native_layer_norm", "rms_norm", "_fused_rms_norm", "group_norm", "batch_norm"}
_LAYER = re.compile(r"^(?P<prefix>.+?)\.(?P<index>\d+)(?:\.(?P<rest>.*))?$")
_PART_WORDS: tuple[tuple[Part, re.Pattern[str]], ...] = (
    ("experts", re.compile(r"expert|moe")),
    ("attention", re.compile(r"attn|attention")),
    ("norm", re.compile(r"norm|^ln(_\w+)?$")),
    ("embedding", re.compile(r"embed|^wte$|^wpe$")),
    ("head", re.compile(r"lm_head|^head$|^decoder$|classifier|^score$|^cls$")),
    ("mlp", re.compile(r"mlp|ffn|feed_forward|intermediate|^output$|^fc\d*$|^c_fc$|^dense$")),
)


@dataclass(frozen=True, slots=True)
class OpRow:
    """One computing node of the plan with what the report needs to know about it."""

    node: NodePlan
    label: OpLabel
    group: str
    local: str  # module path inside its group ("" at the group's root)
    part: Part
    kind: OpKind
    weight: str | None  # FQN of the parameter it reads as its weight, when known

    @property
    def op(self) -> str:
        """``aten.linear.default`` → ``linear``."""
        return op_name(self.node.target)

    @property
    def layout(self) -> WeightLayout | None:
        return WEIGHT_LAYOUT.get(self.node.target)


@dataclass(frozen=True, slots=True)
class Group:
    """A module group: one top-level module, or a stack of repeated layers shown once."""

    name: str
    count: int  # layers it stands for (1 outside repeated stacks)
    ops: tuple[OpRow, ...]
    params: tuple[str, ...]  # FQNs as stored in the plan (layer 0 only for a stack)

    @property
    def compute(self) -> float:
        return sum(r.node.compute_seconds for r in self.ops)


@dataclass
class PlanView:
    """Plan rows sorted into groups and parts; build with :meth:`of`."""

    plan: Plan
    ops: tuple[OpRow, ...]
    param_nodes: dict[str, str]  # placeholder node name -> parameter FQN
    param_group: dict[str, str]  # parameter FQN -> group name
    block_prefix: str | None
    block_count: int
    order: tuple[str, ...]  # group names in first-use order

    def __post_init__(self) -> None:
        self._by_name = {r.node.name: r for r in self.ops}

    @classmethod
    def of(cls, plan: Plan) -> PlanView:
        prefix, count = _block_stack(plan.nodes)
        param_nodes = {
            n.name: n.module
            for n in plan.nodes
            if n.target == "placeholder" and n.module in plan.param_placements
        }
        weights = _weights_from_collectives(plan.collectives, param_nodes)
        ops, param_group, order = [], {}, []
        for n in plan.nodes:
            group, local = _group_of(n, prefix, count, n.name in param_nodes)
            if group not in order:
                order.append(group)
            if n.name in param_nodes:
                param_group[n.module] = group
                continue
            if n.target == "placeholder":
                continue
            ops.append(_row(n, group, local, weights.get(n.name), set(plan.param_placements)))
        return cls(plan, tuple(ops), param_nodes, param_group, prefix, count, tuple(order))

    def groups(self) -> list[Group]:
        """Groups in first-use order of the plan's node table."""
        out = []
        for name in self.order:
            ops = tuple(r for r in self.ops if r.group == name)
            params = tuple(f for f, g in self.param_group.items() if g == name)
            if not ops and not params:
                continue
            count = max((r.node.count for r in ops), default=1)
            out.append(Group(name, count, ops, params))
        return out

    def row(self, name: str) -> OpRow | None:
        """The op row named ``name``."""
        return self._by_name.get(name)

    def consumer(self, c: Collective) -> OpRow | None:
        """The op a collective feeds.  Edges into the second captured layer name an op the plan does not list
        (it keeps layer 0's decision); those resolve through the consumer's module, preferring a weighted op."""
        row = self._by_name.get(c.node)
        if row is not None or c.node == "output":
            return row
        module = self.layer0(c.module)
        candidates = [r for r in self.ops if r.node.module == module and r.kind != "view"]
        weighted = [r for r in candidates if r.layout is not None]
        found = weighted or candidates
        return found[0] if found else None

    def layer0(self, module: str) -> str:
        """A module path of any layer of the stack, as the plan names it (layer 0)."""
        prefix = self.block_prefix
        if not prefix or not module.startswith(prefix + "."):
            return module
        return re.sub(rf"^{re.escape(prefix)}\.\d+", f"{prefix}.0", module)

    def layer_of(self, module: str) -> str:
        """A module path with its layer index replaced by the stack's range (``layers.0–31.mlp``)."""
        if not self.block_prefix or self.block_count <= 1:
            return module
        return layer_pattern(module, self.block_prefix, self.block_count)


def op_name(target: str) -> str:
    """``aten.linear.default`` → ``linear``; ``_operator.getitem`` → ``getitem``."""
    parts = target.split(".")
    if parts[0] == "aten" and len(parts) >= 2:
        return parts[1]
    return parts[-2] if len(parts) >= 3 else parts[-1]


def layer_pattern(module: str, prefix: str, count: int) -> str:
    """``model.layers.7.mlp`` → ``model.layers.0–31.mlp`` for a 32-layer stack under ``model.layers``."""
    if not module.startswith(prefix + "."):
        return module
    return re.sub(rf"^{re.escape(prefix)}\.\d+", f"{prefix}.0–{count - 1}", module)


_INDEXED = re.compile(r"^(?P<prefix>.+?)\.(?P<index>\d+)\.(?P<rest>.+)$")


def collapse_layers(values: Mapping[str, V]) -> list[tuple[str, V]]:
    """Names with a layer index, one row per run of consecutive layers with the same value:
    ``{"h.0.w": x, "h.1.w": x, "h.2.w": y}`` → ``[("h.0–1.w", x), ("h.2.w", y)]`` (the report's notation).
    Names without an index stay as they are; rows are sorted by name."""
    runs: dict[tuple[str, str, V], list[int]] = {}
    rows: list[tuple[tuple[str, int, str], str, V]] = []
    for name, value in values.items():
        m = _INDEXED.match(name)
        if m is None:
            rows.append(((name, -1, ""), name, value))
        else:
            runs.setdefault((m["prefix"], m["rest"], value), []).append(int(m["index"]))
    for (prefix, rest, value), indices in runs.items():
        indices.sort()
        start = 0
        for i in range(1, len(indices) + 1):
            if i == len(indices) or indices[i] != indices[i - 1] + 1:
                a, b = indices[start], indices[i - 1]
                span = f"{a}–{b}" if b > a else str(a)
                rows.append(((prefix, a, rest), f"{prefix}.{span}.{rest}", value))
                start = i
    return [(name, value) for _, name, value in sorted(rows, key=lambda r: r[0])]


def _block_stack(nodes: tuple[NodePlan, ...]) -> tuple[str | None, int]:
    """The prefix of the repeated-layer stack (``model.layers``) and its depth, from the block rows."""
    prefixes: Counter[str] = Counter()
    count = 1
    for n in nodes:
        if not n.key.startswith("block:"):
            continue
        count = max(count, n.count)
        m = _LAYER.match(n.module)
        if m:
            prefixes[m.group("prefix")] += 1
    return (prefixes.most_common(1)[0][0] if prefixes else None), count


def _group_of(n: NodePlan, prefix: str | None, count: int, is_param: bool) -> tuple[str, str]:
    if n.key.startswith("block:") and prefix:
        m = _LAYER.match(n.module)
        rest = (m.group("rest") or "") if m and m.group("prefix") == prefix else n.module
        if is_param:
            rest = rest.rpartition(".")[0]
        return f"{prefix}.0–{count - 1}", rest
    if n.target == "placeholder":
        return (n.module.rpartition(".")[0] or n.module, "") if is_param else ("inputs", "")
    return n.module or "(model)", ""


def _row(n: NodePlan, group: str, local: str, weight: str | None, params: set[str]) -> OpRow:
    kind = _kind(n.target)
    if weight is None and kind in ("matmul", "grouped_mm", "embedding"):
        weight = next((f for f in (f"{n.module}.weight", n.module) if f in params), None)
    return OpRow(n, parse_label(n.strategy), group, local, _part(group, local, kind), kind, weight)


def _kind(target: str) -> OpKind:
    name = op_name(target)
    if target in WEIGHT_LAYOUT:
        if name == "embedding":
            return "embedding"
        return (
            "grouped_mm"
            if "grouped_mm" in name or target.endswith((".expert_mlp", ".routed_experts"))
            else "matmul"
        )
    if "scaled_dot_product" in name or "flash_attention" in name:
        return "attention"
    if name in _NORM_OPS:
        return "norm"
    return "view" if name in _VIEW_OPS else "other"


def _part(group: str, local: str, kind: OpKind) -> Part:
    if kind == "grouped_mm":
        return "experts"
    if kind == "embedding":
        return "embedding"
    if kind == "attention":
        return "attention"
    words = [w for w in (local or group).split(".") if w and not w.isdigit() and "–" not in w]
    for part, pattern in _PART_WORDS:
        if any(pattern.search(w) for w in words):
            return part
    return "other"


def _weights_from_collectives(
    collectives: tuple[Collective, ...], param_nodes: dict[str, str]
) -> dict[str, str]:
    """op node → parameter FQN, from forward collectives that move a parameter into an op (tied weights)."""
    found: dict[str, str] = {}
    for c in collectives:
        if c.phase == "forward" and c.tensor in param_nodes and c.node != "output":
            found.setdefault(c.node, param_nodes[c.tensor])
    return found
