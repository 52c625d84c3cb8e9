"""Argument types shared by the ``autoshard`` subcommands, and the one-line error helpers."""

from __future__ import annotations

import argparse
import ast
import math
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

from autoshard.errors import AutoshardError

if TYPE_CHECKING:
    from autoshard.cluster import Cluster

__all__ = [
    "PATTERNS",
    "CliError",
    "OneLineParser",
    "amount",
    "annotation",
    "check_memory_limit",
    "count_or_auto",
    "first_clause",
    "flag_words",
    "mesh",
    "one_line",
    "parse_choice",
    "pin_map",
    "positive",
    "profile_help",
    "schedule",
    "sizes",
    "whole_in",
]

PATTERNS = ("column", "row", "vocab", "replicate", "ring")  # ring: context-parallel attention


def profile_help() -> str:
    """``--profile``'s help: every bundled profile by name (the trial's help omitted h100_measured)."""
    from hardware_profiles import bundled_profiles

    return f"bundled profile ({', '.join(bundled_profiles())}) or JSON path"


class CliError(AutoshardError, ValueError):
    """A command-line option that cannot work (a bad value, a missing file or tool)."""


class OneLineParser(argparse.ArgumentParser):
    """Usage errors in one line (what, and where to read more), not argparse's usage block; exit code 2.
    Subparsers are of the same class.  ``examples/train.py`` parses with it too."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}; see `{self.prog} --help`\n")


def mesh(text: str) -> tuple[int, ...] | str:
    """Axis sizes (``2x8``), or ``auto``: search the mesh shape (:mod:`autoshard.meshsearch`)."""
    if text.strip().lower() == "auto":
        return "auto"
    return sizes(text)


def sizes(text: str) -> tuple[int, ...]:
    """Mesh axis sizes: ``2x8`` (or ``2,8``) -> ``(2, 8)``."""
    try:
        axes = tuple(int(p) for p in text.lower().replace(",", "x").split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"mesh {text!r}: write axis sizes like 2x8 or 16") from None
    if not axes or any(s < 1 for s in axes):
        raise argparse.ArgumentTypeError(f"mesh {text!r}: axis sizes must be positive integers, e.g. 2x8")
    return axes


def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def whole_in(low: int, high: int, why: str = "") -> Callable[[str], int]:
    """An argument type: a whole number from ``low`` to ``high``; ``why`` says where the bounds come from."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number ({low} to {high})") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(
                f"{text!r} is outside {low} to {high}{f' ({why})' if why else ''}"
            )
        return value

    return parse


def schedule(text: str) -> str:
    """``auto`` or a schedule the pipeline runs, refused before the model is built."""
    from autoshard.pipeline.schedules import Schedule

    names = ("auto", *(s.value for s in Schedule))
    if text not in names:
        raise argparse.ArgumentTypeError(f"{text!r} is not a schedule; use one of {', '.join(names)}")
    return text


def count_or_auto(text: str) -> int | str:
    """``auto`` or a whole number >= 1 (--pp, --microbatches)."""
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is neither 'auto' nor a whole number >= 1")
    return value


def amount(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number, e.g. 40 or 0.5") from None
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive finite number, e.g. 40 or 0.5")
    return value


def annotation(text: str) -> tuple[str, Any]:
    """``TARGET=CHOICE`` → ``(target, choice)`` in a form ``autoshard.plan(annotations=...)`` accepts."""
    target, sep, choice = (s.strip() for s in text.partition("="))
    if not sep or not target or not choice:
        raise argparse.ArgumentTypeError(f"annotation {text!r}: write TARGET=CHOICE, e.g. fc1=column")
    return target, parse_choice(choice)


def pin_map(pins: list[tuple[str, Any]]) -> dict[str, Any] | None:
    """The ``--annotate`` pins as ``autoshard.plan(annotations=...)`` takes them; one target pinned two ways
    is a contradiction (a dict would keep the last silently)."""
    out: dict[str, Any] = {}
    for target, choice in pins:
        if target in out and out[target] != choice:
            raise CliError(
                f"--annotate {target}={_text(out[target])} and --annotate {target}={_text(choice)} pin "
                f"{target} two ways; keep one (to split a weight on two mesh axes, give its placements once, "
                f"e.g. {target if target.endswith(('weight', 'bias')) else target + '.weight'}='(S(0), S(1))')"
            )
        out[target] = choice
    return out or None


def _text(choice: Any) -> str:
    if isinstance(choice, tuple) and all(isinstance(p, str) for p in choice):
        return f"({', '.join(choice)})" if len(choice) > 1 else choice[0]
    return str(choice)


def parse_choice(choice: str) -> Any:
    """``stage`` (a pipeline cut), a pattern (``column``, ``row@0``), a split tuple (``((2, 1), (1, 4))``) or
    placements (``(R, S(0))``)."""
    name, _, axis = choice.partition("@")
    if choice == "stage":  # a pipeline stage starts at this layer (autoshard.pipeline.options)
        return choice
    if name in PATTERNS:
        if axis and not axis.isdigit():
            raise argparse.ArgumentTypeError(f"{choice!r}: write the axis as a number, e.g. {name}@0")
        return choice
    if choice.replace(" ", "").startswith("(("):
        return _split_tuple(choice)
    from autoshard.errors import ShardingError
    from autoshard.placement import ShardingSpec

    try:
        return ShardingSpec.parse(choice).as_strings()
    except ShardingError as e:
        raise argparse.ArgumentTypeError(
            f"{choice!r} is neither a pattern ({', '.join(PATTERNS)}, optionally @AXIS) nor placements "
            f"like S(0) or '(R, S(1))' ({e})"
        ) from None


def _split_tuple(choice: str) -> tuple[tuple[int, ...], ...]:
    try:
        value = ast.literal_eval(choice)
    except (ValueError, SyntaxError):
        value = None
    ok = isinstance(value, tuple) and all(
        isinstance(t, tuple) and all(isinstance(i, int) and i >= 1 for i in t) for t in value
    )
    if not ok:
        raise argparse.ArgumentTypeError(f"{choice!r}: a split tuple looks like '((2, 1), (1, 4))'")
    return value


def one_line(error: BaseException) -> str:
    return " ".join(str(error).split())


_FLAGS = {"pipeline": "--pp", "microbatches": "--microbatches", "schedule": "--schedule"}
_PYTHON_OPTION = re.compile(r"\b(pipeline|microbatches|schedule)=('[^']*'|\w+|)")


def flag_words(text: str) -> str:
    """An error's Python option names as the command line's flags (new-user trial: ``--pp 3`` was answered
    about ``pipeline=3``): ``pipeline=3`` -> ``--pp 3``, ``microbatches='auto'`` -> ``--microbatches auto``,
    ``pipeline=None`` -> ``no --pp``, a bare ``microbatches=`` -> ``--microbatches``."""

    def flag(match: re.Match[str]) -> str:
        name, value = _FLAGS[match.group(1)], match.group(2).strip("'")
        return f"no {name}" if value == "None" else f"{name} {value}" if value else name

    return _PYTHON_OPTION.sub(flag, text)


def first_clause(error: BaseException) -> str:
    """The message up to its first '; ' or '. ' (the what, without the how-to-fix that follows)."""
    text = one_line(error)
    cut = min((i for i in (text.find("; "), text.find(". ")) if i > 0), default=len(text))
    head = text[:cut]
    return head + ")" * max(0, head.count("(") - head.count(")"))  # a clause cut inside "(...)" is closed


def check_memory_limit(gib: float | None, cluster: Cluster) -> None:
    """A per-device budget above the device's memory, or below a MiB, is a unit mistake, not a budget."""
    if gib is None:
        return
    device = cluster.device_memory / 2**30
    if gib > device:
        raise CliError(
            f"--memory-limit {gib:g} GiB is more than the {device:g} GiB of one {cluster.profile.name} device "
            f"(the limit is per device, in GiB): give at most {device:g}"
        )
    if gib < 2**-10:
        raise CliError(f"--memory-limit {gib:g} GiB is below 1 MiB: the limit is per device, in GiB, e.g. 40")
