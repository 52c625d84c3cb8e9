"""Capture a model's forward pass as a cleaned, annotated ATen graph.

Input: an ``nn.Module`` (on any device, ``meta`` included) and example inputs (real or meta tensors).
Output: a :class:`~autoshard.capture.meta.Captured` record.

Steps:

1. ``torch.export.export(model, args, kwargs, strict=False)``; we keep the *pre-decomposition* ATen graph
   (no ``run_decompositions``: it costs 10-26 s on LLaMA-3 and breaks ``scaled_dot_product_attention``,
   ``linear`` and ``embedding`` into pieces a planner would have to reassemble).
2. If export fails, ``torch.fx.symbolic_trace`` (plain modules only: it fails on every HF model); that
   graph holds torch-level calls (``call_module`` leaves, ``call_method``), and ``method`` says so.
   If both fail: :class:`~autoshard.errors.CaptureError` naming the construct and a fix.
3. :func:`~autoshard.capture.clean.clean` (export path), then
   :func:`~autoshard.capture.annotate.annotate` (every ``META_*`` key).
4. Repeated blocks (``blocks="auto"``): when the model has a stack of N >= 3 identical layers, export it
   cut to 2 and to 3 layers, check that the 3-layer graph is the 2-layer graph plus one layer
   (:func:`~autoshard.capture.blocks.check_extension`) and return the 2-layer graph with
   ``BlockInfo(num_blocks=N, captured_blocks=2)``; a 70B model captures in about half a second of CPU instead
   of 20 (``python -m benchmarks.capture_scale``: the two exports are nearly all of it).  Neither export
   records Python stacks (``node.meta["stack_trace"]``): a cut graph is planned, never emitted.
   If the check fails we export all N layers and say why in ``notes``.
5. Further runs of identical blocks (``blocks="auto"``: an encoder tower beside the decoder stack, blocks
   held as ``self.layer0``, ``self.layer1``, ..): every block stays in the graph, labelled ``META_RUN``
   (:mod:`~autoshard.capture.runs`) for the search to collapse; the 3-layer check export cuts those held
   in indexed containers to 2 blocks, since the graph planned already holds them all.

Example::

    from autoshard import zoo
    from autoshard.capture import capture
    case = zoo.build("llama3-8b")                       # on the meta device
    cap = capture(case.model, case.args, case.kwargs)   # ~1 s; cap.blocks.num_blocks == 32
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import time
from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any, Literal

import torch
from torch import fx, nn
from torch.utils import _pytree as pytree

from autoshard.capture.annotate import PlaceholderInfo, annotate
from autoshard.capture.batchnorm import NOTES_KEY as BN_NOTES_KEY
from autoshard.capture.blocks import (
    BlockCandidate,
    BlockMismatch,
    annotate_blocks,
    check_extension,
    cut_blocks,
    find_repeated_blocks,
)
from autoshard.capture.causal import mark_causal_masks
from autoshard.capture.clean import clean, remaining_higher_order_ops
from autoshard.capture.diagnose import explain_failure, first_line
from autoshard.capture.gqa import mark_repeated_kv
from autoshard.capture.meta import (
    META_ALIASES,
    META_FQN,
    META_KIND,
    META_TENSOR,
    UNKNOWN_DIM,
    Captured,
    PlaceholderKind,
    tensor_meta_of,
)
from autoshard.capture.record import Traced, has_unknown_dim, merge_tied_parameters, record
from autoshard.capture.runs import annotate_runs, cut_runs, find_runs, nodes_under
from autoshard.errors import CaptureError

__all__ = ["BlocksMode", "capture", "graph_inputs"]

BlocksMode = Literal["auto", "full"] | None
"""``"auto"``: capture 2 blocks when there are >= 3; ``"full"``: all, blocks labelled; ``None``: no blocks."""

MIN_BLOCKS_TO_CUT = 3
CUT_BLOCKS = 2

_INPUT_KINDS: dict[str, PlaceholderKind] = {
    "PARAMETER": "parameter",
    "BUFFER": "buffer",
    "CONSTANT_TENSOR": "constant",
    "CUSTOM_OBJ": "constant",
    "TOKEN": "constant",
    "USER_INPUT": "user_input",
}


def capture(
    model: nn.Module,
    args: tuple[Any, ...] | Any = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    blocks: BlocksMode = "auto",
    check_blocks: bool = True,
    fuse_experts: bool = True,
) -> Captured:
    """Capture ``model(*args, **kwargs)`` as a cleaned, annotated graph (see the module docstring).

    ``check_blocks=False`` skips the 3-block export that checks the 2-block shortcut: for a model already
    checked at other input shapes (the pipeline search captures one model at several microbatch sizes).
    ``fuse_experts=False`` leaves grouped-GEMM expert MLPs as their ops (:mod:`autoshard.capture.experts`).
    """
    if blocks not in ("auto", "full", None):
        raise ValueError(f"capture(blocks={blocks!r}): use 'auto', 'full' or None")
    start = time.perf_counter()
    args = args if isinstance(args, tuple) else (args,)
    kwargs = dict(kwargs or {})
    notes: list[str] = []
    candidate = find_repeated_blocks(model) if blocks is not None else None
    if blocks == "auto" and candidate is not None and candidate.num_blocks >= MIN_BLOCKS_TO_CUT:
        cut = _capture_cut(model, args, kwargs, candidate, notes, check_blocks, fuse_experts)
        if cut is not None:
            return replace(cut, seconds=time.perf_counter() - start, notes=tuple(notes))
    traced = _trace(model, args, kwargs, notes)
    _prepare(traced, model, notes, fuse_experts)
    info = None
    if candidate is not None:
        try:
            info = annotate_blocks(traced.gm, candidate, candidate.num_blocks)
        except BlockMismatch as e:
            notes.append(f"repeated blocks {candidate.prefix} not labelled: {e}")
            candidate = None
    # further runs (encoder and decoder towers, attribute-held blocks) only where the search collapses
    runs = annotate_runs(traced.gm, find_runs(model, candidate), notes) if blocks == "auto" else ()
    return replace(record(traced, model, info, time.perf_counter() - start, notes), runs=runs)


def _capture_cut(
    model: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    candidate: BlockCandidate,
    notes: list[str],
    check: bool = True,
    fuse_experts: bool = True,
) -> Captured | None:
    """The 2-block capture, checked against a 3-block one; ``None`` (and a note) when that fails.

    Why 3 blocks and not 1 (a 1-block check export would cost ~0.1 s less on 70B): the check is the only
    place a third layer traces, so it catches a layer whose code branches on its index with period 3
    (``layer_idx % 3``: an attention pattern, a NoPE layer), which a 1-versus-2 check never runs."""
    cut_notes: list[str] = []  # kept only if the shortcut succeeds
    try:
        with cut_blocks(model, candidate, CUT_BLOCKS), _no_stack_traces():  # planned, never emitted
            small = _export(model, args, kwargs)
        _prepare(small, model, cut_notes, fuse_experts)
        info_small = annotate_blocks(small.gm, candidate, CUT_BLOCKS)
        # further runs (an encoder tower) stay whole in the graph planned, but are cut in the check export
        runs = find_runs(model, candidate)
        found = annotate_runs(small.gm, runs, cut_notes)
        if check:
            with (
                cut_blocks(model, candidate, CUT_BLOCKS + 1),
                cut_runs(model, runs, found, CUT_BLOCKS) as out,
                _no_stack_traces(),  # this graph is only compared
            ):
                big = _export(model, args, kwargs)
            _prepare(big, model, [], fuse_experts)
            info_big = annotate_blocks(big.gm, candidate, CUT_BLOCKS + 1)
            check_extension(small.gm, big.gm, info_small, info_big, nodes_under(small.gm, found, out))
    except Exception as e:  # any failure of the shortcut (BlockMismatch, export error): take the long road
        notes.append(
            f"2-block capture of {candidate.prefix} abandoned ({type(e).__name__}: {first_line(e)}); "
            f"exported all {candidate.num_blocks} blocks"
        )
        return None
    notes.extend(cut_notes)
    notes.append(
        f"captured {CUT_BLOCKS} of {candidate.num_blocks} blocks of {candidate.prefix}; "
        + (
            f"checked that {CUT_BLOCKS + 1} blocks add exactly one block's {info_small.nodes_per_block} nodes"
            if check
            else "the 3-block check was done at other input shapes"
        )
    )
    return replace(record(small, model, info_small, 0.0, notes), runs=found)


def _trace(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], notes: list[str]) -> Traced:
    """torch.export, else symbolic_trace, else a CaptureError that says what failed and how to fix it."""
    try:
        return _export(model, args, kwargs)
    except Exception as export_error:
        try:
            traced = _symbolic_trace(model, args, kwargs)
        except Exception as trace_error:
            raise CaptureError(explain_failure(model, export_error, trace_error)) from export_error
        notes.append(
            f"torch.export failed ({type(export_error).__name__}: {first_line(export_error)}); used "
            "torch.fx.symbolic_trace: the graph holds torch-level calls (call_module, call_method), "
            "not ATen ops"
        )
        return traced


@contextlib.contextmanager
def _quiet_torch() -> Iterator[None]:
    """Silence torch's own logging of an op that fails on fake tensors (a traceback on stderr): the failure
    reaches the user once, as our CaptureError."""
    logger = logging.getLogger("torch._subclasses.fake_tensor")
    before = logger.disabled
    logger.disabled = True
    try:
        yield
    finally:
        logger.disabled = before


@contextlib.contextmanager
def _no_stack_traces() -> Iterator[None]:
    """Export without recording each node's Python stack (``node.meta["stack_trace"]``): a fifth of an
    export's time (LLaMA-3-70B cut to 3 blocks: 0.37 -> 0.30 s CPU), more in a process's first capture,
    which reads the model's source files to quote them (70B, first capture as ``autoshard.plan`` makes it,
    ten paired runs: 0.11 s CPU less at the median).  For both exports of the 2-block shortcut: the check
    export's graph is only compared, by op, tensor metadata and argument structure (:func:`check_extension`),
    none of which the stacks change; the 2-block graph is only planned.  No stage reads a planned graph's
    stacks: codegen, verify and the pipeline runtime emit a capture of every layer (``blocks="full"``,
    exported by :func:`_trace` with stacks, printed as ``# File:`` lines), never a graph holding two of the
    N layers.
    The stacks change nothing else in the graph (names, ops, meta: ``tests/capture/test_capture_lazy.py``)."""
    before = torch.fx.config.do_not_emit_stack_traces
    torch.fx.config.do_not_emit_stack_traces = True
    try:
        yield
    finally:
        torch.fx.config.do_not_emit_stack_traces = before


def _lazy_graph_modules() -> contextlib.AbstractContextManager[None]:
    """Graph modules made inside export generate and compile their Python code only when first run.

    Export's own passes (the set-grad and autocast regions split into submodules and back) build ~30 graph
    modules per export and compile each; none of them runs.  torch's lazy graph modules (what dynamo uses)
    skip that: LLaMA-3-70B cut to 3 blocks exports in 0.29 instead of 0.38 s CPU.  The exported graph module
    is an ordinary one, with the same graph and code (``tests/capture/test_capture_lazy.py``)."""
    try:
        from torch.fx._lazy_graph_module import _use_lazy_graph_module
    except ImportError:  # a torch without it: compile eagerly, as before
        return contextlib.nullcontext()
    return _use_lazy_graph_module(True)


def _export(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Traced:
    with _quiet_torch(), _lazy_graph_modules():
        ep = torch.export.export(model, args, kwargs, strict=False)
    sig = ep.graph_signature
    placeholders = {
        spec.arg.name: PlaceholderInfo(_INPUT_KINDS.get(spec.kind.name, "user_input"), spec.target)
        for spec in sig.input_specs
        if hasattr(spec.arg, "name")
    }
    kinds = {"USER_OUTPUT": "user_output", "BUFFER_MUTATION": "buffer_mutation"}
    output_kinds = [(kinds.get(spec.kind.name, "other"), spec.target) for spec in sig.output_specs]
    constants = {k: v for k, v in ep.constants.items() if isinstance(v, torch.Tensor)}
    return Traced(ep.graph_module, "export", placeholders, output_kinds, constants)


def _prepare(traced: Traced, model: nn.Module, notes: list[str], fuse_experts: bool = True) -> None:
    """Clean (export graphs) and annotate ``traced.gm`` in place."""
    aliases: dict[str, list[str]] = {}
    if traced.method == "export":
        aliases = merge_tied_parameters(traced, model)
        traced.gm = clean(traced.gm, fuse_experts=fuse_experts)
        notes.extend(traced.gm.meta.pop(BN_NOTES_KEY, []))
        if mark_causal_masks(traced.gm):  # an HF model's explicit mask: causal for context parallelism
            notes.append("explicit attention masks proven causal (context parallelism runs them per chunk)")
        mark_repeated_kv(traced.gm)  # grouped-query K/V copies: a ring rotates the originals
        left = remaining_higher_order_ops(traced.gm)
        if left:
            notes.append(f"control-flow ops kept as they are (cannot be inlined): {', '.join(left)}")
    trainable = {name for name, p in model.named_parameters(remove_duplicate=False) if p.requires_grad}
    root = model if traced.method == "symbolic_trace" else None
    annotate(traced.gm, traced.placeholders, trainable, root)
    for node in traced.gm.graph.nodes:
        if node.name in aliases:
            node.meta[META_ALIASES] = tuple(aliases[node.name])
            notes.append(f"tied parameters: {', '.join(aliases[node.name])} is {node.meta[META_FQN]}")
    unknown = [n.name for n in traced.gm.graph.nodes if has_unknown_dim(n.meta.get(META_TENSOR))]
    if unknown:
        notes.append(f"data-dependent sizes (recorded as {UNKNOWN_DIM}) in {unknown[:5]}")


# --- the symbolic_trace fallback -------------------------------------------------------------------------


class _MetaRecorder(fx.Interpreter):
    """Runs a graph and stores each node's ``META_TENSOR``; the values themselves are dropped when dead."""

    def run_node(self, n: fx.Node) -> Any:
        value = super().run_node(n)
        if n.op != "output":  # the output node gets its tuple of metas from annotate, as on the export path
            n.meta[META_TENSOR] = tensor_meta_of(value)
        return value


def _symbolic_trace(model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Traced:
    gm = torch.fx.symbolic_trace(model)
    values = _bind_placeholders(gm, model, args, kwargs)
    with torch.no_grad():
        _MetaRecorder(gm).run(*values)
    placeholders = {n.name: PlaceholderInfo("user_input") for n in gm.graph.nodes if n.op == "placeholder"}
    return Traced(gm, "symbolic_trace", placeholders, [])


def _bind_placeholders(
    gm: fx.GraphModule, model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> list:
    bound = inspect.signature(model.forward).bind(*args, **kwargs)
    bound.apply_defaults()
    return [bound.arguments.get(str(n.target).lstrip("*")) for n in gm.graph.nodes if n.op == "placeholder"]


# --- running a captured graph ----------------------------------------------------------------------------


def graph_inputs(
    captured: Captured,
    model: nn.Module,
    args: tuple[Any, ...] | Any = (),
    kwargs: Mapping[str, Any] | None = None,
) -> list[Any]:
    """Values for the captured graph's placeholders, in order: ``captured.graph_module(*graph_inputs(...))``.

    Parameters and buffers come from ``model`` by FQN, user inputs from ``(args, kwargs)`` flattened the way
    export flattens them (keyword arguments in the order of ``model.forward``'s signature).
    """
    args = args if isinstance(args, tuple) else (args,)
    kwargs = dict(kwargs or {})
    if captured.method == "symbolic_trace":
        return _bind_placeholders(captured.graph_module, model, args, kwargs)
    order = list(inspect.signature(model.forward).parameters)
    ordered = dict(
        sorted(kwargs.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order))
    )
    user_values = iter(pytree.tree_leaves((args, ordered)))
    values: list[Any] = []
    for node in captured.placeholders():
        kind, fqn = node.meta[META_KIND], str(node.meta.get(META_FQN))
        if kind == "parameter":
            values.append(model.get_parameter(fqn))
        elif kind == "buffer":
            values.append(model.get_buffer(fqn))
        elif kind == "constant":
            values.append(captured.constants[fqn])
        else:
            values.append(next(user_values))
    return values
