"""The hand-written plans people use, forced on the planner's own cost model, so they compare like for like.

A hand plan gives each mesh axis a *role*:

=========  ========================================================================================
role       what it pins on that axis
=========  ========================================================================================
``dp``     data parallel: every weight stored and used whole (R), the batch split (activations S(0))
``fsdp``   ZeRO-3 / FSDP: every matrix *stored* split on its first dim that divides and that TP does not
           split (R where none does), used whole (the planner prices the all-gather forward and the
           reduce-scatter backward), batch split
``tp``     Megatron tensor parallel: column linears (q/k/v, MLP up) use weight S(out) with the
           activation whole, row linears (attention out, MLP down) weight S(in) with the activation
           split on its last dim, embedding and LM head split over the vocabulary (R when the
           vocabulary does not divide, as Megatron without padding); the batch is not split
=========  ========================================================================================

The pins go on the *operators* (which input layout each linear/embedding runs with) and on the parameters'
storage, not only on the parameters: pinning only a weight's storage lets the planner all-gather it and run
data parallel anyway, which turns every baseline into autoshard's own plan.  Everything else -- norms,
attention, elementwise ops, the redistributions in between -- is left to the planner, so each baseline is
the *best* completion of that hand plan under the same cost model, and autoshard / hand plan <= 1.00 is a
theorem as long as both solve exactly under the same recomputation policy (the hand plan's problem is the
same problem with fewer strategies).  Both retry with full recomputation only when nothing fits without, as
:func:`autoshard.plan` does, so a hand plan that fits only with recomputation could in principle beat an
autoshard plan that fits without; the benchmark would show it as a ratio above 1.

Plans: ``data parallel`` and ``fsdp`` on any mesh; ``megatron tp`` on 1-D meshes (on a multi-node mesh pure TP
would replicate the batch across nodes); ``tp x dp`` and ``tp x fsdp`` (torchtitan's 2-D default) on 2-D meshes,
TP on the fast (intra-node, last) axis.

    python -m benchmarks.hand_plans            # one small case, as a table

Example::

    planner = CasePlanner(case.model, cluster, case.args, case.kwargs)
    plan = planner.plan(plans_for_mesh(2)["tp x dp"], FAMILIES["llama"])
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

import numpy as np

from autoshard.capture import capture
from autoshard.cluster import Cluster
from autoshard.errors import AutoshardError, InfeasibleError
from autoshard.placement import ShardingSpec
from autoshard.planner_rerank import rank_plan
from autoshard.plans import Plan
from autoshard.problem.build import BuiltProblem, build_problem
from autoshard.problem.costs import CostOptions, Recompute
from autoshard.problem.extract import extract_plan
from autoshard.problem.graph import NodeInfo
from autoshard.search import Solution, solve

__all__ = ["FAMILIES", "CasePlanner", "Family", "HandPlanError", "Role", "hand_masks", "plans_for_mesh"]

Role = Literal["dp", "fsdp", "tp"]

#: Ops whose weight operand a hand plan pins.
_WEIGHT_OPS = frozenset({"linear", "addmm", "mm", "matmul", "embedding"})


class HandPlanError(AutoshardError):
    """A hand plan that cannot be expressed on this model and mesh (a dim that does not divide)."""


@dataclass(frozen=True, slots=True)
class Family:
    """Where a model family keeps its Megatron-relevant weights.

    Attributes:
        column: module globs of the column-split linears (output features split).
        row: module globs of the row-split linears (input features split).
        vocab: parameter names split over the vocabulary (dim 0) on the TP axis: embedding, LM head.
        out_dim: the weight dim of the output features in a column/row module: 0 for ``nn.Linear``
            (``[out, in]``), 1 for Hugging Face GPT-2's ``Conv1D`` (``[in, out]``, run as ``addmm``).
    """

    column: tuple[str, ...]
    row: tuple[str, ...]
    vocab: tuple[str, ...]
    out_dim: int


FAMILIES: dict[str, Family] = {
    "gpt2": Family(
        ("*.attn.c_attn", "*.mlp.c_fc"), ("*.attn.c_proj", "*.mlp.c_proj"), ("transformer.wte.weight",), 1
    ),
    "llama": Family(
        ("*.q_proj", "*.k_proj", "*.v_proj", "*.gate_proj", "*.up_proj"),
        ("*.o_proj", "*.down_proj"),
        ("model.embed_tokens.weight", "lm_head.weight"),
        0,
    ),
}


def plans_for_mesh(ndim: int) -> dict[str, tuple[Role, ...]]:
    """The hand plans that apply to a mesh of ``ndim`` axes, with the role of every axis."""
    plans: dict[str, tuple[Role, ...]] = {
        "data parallel": cast(tuple[Role, ...], ("dp",) * ndim),
        "fsdp": cast(tuple[Role, ...], ("fsdp",) * ndim),
    }
    if ndim == 1:
        plans["megatron tp"] = ("tp",)
    if ndim == 2:  # TP on the fast (intra-node) axis
        plans["tp x dp"] = ("dp", "tp")
        plans["tp x fsdp"] = ("fsdp", "tp")
    return plans


# -- masks: which strategies a hand plan allows ---------------------------------------------------------------
def _spec(parts: Sequence[str]) -> ShardingSpec:
    return ShardingSpec.parse("(" + ", ".join(parts) + ")" if len(parts) > 1 else parts[0])


def _shape(info: NodeInfo) -> tuple[int, ...]:
    meta = info.outputs[0]
    return tuple(meta.shape) if meta is not None else ()


def _matches(globs: Sequence[str], name: str) -> bool:
    return any(fnmatch.fnmatchcase(name, g) for g in globs)


def _kind_of(info: NodeInfo, weight: NodeInfo, family: Family) -> str:
    """``column`` | ``row`` | ``vocab`` | ``other``: the Megatron role of the op ``info`` using ``weight``."""
    if weight.fqn in family.vocab:
        return "vocab"
    if _matches(family.column, info.module):
        return "column"
    if _matches(family.row, info.module):
        return "row"
    return "other"


def _stored(
    kind: str, shape: tuple[int, ...], roles: Sequence[Role], mesh: Sequence[int], family: Family
) -> list[str]:
    """Per axis, how a weight is stored."""
    used = list(_computed_weight(kind, shape, roles, mesh, family))
    if len(shape) < 2:
        return used
    # FSDP axes split the first dim TP leaves whole.  (FSDP2 on top of TP splits TP's local shard on dim 0,
    # a strided shard that placements cannot express; splitting another dim moves the same bytes, whereas a
    # nested (S(0), S(0)) would make gathering the FSDP axis cost an extra all-to-all on the TP axis.)
    fsdp = [a for a, r in enumerate(roles) if r == "fsdp"]
    ways = math.prod(mesh[a] for a in fsdp)
    for dim in range(len(shape)):
        if fsdp and f"S({dim})" not in used and shape[dim] % ways == 0:
            for a in fsdp:
                used[a] = f"S({dim})"
            break
    return used


def _computed_weight(
    kind: str, shape: tuple[int, ...], roles: Sequence[Role], mesh: Sequence[int], family: Family
) -> list[str]:
    """Per axis, the layout a weight has when its op runs."""
    out = []
    for a, role in enumerate(roles):
        if role != "tp" or len(shape) < 2:
            out.append("R")
        elif kind == "vocab":
            out.append("S(0)" if shape[0] % mesh[a] == 0 else "R")
        elif kind in ("column", "row"):
            dim = family.out_dim if kind == "column" else 1 - family.out_dim
            if shape[dim] % mesh[a]:
                raise HandPlanError(f"{kind} weight of shape {shape} does not divide by TP degree {mesh[a]}")
            out.append(f"S({dim})")
        else:
            out.append("R")
    return out


def _computed_activation(kind: str, ndim: int, roles: Sequence[Role]) -> list[str] | None:
    """Per axis, the layout of the activation operand (None: leave it to the planner)."""
    if kind == "other":
        return None
    out = []
    for role in roles:
        if role in ("dp", "fsdp"):
            out.append("S(0)")
        elif kind == "row":
            out.append(f"S({ndim - 1})")
        else:  # column, vocab (embedding ids or LM-head input): whole on the TP axis
            out.append("R")
    return out


def hand_masks(
    built: BuiltProblem, roles: Sequence[Role], family: Family, input_names: Sequence[str] = ("input_ids",)
) -> dict[str, np.ndarray]:
    """Allowed-strategy masks (by variable node) that force the hand plan with axis ``roles``."""
    mesh = built.cluster.mesh_shape
    if len(roles) != len(mesh):
        raise ValueError(f"hand plan roles {roles} do not match the mesh {mesh}")
    infos = built.infos
    masks: dict[str, np.ndarray] = {}

    def pin(node: str, spec: ShardingSpec, operand: int | None, what: str) -> None:
        """Allow only strategies whose output (``operand`` None) or input ``operand`` has layout ``spec``."""
        options = built.strategies[node]
        mask = np.array([(s.outputs[0] if operand is None else s.inputs[operand]) == spec for s in options])
        if not mask.any():
            raise HandPlanError(
                f"{infos[node].fqn or infos[node].module or node}: no strategy has {what} {spec}"
            )
        masks[node] = masks[node] & mask if node in masks else mask

    for name in built.variables:
        info = infos[name]
        if info.kind == "user_input" and info.name in input_names:
            pin(name, _spec(["S(0)" if r != "tp" else "R" for r in roles]), None, "input layout")
        if info.kind != "op" or info.op not in _WEIGHT_OPS:
            continue
        weights = [k for k, src in enumerate(info.inputs) if infos[src].kind == "parameter"]
        acts = [k for k, src in enumerate(info.inputs) if infos[src].kind != "parameter"]
        shapes = {k: _shape(infos[info.inputs[k]]) for k in weights + acts}
        matrices = [k for k in weights if len(shapes[k]) >= 2]
        if not matrices:
            continue
        w = matrices[0]
        kind = _kind_of(info, infos[info.inputs[w]], family)
        pin(info.inputs[w], _spec(_stored(kind, shapes[w], roles, mesh, family)), None, "storage")
        pin(name, _spec(_computed_weight(kind, shapes[w], roles, mesh, family)), w, "weight layout")
        x = max(acts, key=lambda k: len(shapes[k]), default=None)
        act = None if x is None else _computed_activation(kind, len(shapes[x]), roles)
        if x is not None and act is not None:
            pin(name, _spec(act), x, "activation layout")
    # masks live on solver variables: map any template-shared node to its variable
    return {built.template[n]: m for n, m in masks.items()}


# -- planning with masks ---------------------------------------------------------------------------------------
class CasePlanner:
    """One model on one cluster: captured once, its problem built once per recompute policy, solved per plan.

    :meth:`plan` with ``roles=None`` is autoshard's own unconstrained plan, computed the way
    :func:`autoshard.plan` does it (recomputation only when nothing fits without); with roles, the hand plan.
    """

    def __init__(
        self,
        model: Any,
        cluster: Cluster,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any] | None = None,
        *,
        memory_limit: float | None = None,
    ) -> None:
        start = time.perf_counter()
        self.captured = capture(model, args, dict(kwargs or {}))
        self.capture_s = time.perf_counter() - start
        self.cluster = cluster
        self.model_name = type(model).__name__
        self.limit = float(cluster.device_memory) if memory_limit is None else float(memory_limit)
        self._built: dict[Recompute, BuiltProblem] = {}

    def built(self, policy: Recompute) -> BuiltProblem:
        if policy not in self._built:
            limit = None if self.limit == float("inf") else self.limit
            self._built[policy] = build_problem(
                self.captured, self.cluster, CostOptions(recompute=policy), memory_limit=limit
            )
        return self._built[policy]

    def plan(
        self,
        roles: Sequence[Role] | None,
        family: Family | None = None,
        *,
        recompute: Literal["auto", "none", "full"] = "auto",
        time_limit: float = 60.0,
    ) -> Plan:
        """The best plan (under ``roles`` when given); InfeasibleError when none fits, HandPlanError when the
        hand plan cannot be expressed."""
        policies = [Recompute.NONE, Recompute.FULL] if recompute == "auto" else [Recompute(recompute)]
        error: InfeasibleError | None = None
        for policy in policies:
            built = self.built(policy)
            problem = built.problem
            if roles is not None:
                assert family is not None, "a hand plan needs its model family"
                masks = hand_masks(built, roles, family)
                allowed = tuple(masks.get(v) for v in built.variables) + (None,) * (
                    problem.num_nodes - len(built.variables)
                )  # fan-out, gather nodes
                problem = dataclasses.replace(problem, allowed=allowed)
            try:
                solution = solve(problem, time_limit=time_limit)
            except InfeasibleError as e:
                error = e
                continue
            notes = ("full recomputation",) if policy is Recompute.FULL else ()

            def read(built: BuiltProblem, solution: Solution, notes: tuple[str, ...] = notes) -> Plan:
                return extract_plan(
                    built,
                    solution,
                    model=self.model_name,
                    block_prefix=self.captured.blocks.prefix if self.captured.blocks else None,
                    output_order=_output_order(self.captured),
                    timings={},
                    notes=notes,
                    memory_limit=None if self.limit == float("inf") else self.limit,
                )

            pinned = dataclasses.replace(built, problem=problem)
            found = read(pinned, solution)
            # autoshard's own plan is ranked by the reported step as autoshard.plan ranks it; a hand plan is
            # the linear optimum under its masks (the baseline a user who pins it gets)
            return (
                found
                if roles is not None
                else rank_plan(found, pinned, solution, read, time_limit=time_limit)
            )
        assert error is not None
        raise error


def _output_order(captured: Any) -> tuple[str, ...]:
    out = next(n for n in captured.graph_module.graph.nodes if n.op == "output")
    return tuple(n.name for n in out.all_input_nodes)


def _main() -> None:
    import autoshard
    from autoshard import zoo

    case = zoo.build("gpt2", batch=8, seq=1024)
    planner = CasePlanner(case.model, autoshard.load_cluster("a100x8"), case.args, case.kwargs)
    best = planner.plan(None)
    print(f"gpt2 on 8 x A100: autoshard {best.predicted_step_time * 1e3:.2f} ms")
    for name, roles in plans_for_mesh(1).items():
        try:
            hand = planner.plan(roles, FAMILIES["gpt2"])
        except (HandPlanError, InfeasibleError) as e:
            print(f"  {name:14s} {type(e).__name__}: {str(e).splitlines()[0][:80]}")
            continue
        ratio = best.predicted_step_time / hand.predicted_step_time
        print(f"  {name:14s} {hand.predicted_step_time * 1e3:8.2f} ms  autoshard / plan = {ratio:.3f}")


if __name__ == "__main__":
    _main()
