"""Capture: ``nn.Module`` + example inputs -> a cleaned, annotated ATen graph (:class:`Captured`).

A tour of the stage, one module per step:

- :mod:`~autoshard.capture.export` — :func:`capture`: ``torch.export`` (non-strict, works on the meta
  device), ``symbolic_trace`` fallback, error diagnosis, the 2-block shortcut for deep models.
- :mod:`~autoshard.capture.record` — the traced graph (after cleaning and annotation) as the
  :class:`Captured` record; tied parameters merged into one placeholder.
- :mod:`~autoshard.capture.diagnose` — the :class:`~autoshard.errors.CaptureError` message when both
  tracers fail: the construct, the user's line and module, the fix.
- :mod:`~autoshard.capture.clean` — passes that inline higher-order ops and drop asserts, identities and
  dead code, so every node is a plain ATen op.
- :mod:`~autoshard.capture.annotate` — passes writing the ``META_*`` keys (tensor meta, FLOPs, module path,
  ``requires_grad``, placeholder kind and FQN).
- :mod:`~autoshard.capture.flops` — FLOP formulas per op family.
- :mod:`~autoshard.capture.blocks` — repeated-block detection and the k / k+1 consistency check.
- :mod:`~autoshard.capture.runs` — further runs of identical blocks (encoder towers, numbered attributes).
- :mod:`~autoshard.capture.meta` — the records (:class:`TensorMeta`, :class:`BlockInfo`, :class:`Captured`)
  and the meta key names.

Example (runs on a laptop in about a second; the model lives on the meta device)::

    from autoshard import zoo
    from autoshard.capture import META_FLOPS, META_TENSOR, capture

    case = zoo.build("llama3-8b")
    cap = capture(case.model, case.args, case.kwargs)
    print(cap.blocks)                        # model.layers: 32 x LlamaDecoderLayer (2 captured, ...)
    for node in cap.op_nodes():
        print(node.name, node.meta[META_TENSOR], node.meta[META_FLOPS])
"""

from autoshard.capture.blocks import BlockCandidate, find_repeated_blocks
from autoshard.capture.export import BlocksMode, capture, graph_inputs
from autoshard.capture.flops import node_flops
from autoshard.capture.meta import (
    META_ALIASES,
    META_BLOCK,
    META_FLOPS,
    META_FQN,
    META_KIND,
    META_MODULE,
    META_MODULE_TYPE,
    META_NO_GRAD,
    META_OP,
    META_REQUIRES_GRAD,
    META_TENSOR,
    BlockInfo,
    Captured,
    OutputInfo,
    TensorMeta,
)

__all__ = [
    "META_ALIASES",
    "META_BLOCK",
    "META_FLOPS",
    "META_FQN",
    "META_KIND",
    "META_MODULE",
    "META_MODULE_TYPE",
    "META_NO_GRAD",
    "META_OP",
    "META_REQUIRES_GRAD",
    "META_TENSOR",
    "BlockCandidate",
    "BlockInfo",
    "BlocksMode",
    "Captured",
    "OutputInfo",
    "TensorMeta",
    "capture",
    "find_repeated_blocks",
    "graph_inputs",
    "node_flops",
]
