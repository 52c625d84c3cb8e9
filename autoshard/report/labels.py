"""Read the plan's one-line notation back, and print figures in one house style.

A plan stores every strategy as the string the rest of autoshard prints (``"(S(0), R), R -> S(0)"``): inputs
left of the arrow, outputs right of it, ``-`` for a non-tensor operand, one placement per mesh axis (a bare
placement on a 1-D mesh, a parenthesised tuple on an N-D one).  The report and the DOT writer need the
per-axis placements of single operands; :func:`parse_label` recovers them without re-deriving anything.

Example::

    >>> parse_label("(S(0), R), - -> (S(0), S(1))")
    OpLabel(inputs=(('S(0)', 'R'), None), outputs=(('S(0)', 'S(1)'),))
    >>> fmt_bytes(3 * 2**20), fmt_seconds(0.0042)
    ('3.0 MiB', '4.20 ms')
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass

__all__ = [
    "OpLabel",
    "Spec",
    "axes_text",
    "fmt_bytes",
    "fmt_seconds",
    "parse_label",
    "shard_dim",
    "spec_text",
    "wrap",
]

Spec = tuple[str, ...]
"""One placement string per mesh axis, outermost first: ``("S(0)", "R")``."""

_SHARD = re.compile(r"^S\((-?\d+)\)$")


@dataclass(frozen=True, slots=True)
class OpLabel:
    """The per-axis placements of an op's operands and results (``None``: not a tensor)."""

    inputs: tuple[Spec | None, ...]
    outputs: tuple[Spec | None, ...]

    def input(self, index: int) -> Spec | None:
        """The spec of input ``index``, or ``None`` when the op has no such tensor input."""
        return self.inputs[index] if 0 <= index < len(self.inputs) else None

    @property
    def output(self) -> Spec | None:
        """The first output's spec."""
        return self.outputs[0] if self.outputs else None


def parse_label(text: str) -> OpLabel:
    """Split ``"ins -> outs"`` into per-operand specs; tolerant of any spacing."""
    left, arrow, right = text.partition("->")
    if not arrow:
        return OpLabel((), tuple(_items(left)))
    return OpLabel(tuple(_items(left)), tuple(_items(right)))


def _items(text: str) -> list[Spec | None]:
    """Top-level comma-separated items of one side of a label."""
    return [_spec(item.strip()) for item in _split_top(text) if item.strip()]


def _spec(item: str) -> Spec | None:
    if item == "-":
        return None
    if item.startswith("("):  # an N-D spec: "(S(0), R)"
        return tuple(p.strip() for p in _split_top(item[1:-1]) if p.strip())
    return (item,)


def _split_top(text: str) -> list[str]:
    """Split at commas outside parentheses."""
    parts: list[str] = []
    depth, start = 0, 0
    for i, ch in enumerate(text + ","):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return parts


def shard_dim(placement: str) -> int | None:
    """``"S(2)"`` → 2; anything else (``R``, ``P``) → ``None``."""
    m = _SHARD.match(placement.strip())
    return int(m.group(1)) if m else None


def spec_text(spec: Spec | None) -> str:
    """The notation of one spec: ``S(0)`` on a 1-D mesh, ``(S(0), R)`` on an N-D one, ``-`` for none."""
    if spec is None:
        return "-"
    return spec[0] if len(spec) == 1 else "(" + ", ".join(spec) + ")"


def axes_text(axes: list[int] | tuple[int, ...]) -> str:
    """``[1]`` → ``axis 1``; ``[0, 1]`` → ``axes 0, 1``."""
    ordered = sorted(set(axes))
    if len(ordered) == 1:
        return f"axis {ordered[0]}"
    return "axes " + ", ".join(str(a) for a in ordered)


def fmt_bytes(n: float) -> str:
    """Binary units, one decimal: ``1.5 GiB``; whole bytes below 1 KiB."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def fmt_seconds(s: float) -> str:
    """``1.234 s``, ``12.30 ms`` or ``45.0 us``."""
    if s >= 1:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.1f} us"


def wrap(text: str, width: int, indent: str, first: str | None = None) -> list[str]:
    """``text`` wrapped to ``width``; continuation lines start with ``indent``, the first with ``first``."""
    start = indent if first is None else first
    return textwrap.wrap(text, width, initial_indent=start, subsequent_indent=indent) or [start]
