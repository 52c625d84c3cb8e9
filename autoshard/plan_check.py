"""Validate a plan file before anything trusts it: ``show``, ``dot``, ``verify`` and ``parallelize`` all load
plans through :func:`autoshard.plans.load_plan`, which calls :func:`check_text` on the bytes and
:func:`check_data` on the parsed JSON.

What is checked, each failure one :class:`~autoshard.errors.PlanFileError` line naming the file and field:

- the file: UTF-8 text, not binary, complete JSON (a cut-off file says so), a JSON object;
- the record: format and version, no unknown fields (at the top level and inside nodes, collectives, the solver
  report, the ring transfers and the pipeline), the value types that matter; ``pinned`` a list of strings;
- the mesh: positive axis sizes, their product equal to the cluster's devices, the cluster's own mesh equal;
- placements: every parameter, input and output placement tuple parses (``S(d)``, ``R``, ``P``) and has one
  placement per mesh axis; every node's strategy label parses with the same arity; a parameter's placement
  agrees with its graph node's decision;
- shapes: every input shape is positive, sharded dims exist in the input and divide by the axes that split them;
- degrees: known kinds, each at least 1 and dividing the device count; microbatches at least 1; pipeline
  stage ranks on the mesh; recompute a known policy and ``recompute_blocks`` null or a count >= 1;
- context parallelism: ``context_layout`` contiguous or zigzag, ``context_axis`` an axis of more than one device;
- precision: a recipe the cost model prices (``cost_models.memory.RECIPES``; absent in older files: bf16);
  a ring transfer's ``itemsize`` (bytes per element as priced) 1, 2, 4 or 8 (0 or absent in older files);
- ZeRO-1's ``optimizer_gathers``: all-gathers of phase ``optimizer``; ``optimizer_gathers_priced`` a boolean;
- a collective's ``recompute`` flag: a boolean, only on forward moves of a plan that recomputes;
- gradient buckets (``Plan.grad_buckets``, absent in older files): each a known record on an axis of more than one
  device, its members parameters of the plan, at most once per axis and kind, in issue order; none when pipelined;
- figures: step time and memory numbers >= 0; a step claimed optimal has a ``step_bound`` it does not exceed.

Whether each node's strategy exists for the model is checked where the model is at hand: codegen's
:func:`~autoshard.codegen.assign.assign_strategies` and verify's mapping (which lists what does not map).
A plan file is data: loading one never imports or runs anything it names.

Example::

    check_data(json.loads(text), "plan.json")     # raises PlanFileError("plan.json: field 'mesh_shape' ...")
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from autoshard.errors import PlanFileError, ShardingError
from autoshard.placement import Shard, parse_placement
from cost_models.memory import RECIPES
from cost_models.overlap import GradBucket

__all__ = ["DEGREE_KINDS", "check_data", "check_text"]

DEGREE_KINDS = ("dp", "fsdp", "tp", "sp", "cp", "ep", "pp")
CONTEXT_LAYOUTS = ("contiguous", "zigzag")
_EXTRA_TOP = frozenset({"format", "report"})  # ``report``: written by ``search --json`` beside the plan
_FIX = "re-create it with `autoshard search ... --out`"


def check_text(raw: bytes, source: str) -> str:
    """The file's text, or a one-line error for binary, non-UTF-8 or empty files."""
    if b"\x00" in raw[:4096]:
        raise PlanFileError(f"{source}: a binary file (NUL bytes), not a plan: {_FIX}")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PlanFileError(
            f"{source}: not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start}), not a plan file: {_FIX}"
        ) from e
    if not text.strip():
        raise PlanFileError(f"{source}: the file is empty: {_FIX}")
    return text


def check_data(data: Mapping[str, Any], source: str) -> None:
    """Every structural check of the module doc on a parsed plan file; raises :class:`PlanFileError`."""
    from autoshard.plans import (
        Collective,
        NodePlan,
        PipelinePlan,
        PipelineStage,
        Plan,
        RingTransfer,
        SolverReport,
    )
    from cost_models.overlap import SyncExposure

    _known(data, Plan, source, "", _EXTRA_TOP)
    for i, node in enumerate(_list(data, "nodes", source)):
        _known(node, NodePlan, source, f"nodes[{i}].")
    for i, c in enumerate(_list(data, "collectives", source)):
        _known(c, Collective, source, f"collectives[{i}].")
        _recomputed(c, data, source, f"collectives[{i}].recompute")
    for i, r in enumerate(_list(data, "ring_transfers", source)):
        _known(r, RingTransfer, source, f"ring_transfers[{i}].")
        if r.get("itemsize", 0) not in _ITEMSIZES:  # bytes per element of a hop (0: an older file)
            raise _fail(source, f"ring_transfers[{i}].itemsize", f"{r['itemsize']!r} is not 0, 1, 2, 4 or 8")
    for i, c in enumerate(_list(data, "optimizer_gathers", source)):
        _known(c, Collective, source, f"optimizer_gathers[{i}].")
        if c.get("phase") != "optimizer" or c.get("kind") != "all_gather":
            raise _fail(source, f"optimizer_gathers[{i}]", "expected an all_gather of phase 'optimizer'")
    if not isinstance(data.get("optimizer_gathers_priced", False), bool):
        raise _fail(source, "optimizer_gathers_priced", "expected true or false (whether the step pays them)")
    if not all(isinstance(p, str) for p in _list(data, "pinned", source)):
        raise _fail(source, "pinned", "expected a list of strings such as 'annotations' or 'no tp'")
    if isinstance(data.get("solver"), Mapping):
        _known(data["solver"], SolverReport, source, "solver.")
    if data.get("grad_sync") is not None:  # cost_models.overlap.SyncExposure: its own check says the range
        _known(data["grad_sync"], SyncExposure, source, "grad_sync.")
    for i, b in enumerate(_list(data, "grad_buckets", source)):
        _known(b, GradBucket, source, f"grad_buckets[{i}].")
    pipeline = data.get("pipeline")
    if isinstance(pipeline, Mapping):
        _known(pipeline, PipelinePlan, source, "pipeline.")
        for i, st in enumerate(pipeline.get("stages") or ()):
            _known(st, PipelineStage, source, f"pipeline.stages[{i}].")
    mesh = _mesh(data, source)
    _placements(data, mesh, source)
    _node_labels(data, mesh, source)
    _shapes(data, mesh, source)
    _degrees(data, math.prod(mesh), source)
    _context(data, mesh, source)
    _ranking(data, source)
    _precision(data, source)
    _buckets(data, mesh, source)
    _model_identity(data, source)


def _model_identity(data: Mapping[str, Any], source: str) -> None:
    """``source.model``: what identifies the plan's model (:func:`autoshard.plan_model.identity`)."""
    own = data.get("source", {}).get("model") if isinstance(data.get("source"), dict) else None
    if own is None:
        return
    if not (
        isinstance(own, dict) and isinstance(own.get("class"), str) and isinstance(own.get("digest"), str)
        and isinstance(own.get("parameters"), int) and own["parameters"] >= 0
    ):  # fmt: skip
        raise _fail(
            source, "source.model", f"{own!r} is not {{class, parameters, digest}} of the plan's model"
        )


def _buckets(data: Mapping[str, Any], mesh: tuple[int, ...], source: str) -> None:
    """Gradient buckets: on a real axis, members the plan places, once per axis, in issue order."""
    buckets, params = _list(data, "grad_buckets", source), data.get("param_placements", {})
    if buckets and data.get("pipeline") is not None:
        raise _fail(source, "grad_buckets", "a pipelined plan syncs once per step: its buckets must be empty")
    seen: set[tuple[int, Any, str]] = set()
    index = 0
    for i, b in enumerate(buckets):
        field, axis, members = f"grad_buckets[{i}]", b.get("mesh_axis"), b.get("params")
        if isinstance(axis, bool) or not isinstance(axis, int) or not 0 <= axis < len(mesh) or mesh[axis] < 2:
            raise _fail(source, f"{field}.mesh_axis", f"{axis!r} is not an axis of more than one device")
        if not isinstance(members, list) or not members or not all(isinstance(p, str) for p in members):
            raise _fail(source, f"{field}.params", "expected a non-empty list of parameter names")
        for name in members:
            if name not in params:
                raise _fail(source, f"{field}.params", f"{name!r} is not a parameter of the plan")
            if (axis, b.get("kind"), name) in seen:
                where = f"{b.get('kind')} buckets on axis {axis}"
                raise _fail(source, f"{field}.params", f"{name!r} is in two {where}")
            seen.add((axis, b.get("kind"), name))
        if not isinstance(b.get("index"), int) or b["index"] < index:
            raise _fail(source, f"{field}.index", f"{b.get('index')!r} is not in issue order (after {index})")
        index = b["index"]
        try:
            GradBucket.from_json(b)
        except (TypeError, ValueError) as e:
            raise _fail(source, field, str(e)) from e


_ITEMSIZES = (0, 1, 2, 4, 8)


def _precision(data: Mapping[str, Any], source: str) -> None:
    """The recipe the plan was priced under is one the cost model knows (an older file has none: bf16)."""
    name = data.get("precision", "bf16")
    if not isinstance(name, str) or name not in RECIPES:
        raise _fail(
            source, "precision", f"{name!r} is not a priced recipe (one of {', '.join(sorted(RECIPES))})"
        )


def _ranking(data: Mapping[str, Any], source: str) -> None:
    """The figures are numbers >= 0; a step claimed optimal has a bound it does not exceed (planner_rerank)."""
    for name, unit in (("predicted_step_time", "seconds"), ("memory_per_device", "bytes")):
        value: Any = data.get(name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
            raise _fail(source, name, f"{value!r} is not a number of {unit} >= 0")
    solver = data.get("solver")
    if not isinstance(solver, Mapping) or not solver.get("step_optimal"):
        return
    bound, step = solver.get("step_bound"), data.get("predicted_step_time")
    if not isinstance(bound, (int, float)) or not isinstance(step, (int, float)) or step > bound * (1 + 1e-6):
        raise _fail(source, "solver.step_optimal", f"claims step {step!r} optimal against bound {bound!r}")


def _context(data: Mapping[str, Any], mesh: tuple[int, ...], source: str) -> None:
    """Context parallelism: a layout autoshard knows, on an axis of the mesh (zigzag needs one)."""
    layout, axis = data.get("context_layout", "contiguous"), data.get("context_axis")
    if layout not in CONTEXT_LAYOUTS:
        raise _fail(source, "context_layout", f"{layout!r} is not one of {', '.join(CONTEXT_LAYOUTS)}")
    if axis is None:
        if layout == "zigzag":
            raise _fail(source, "context_axis", "the zigzag layout needs the mesh axis it splits")
        return
    if isinstance(axis, bool) or not isinstance(axis, int) or not 0 <= axis < len(mesh) or mesh[axis] < 2:
        raise _fail(source, "context_axis", f"{axis!r} is not an axis of more than one device of mesh {mesh}")


def _fail(source: str, field: str, what: str) -> PlanFileError:
    return PlanFileError(f"{source}: field {field!r}: {what}; {_FIX}")


def _known(obj: Any, record: type, source: str, prefix: str, extra: frozenset[str] = frozenset()) -> None:
    if not isinstance(obj, Mapping):
        raise _fail(source, prefix.rstrip(".") or "<top>", f"expected an object, got {type(obj).__name__}")
    names = {f.name for f in dataclasses.fields(record)} | extra
    fields = dataclasses.fields(record)
    missing = [
        f.name for f in fields if f.name not in obj and f.default is f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise _fail(source, prefix + missing[0], f"missing (a {record.__name__} needs {', '.join(missing)})")
    unknown = sorted(set(obj) - names)
    if unknown:
        raise _fail(
            source, prefix + unknown[0], f"unknown field (a {record.__name__} has {', '.join(sorted(names))})"
        )


def _list(data: Mapping[str, Any], key: str, source: str) -> list[Any]:
    value = data.get(key, [])
    if not isinstance(value, list):
        raise _fail(source, key, f"expected a list, got {type(value).__name__}")
    return value


def _mesh(data: Mapping[str, Any], source: str) -> tuple[int, ...]:
    mesh = data.get("mesh_shape")
    if not isinstance(mesh, list) or not mesh or not all(isinstance(n, int) and n >= 1 for n in mesh):
        raise _fail(source, "mesh_shape", f"{mesh!r} is not a list of positive axis sizes")
    cluster = data.get("cluster")
    if not isinstance(cluster, Mapping):
        raise _fail(source, "cluster", "expected an object with profile, nodes, mesh_shape, devices")
    devices = cluster.get("devices", math.prod(mesh))
    if devices != math.prod(mesh):
        raise _fail(
            source,
            "mesh_shape",
            f"mesh {mesh} has {math.prod(mesh)} devices, the cluster {devices} (cluster.devices)",
        )
    if "mesh_shape" in cluster and list(cluster["mesh_shape"]) != list(mesh):
        raise _fail(source, "cluster.mesh_shape", f"{cluster['mesh_shape']} differs from mesh_shape {mesh}")
    return tuple(mesh)


def _spec(value: Any, mesh: tuple[int, ...], source: str, field: str) -> tuple[Any, ...]:
    if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
        raise _fail(source, field, f'{value!r} is not a list of placements like ["S(0)", "R"]')
    if len(value) != len(mesh):
        raise _fail(
            source, field, f"{len(value)} placements {value} for a {len(mesh)}-axis mesh {list(mesh)}"
        )
    try:
        return tuple(parse_placement(p) for p in value)
    except ShardingError as e:
        raise _fail(source, field, str(e)) from e


def _placements(data: Mapping[str, Any], mesh: tuple[int, ...], source: str) -> None:
    for key in ("param_placements", "input_placements"):
        table = data.get(key, {})
        if not isinstance(table, Mapping):
            raise _fail(source, key, "expected an object of name -> placements")
        for name, value in table.items():
            _spec(value, mesh, source, f"{key}[{name!r}]")
    for i, value in enumerate(_list(data, "output_placements", source)):
        if value:  # a non-tensor output has no placements
            _spec(value, mesh, source, f"output_placements[{i}]")


_LABEL_SPEC = re.compile(r"\([^()]*(?:\([^()]*\)[^()]*)*\)|[^,\s]+")


def _label_specs(label: str) -> list[str]:
    """``"(S(0), R), R -> S(0)"`` → ``["(S(0), R)", "R", "S(0)"]``."""
    inputs, arrow, output = label.partition("->")
    if not arrow:
        raise ShardingError(f"strategy {label!r} has no '->'")
    return [*_LABEL_SPEC.findall(inputs), *_LABEL_SPEC.findall(output)]


def _node_labels(data: Mapping[str, Any], mesh: tuple[int, ...], source: str) -> None:
    params = data.get("param_placements", {})
    for i, node in enumerate(data.get("nodes", [])):
        field = f"nodes[{i}].strategy"
        label = node.get("strategy")
        if not isinstance(label, str):
            raise _fail(source, field, f"{label!r} is not a strategy label")
        try:
            specs = _label_specs(label)
            for text in specs:
                if text == "-":  # an operand that is not a tensor
                    continue
                inner = text[1:-1].split(", ") if text.startswith("(") else [text]
                if len(inner) != len(mesh):
                    raise ShardingError(f"{text} has {len(inner)} placements for a {len(mesh)}-axis mesh")
                for p in inner:
                    parse_placement(p)
        except ShardingError as e:
            raise _fail(source, field, f"{label!r}: {e}") from e
        stored = params.get(node.get("module")) if node.get("target") == "placeholder" else None
        if stored is not None and specs:
            said = specs[-1][1:-1].split(", ") if specs[-1].startswith("(") else [specs[-1]]
            if list(stored) != said:
                raise _fail(
                    source,
                    f"param_placements[{node['module']!r}]",
                    f"{stored} disagrees with its graph node's {said}",
                )


def _shapes(data: Mapping[str, Any], mesh: tuple[int, ...], source: str) -> None:
    shapes = data.get("input_shapes", {})
    if not isinstance(shapes, Mapping):
        raise _fail(source, "input_shapes", "expected an object of input -> [shape, dtype]")
    placements = data.get("input_placements", {})
    for name, entry in shapes.items():
        field = f"input_shapes[{name!r}]"
        ok = (
            isinstance(entry, list)
            and len(entry) == 2
            and isinstance(entry[0], list)
            and isinstance(entry[1], str)
        )
        if not ok or not all(isinstance(n, int) and n >= 0 for n in entry[0]):
            raise _fail(source, field, f"{entry!r} is not [[dims...], dtype] with non-negative dims")
        shape = entry[0]
        if name not in placements:
            continue
        ways: dict[int, int] = {}
        for axis, p in enumerate(_spec(placements[name], mesh, source, f"input_placements[{name!r}]")):
            if isinstance(p, Shard):
                if not -len(shape) <= p.dim < len(shape):
                    raise _fail(
                        source, f"input_placements[{name!r}]", f"S({p.dim}) on an input of shape {shape}"
                    )
                ways[p.dim % len(shape)] = ways.get(p.dim % len(shape), 1) * mesh[axis]
        for dim, n in ways.items():
            if shape[dim] % n:
                raise _fail(
                    source, field, f"dim {dim} of {shape} does not split {n} ways as input_placements says"
                )


def _degrees(data: Mapping[str, Any], devices: int, source: str) -> None:
    degrees = data.get("degrees", {})
    if not isinstance(degrees, Mapping):
        raise _fail(source, "degrees", "expected an object of kind -> degree")
    for kind, n in degrees.items():
        if kind not in DEGREE_KINDS:
            raise _fail(source, f"degrees[{kind!r}]", f"unknown kind (known: {', '.join(DEGREE_KINDS)})")
        if not isinstance(n, int) or n < 1 or devices % n:
            raise _fail(
                source, f"degrees[{kind!r}]", f"{n!r} must be a positive divisor of the {devices} devices"
            )
    micro = data.get("microbatches", 1)
    if not isinstance(micro, int) or micro < 1:
        raise _fail(source, "microbatches", f"{micro!r} must be a positive whole number")
    _recompute(data, source)
    pipeline = data.get("pipeline")
    for i, st in enumerate((pipeline or {}).get("stages") or ()):
        ranks: Sequence[Any] = st.get("ranks", ())
        if not all(isinstance(r, int) and 0 <= r < devices for r in ranks):
            raise _fail(source, f"pipeline.stages[{i}].ranks", f"ranks must lie in 0..{devices - 1}")


def _recomputed(c: Mapping[str, Any], data: Mapping[str, Any], source: str, field: str) -> None:
    """A collective marked ``recompute`` (backward re-runs it with its block) is a forward move of a plan
    that recomputes (absent in older files: false)."""
    flag = c.get("recompute", False)
    if not isinstance(flag, bool):
        raise _fail(source, field, f"{flag!r} must be true or false")
    if flag and c.get("phase") != "forward":
        raise _fail(
            source, field, f"marks a {c.get('phase')!r} collective; only forward moves are recomputed"
        )
    if flag and data.get("recompute", "none") == "none":
        raise _fail(source, field, "marks a recomputed move but the plan's recompute is none")


def _recompute(data: Mapping[str, Any], source: str) -> None:
    """``recompute`` is a known policy; ``recompute_blocks`` (how many blocks it applies to) null or >= 1."""
    policy = data.get("recompute", "none")
    if policy not in ("none", "selective", "full"):
        raise _fail(source, "recompute", f"{policy!r} must be one of none, selective, full")
    blocks = data.get("recompute_blocks")
    if blocks is not None and (isinstance(blocks, bool) or not isinstance(blocks, int) or blocks < 1):
        raise _fail(
            source, "recompute_blocks", f"{blocks!r} must be null (every block) or a whole number >= 1"
        )
    if blocks is not None and policy == "none":
        raise _fail(source, "recompute_blocks", "is set but recompute is none; set it to null")
