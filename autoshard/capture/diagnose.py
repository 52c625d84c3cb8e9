"""Say why a model could not be captured: the construct, the user's line and module, and a fix.

Input: the model and the exceptions ``torch.export`` and ``torch.fx.symbolic_trace`` raised.
Output: the message of the :class:`~autoshard.errors.CaptureError` that capture raises, for example::

    could not capture Net: torch.export failed with GuardOnDataDependentSymNode: Could not guard on ...
      where: /home/me/net.py:17 in forward: if x.sum() > 0: (module blocks.0)
      torch.fx.symbolic_trace failed too: TraceError: symbolically traced variables cannot be used as ...
      fix: the forward branches on a tensor's value (data-dependent control flow such as ...); express the
      branch with torch.cond(pred, true_fn, false_fn, operands), or make it depend on shapes ...

The user's frame is the innermost traceback frame outside torch, autoshard and the standard library; its
module is the nearest enclosing frame whose ``self`` is a submodule of the model.
"""

from __future__ import annotations

import os
import re
import sysconfig
import traceback
import types
from pathlib import Path

import torch
from torch import nn

__all__ = ["explain_failure", "first_line"]

_LIBRARY_DIRS = (
    os.path.dirname(os.path.abspath(torch.__file__ or "")) + os.sep,
    str(Path(__file__).resolve().parents[1]) + os.sep,  # autoshard itself
    sysconfig.get_paths()["stdlib"] + os.sep,
)


def first_line(e: BaseException) -> str:
    """The first line of an exception's message (at most 300 characters), or its type name."""
    text = str(e).strip()
    line = text.splitlines()[0] if text else type(e).__name__
    return line if len(line) <= 300 else line[:299] + "…"  # marked as cut, not a clause left open


def _user_frame(e: BaseException) -> tuple[str, types.FrameType] | None:
    """``("file:line in func: code", frame)`` of the innermost frame outside torch, autoshard and stdlib."""
    found = None
    tb = e.__traceback__
    while tb is not None:
        filename = os.path.abspath(tb.tb_frame.f_code.co_filename)
        if not filename.startswith(_LIBRARY_DIRS) and not filename.startswith("<"):
            summary = traceback.extract_tb(tb, limit=1)[0]
            found = (f"{summary.filename}:{summary.lineno} in {summary.name}: {summary.line}", tb.tb_frame)
        tb = tb.tb_next
    return found


def _module_of_frame(model: nn.Module, frame: types.FrameType) -> str | None:
    """FQN of the module whose method the frame runs (``self`` in its locals), searching outwards."""
    names = {id(m): name for name, m in model.named_modules()}
    current: types.FrameType | None = frame
    while current is not None:
        owner = current.f_locals.get("self")
        if isinstance(owner, nn.Module) and id(owner) in names:
            return names[id(owner)] or "<root>"
        current = current.f_back
    return None


_SHAPES = re.compile(
    r"same reduction dim|cannot be multiplied|size of tensor a|must match the size|shape .* is invalid for input"
    r"|expected input.* to have|mismatch in shape|sizes? of tensors must match"
)


def _fix_for(model: nn.Module, e: BaseException) -> str:
    text = f"{type(e).__name__} {e}".lower()
    if "data-dependent" in text or "guardondatadependent" in text:
        fix = (
            "the forward branches on a tensor's value (data-dependent control flow such as "
            "`if x.sum() > 0:`); express the branch with torch.cond(pred, true_fn, false_fn, operands), "
            "or make it depend on shapes or static configuration only"
        )
    elif "fake impl" in text or "fake kernel" in text or "meta kernel" in text:
        fix = "a custom op has no fake (meta) kernel: register one with @torch.library.register_fake"
    elif _SHAPES.search(text):
        fix = (
            "the example inputs' shapes do not fit the model (a layer got a tensor of the wrong size): pass "
            "inputs of the shapes its forward expects"
        )
    elif "pytree" in text:
        fix = "return tensors, tuples, lists or dicts, or register the output class with torch.utils._pytree"
    else:
        fix = (
            "make the forward traceable: no .item()/.tolist()/Python branching on tensor values; "
            "torch.export.draft_export(model, args) lists every problem"
        )
    config = getattr(model, "config", None)
    if type(model).__module__.startswith("transformers") and getattr(config, "use_cache", False):
        fix += "; for Hugging Face models pass use_cache=False (config.use_cache = False)"
    return fix


def explain_failure(model: nn.Module, export_error: BaseException, trace_error: BaseException) -> str:
    """The CaptureError message: what failed, where in the user's code, and how to fix it."""
    where = ""
    frame = _user_frame(export_error) or _user_frame(trace_error)
    if frame is not None:
        module = _module_of_frame(model, frame[1])
        where = f"\n  where: {frame[0]}" + (f" (module {module})" if module else "")
    return (
        f"could not capture {type(model).__name__}: torch.export failed with "
        f"{type(export_error).__name__}: {first_line(export_error)}{where}\n"
        f"  torch.fx.symbolic_trace failed too: {type(trace_error).__name__}: {first_line(trace_error)}\n"
        f"  fix: {_fix_for(model, export_error)}"
    )
