"""The plan record: what autoshard decided, what it costs, and how it was proven.

A :class:`Plan` is immutable and self-contained: it names every parameter's placement per mesh axis, every
node's chosen strategy, every collective of one training step (forward and backward), the predicted step time
split into compute and communication, the memory per device, and the solver's optimality certificate.
It saves to versioned JSON (never pickle) and loads back equal.  (``plans``, not ``plan``: no shadowing.)

Example::

    plan = autoshard.plan(model, cluster, (ids,))
    plan.param_placements["fc1.weight"]      # ("S(0)",)
    plan.save("plan.json"); autoshard.load_plan("plan.json") == plan   # True
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autoshard.errors import PlanFileError
from cost_models.overlap import GradBucket, OverlapPolicy, SyncExposure

__all__ = [
    "Collective",
    "NodePlan",
    "PipelinePlan",
    "PipelineStage",
    "Plan",
    "RingTransfer",
    "SolverReport",
    "load_plan",
]

FORMAT = "autoshard-plan"
VERSION = 1


@dataclass(frozen=True, slots=True)
class Collective:
    """One collective of one training step.  Gradient synchronisation counts as ``backward``."""

    kind: str  # all_reduce | all_gather | reduce_scatter | all_to_all
    nbytes: int  # the full buffer of the group (nccl-tests convention)
    phase: str  # forward | backward
    mesh_axis: int
    node: str  # the node it serves (the consumer, or the parameter whose gradient it synchronises)
    tensor: str  # the node whose output (or its gradient) is moved
    module: str  # user-module path of the node it serves
    seconds: float
    layer: int | None = None  # repeated-layer index, when the node belongs to one
    recompute: bool = False  # a forward move backward runs again to recompute its block (phase stays forward)

    def __str__(self) -> str:
        return f"{self.phase} {self.kind}(axis={self.mesh_axis}, {_bytes(self.nbytes)}) for {self.node}"


@dataclass(frozen=True, slots=True)
class RingTransfer:
    """Context parallelism's K/V hops of one attention node and pass (:mod:`autoshard.problem.ring_hops`):
    point-to-point sends around the ring axis, overlapped with attention; what compute does not hide is in
    ``Plan.compute_time``, never in ``Plan.communication_time``."""

    phase: str  # forward | backward
    mesh_axis: int
    hops: int  # sends per device in one step, every layer and microbatch
    nbytes: int  # bytes one device sends per hop (K and V blocks; backward with their gradients)
    node: str
    module: str
    seconds: float  # the hops' transfer time per step, all copies
    itemsize: int = 0  # bytes per element a hop carries as priced (amp: bf16); 0: older files

    def __str__(self) -> str:
        return f"{self.phase} ring K/V hops(axis={self.mesh_axis}, {self.hops} x {_bytes(self.nbytes)}) for {self.node}"


@dataclass(frozen=True, slots=True)
class NodePlan:
    """The chosen strategy of one node of the captured graph (one row of the per-node table)."""

    name: str
    key: str  # stable across captures: "block:<position>" in a repeated layer, "outside:<index>" elsewhere
    target: str
    module: str
    strategy: str  # "(S(0), R), R -> S(0)"
    count: int  # how many nodes of the full model share this decision (repeated layers)
    compute_seconds: float  # forward + backward + optimizer, all copies
    memory_bytes: float  # per device, all copies
    inputs: tuple[str, ...] = ()  # operand node names, in the order of the strategy label's inputs


@dataclass(frozen=True, slots=True)
class SolverReport:
    """What was proven.  ``objective`` .. ``optimal``: the solver's *linear* step model (its optimum, bound
    and gap).  The step the plan reports is the critical path (:mod:`autoshard.problem.step`); the ranking
    step (:mod:`autoshard.planner_rerank`) fills the rest: ``step_bound`` a proven lower bound on the
    reported step of every plan in ``bound_scope`` ('' = every plan; else the restriction, or why there is
    no bound), ``step_optimal`` whether the plan's reported step is proven optimal, ``chosen`` which
    candidate was returned and ``ranked`` every candidate priced, fastest first ("name: seconds").
    Defaults (no ranking ran, e.g. pipelines): only the linear model's certificate holds."""

    method: str
    objective: float
    lower_bound: float
    gap: float
    optimal: bool
    seconds: float
    log: tuple[str, ...] = ()
    step_bound: float | None = None
    step_optimal: bool = False
    chosen: str = ""
    ranked: tuple[str, ...] = ()
    bound_scope: str = ""


@dataclass(frozen=True, slots=True)
class PipelineStage:
    """One pipeline stage: a contiguous run of the model's layers on one slice of the pipeline mesh axis.

    ``modules`` are the user-module paths the stage owns, in execution order (e.g. ``("model.embed_tokens",
    "model.layers.0", ..., "model.layers.9")``); ``layers`` is the half-open range of repeated-layer indices it
    holds (``(0, 10)``), ``None`` when it holds no repeated layer.  ``ranks`` are the global ranks of its
    device group (one intra-op sub-mesh).
    """

    index: int
    modules: tuple[str, ...]
    layers: tuple[int, int] | None
    ranks: tuple[int, ...]
    compute_seconds: float = 0.0  # forward + backward of one microbatch on this stage
    memory_bytes: float = 0.0  # peak per device of this stage under the schedule


@dataclass(frozen=True, slots=True)
class PipelinePlan:
    """Pipeline parallelism of a plan: the stages, the schedule and its predicted bubble.

    ``schedule`` names a ``torch.distributed.pipelining`` schedule: ``"gpipe"``, ``"1f1b"``,
    ``"interleaved_1f1b"``, ``"zb_v"`` or ``"interleaved_zb"``; ``virtual_stages`` is the number of model chunks
    per rank (1 except for interleaved / V schedules), so ``len(stages) == degree * virtual_stages``.
    """

    stages: tuple[PipelineStage, ...]
    schedule: str
    virtual_stages: int = 1
    bubble_fraction: float = 0.0
    mesh_axis: int = 0  # the mesh axis the stages are laid along (outermost by default)

    @property
    def degree(self) -> int:
        return len(self.stages) // max(1, self.virtual_stages)


@dataclass(frozen=True)
class Plan:
    """A sharding plan.  Treat the mappings as read-only."""

    model: str
    cluster: dict[str, Any]  # profile, nodes, mesh_shape, axis_names, devices
    mesh_shape: tuple[int, ...]
    training: bool
    param_placements: dict[str, tuple[str, ...]]
    input_placements: dict[str, tuple[str, ...]]
    output_placements: tuple[tuple[str, ...], ...]
    nodes: tuple[NodePlan, ...]
    collectives: tuple[Collective, ...]
    predicted_step_time: float
    compute_time: float
    communication_time: float  # all collectives (ZeRO-1 gathers too); pipelined: the busiest rank's wait
    memory_per_device: float
    device_memory: float
    solver: SolverReport
    timings: dict[str, float] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    memory_limit: float | None = None  # the per-device budget the plan was solved under (None: none)
    input_shapes: dict[str, tuple[tuple[int, ...], str]] = field(default_factory=dict)  # global, dtype
    # Degree per kind of parallelism the plan uses: keys among "dp", "fsdp", "tp", "sp", "cp", "ep", "pp";
    # a kind that is unused is absent (or 1).  Filled by the planner; read by the report's headline.
    degrees: dict[str, int] = field(default_factory=dict)
    microbatches: int = 1  # gradient-accumulation / pipeline microbatches per step (global / micro batch)
    pipeline: PipelinePlan | None = None
    # How to rebuild the model this plan was made for (what ``verify --plan`` maps it onto): ``{"spec": zoo
    # name or "path/to/file.py:function"}`` plus the options it was built with (``"batch"``, ``"seq"``), filled
    # by the CLI; and ``"model"``: what identifies the model (class, parameter count, digest of names and
    # shapes: :func:`autoshard.plan_model.identity`), filled by ``autoshard.plan`` (Python plans too).
    source: dict[str, Any] = field(default_factory=dict)
    # The step time of the best plan without the user's annotations / allow / forbid (the price of the pins
    # is predicted_step_time minus this); None when nothing was pinned.
    unpinned_step_time: float | None = None
    # The overlap / bucket / prefetch policy the predicted step time assumes and the runtime executes.
    overlap: OverlapPolicy = field(default_factory=OverlapPolicy)
    # Bytes per device that memory_per_device holds beyond the per-node sum, by name (runtime reserve,
    # gathered FSDP weights, largest temporary: autoshard.problem.step).
    memory_breakdown: dict[str, float] = field(default_factory=dict)
    # activation recomputation of the repeated blocks, searched by the planner: "none" | "selective" | "full"
    # (autoshard.problem.costs.Recompute); codegen wraps each block in torch.utils.checkpoint accordingly
    recompute: str = "none"
    # how many of the repeated blocks ``recompute`` applies to (the first k, as Megatron's "block" method);
    # None: every block.  The others keep all their activations.
    recompute_blocks: int | None = None
    # Op kind -> share of the step's forward FLOPs that runs replicated on every device because the op has no
    # sharding rule (the replicate-only fallback); empty when every op has a rule.
    replicated_ops: dict[str, float] = field(default_factory=dict)
    # Context parallelism: the mesh axis attention rings over (None: no ring) and the sequence layout of every
    # split on that axis: "contiguous" (member k holds block k of n) or "zigzag" (chunks k and 2n-1-k of 2n, so
    # causal attention work is equal on every member); codegen permutes where that axis splits or gathers.
    context_axis: int | None = None
    context_layout: str = "contiguous"
    # The K/V hops of ring attention (point-to-point, overlapped with attention): listed beside the collectives
    ring_transfers: tuple[RingTransfer, ...] = ()
    # ZeRO-1's gathers no all-reduce pays (problem/zero_gathers.py); priced: in the step (False: an older file)
    optimizer_gathers: tuple[Collective, ...] = ()
    optimizer_gathers_priced: bool = True
    # What the plan was pinned by (``unpinned_step_time`` prices it): "annotations", "no tp", "no fsdp", ...
    pinned: tuple[str, ...] = ()
    meshes_searched: int = 1  # meshes the plan was chosen from (meshsearch)
    unpinned_mesh: tuple[int, ...] = ()  # the unpinned optimum's, when searched over meshes; (): this mesh
    # The precision recipe priced (``cost_models.memory.RECIPES``): "bf16" (the model's dtypes, fp32 master +
    # Adam moments for 16-bit weights) or "amp" (fp32 weights under bf16 autocast); grad_sync: problem/step.py
    precision: str = "bf16"
    grad_sync: SyncExposure | None = None  # what of the gradient sync is exposed, and why
    grad_buckets: tuple[GradBucket, ...] = ()  # its buckets in issue order, as the runtime issues them
    version: int = VERSION

    # -- people -----------------------------------------------------------------------------------------------
    @property
    def zigzag_axis(self) -> int | None:
        """The mesh axis whose splits use the zigzag layout, or None."""
        return self.context_axis if self.context_layout == "zigzag" else None

    @property
    def stage_zigzag_axis(self) -> int | None:
        """:attr:`zigzag_axis` on one pipeline stage's sub-mesh (the pipeline axis, when the mesh has it,
        dropped): every stage keeps that layout, so activations cross stages in it."""
        zigzag, pipe = self.zigzag_axis, self.pipeline
        if zigzag is None or pipe is None or math.prod(self.mesh_shape) == len(pipe.stages[0].ranks):
            return zigzag  # no pipeline axis in the mesh: it is one stage's
        return zigzag - 1 if pipe.mesh_axis < zigzag else zigzag

    @property
    def num_devices(self) -> int:
        return math.prod(self.mesh_shape)

    def collective_counts(self, phase: str | None = None) -> Counter[str]:
        return Counter(c.kind for c in self.collectives if phase is None or c.phase == phase)

    def __repr__(self) -> str:
        """One line (the dataclass's own repr lists every node and collective: thousands of lines at a REPL):
        ``<Plan LlamaForCausalLM on (2, 8): TP 8 × DP 2, 1 microbatch; step 1.17 s, 61.3 GiB per device>``."""
        from autoshard.pipeline.summary import headline  # the report's first line
        from autoshard.report.labels import fmt_seconds

        return (
            f"<Plan {self.model} on {self.mesh_shape}: {headline(self)}; step {fmt_seconds(self.predicted_step_time)}, "
            f"{_bytes(self.memory_per_device)} per device; .summary() for the report>"
        )

    def summary(self, width: int = 100, baseline: Plan | None = None) -> str:
        """The text report of :mod:`autoshard.report.table` (cluster, strategy per module group, patterns,
        collectives, step time and memory, solver certificate) in ``width`` columns.  ``baseline``: the same
        model planned as pure data parallel (every parameter ``R``), put beside this plan as ``autoshard
        search`` does; without it a line says it was not compared and how."""
        from autoshard.report.table import summary  # the report reads plans: imported only when asked

        return summary(self, width, baseline)

    def recipe_note(self, runner: str, runs: str) -> str:
        """One line when ``runner`` runs another recipe (``runs``) than :attr:`precision`, else ""."""
        from autoshard.report.figures import recipe_note

        return recipe_note(self, runner, runs)

    # -- files ------------------------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["format"] = FORMAT
        return data

    def save(self, path: str | Path) -> None:  # its folder made as needed (the README's out/plan.json)
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(self.to_json(), indent=1, sort_keys=True))

    @classmethod
    def from_json(cls, data: dict[str, Any], source: str = "<dict>") -> Plan:
        if data.get("format") != FORMAT:
            raise PlanFileError(f"{source}: not an autoshard plan (field 'format' is {data.get('format')!r})")
        if data.get("version") != VERSION:
            raise PlanFileError(
                f"{source}: plan version {data.get('version')!r} is not supported (this autoshard reads "
                f"version {VERSION}); re-create it with `autoshard search ... --out`"
            )
        from autoshard.plan_check import check_data

        check_data(data, source)
        try:
            return cls(
                model=data["model"],
                cluster=data["cluster"],
                mesh_shape=tuple(data["mesh_shape"]),
                training=bool(data["training"]),
                param_placements={k: tuple(v) for k, v in data["param_placements"].items()},
                input_placements={k: tuple(v) for k, v in data["input_placements"].items()},
                output_placements=tuple(tuple(v) for v in data["output_placements"]),
                nodes=tuple(NodePlan(**{**n, "inputs": tuple(n.get("inputs", ()))}) for n in data["nodes"]),
                collectives=tuple(Collective(**c) for c in data["collectives"]),
                predicted_step_time=float(data["predicted_step_time"]),
                compute_time=float(data["compute_time"]),
                communication_time=float(data["communication_time"]),
                memory_per_device=float(data["memory_per_device"]),
                device_memory=float(data["device_memory"]),
                solver=_solver_from_json(data["solver"]),
                timings=dict(data.get("timings", {})),
                notes=tuple(data.get("notes", ())),
                memory_limit=data.get("memory_limit"),
                input_shapes={k: (tuple(v[0]), str(v[1])) for k, v in data.get("input_shapes", {}).items()},
                degrees={str(k): int(v) for k, v in data.get("degrees", {}).items()},
                microbatches=int(data.get("microbatches", 1)),
                pipeline=_pipeline_from_json(data.get("pipeline")),
                source=dict(data.get("source", {})),
                unpinned_step_time=None if (u := data.get("unpinned_step_time")) is None else float(u),
                overlap=OverlapPolicy.from_json(data.get("overlap")),
                memory_breakdown={str(k): float(v) for k, v in data.get("memory_breakdown", {}).items()},
                recompute=str(data.get("recompute", "none")),
                recompute_blocks=data.get("recompute_blocks"),
                replicated_ops={str(k): float(v) for k, v in data.get("replicated_ops", {}).items()},
                context_axis=data.get("context_axis"),
                context_layout=str(data.get("context_layout", "contiguous")),
                ring_transfers=tuple(RingTransfer(**r) for r in data.get("ring_transfers", ())),
                optimizer_gathers=tuple(Collective(**c) for c in data.get("optimizer_gathers", ())),
                optimizer_gathers_priced=data.get("optimizer_gathers_priced", False),
                pinned=tuple(str(p) for p in data.get("pinned", ())),
                meshes_searched=int(data.get("meshes_searched", 1)),
                unpinned_mesh=tuple(int(n) for n in data.get("unpinned_mesh", ())),
                precision=str(data.get("precision", "bf16")),
                grad_sync=SyncExposure.from_json(data.get("grad_sync")),
                grad_buckets=tuple(GradBucket.from_json(b) for b in data.get("grad_buckets", ())),
                version=int(data["version"]),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise PlanFileError(
                f"{source}: malformed plan ({type(e).__name__}: {e}); re-create the file"
            ) from e


def _pipeline_from_json(data: dict[str, Any] | None) -> PipelinePlan | None:
    if data is None:
        return None
    stages = tuple(
        PipelineStage(
            index=int(st["index"]),
            modules=tuple(st["modules"]),
            layers=None if st.get("layers") is None else (int(st["layers"][0]), int(st["layers"][1])),
            ranks=tuple(int(r) for r in st["ranks"]),
            compute_seconds=float(st.get("compute_seconds", 0.0)),
            memory_bytes=float(st.get("memory_bytes", 0.0)),
        )
        for st in data["stages"]
    )
    return PipelinePlan(
        stages=stages,
        schedule=str(data["schedule"]),
        virtual_stages=int(data.get("virtual_stages", 1)),
        bubble_fraction=float(data.get("bubble_fraction", 0.0)),
        mesh_axis=int(data.get("mesh_axis", 0)),
    )


def _solver_from_json(data: dict[str, Any]) -> SolverReport:
    ranked = tuple(str(r) for r in data.get("ranked", ()))
    return SolverReport(**{**data, "log": tuple(data.get("log", ())), "ranked": ranked})


def load_plan(path: str | Path) -> Plan:
    """Load a plan saved by :meth:`Plan.save`; errors name the file and what is wrong."""
    p = Path(path)
    from autoshard.plan_check import check_text

    try:
        text = check_text(p.read_bytes(), str(p))
    except OSError as e:
        raise PlanFileError(f"cannot read plan file {p}: {e.strerror}; check the path") from e
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        cut = " (the file ends early: truncated?)" if e.pos >= len(text.rstrip()) else ""
        raise PlanFileError(f"{p}: broken JSON at line {e.lineno}, column {e.colno}: {e.msg}{cut}") from e
    if not isinstance(data, dict):
        raise PlanFileError(f"{p}: expected a JSON object at the top level")
    return Plan.from_json(data, source=str(p))


def _bytes(n: float) -> str:
    from autoshard.report.labels import fmt_bytes  # imported late: the report reads plans

    return fmt_bytes(n)
