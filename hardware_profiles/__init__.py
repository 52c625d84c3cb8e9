"""The hardware profiles bundled with autoshard, one JSON file per node type.

This package holds data only; it exists so the JSON files ship inside the wheel and are found through
``importlib.resources`` wherever the package is installed (a zip included).  The schema is described in
``SCHEMA.md`` beside the files and enforced by :func:`cost_models.profile.load_profile`.

Input: a profile name such as ``"a100x8"`` (a trailing ``.json`` is accepted).
Output: the names of the bundled profiles, or the resource of one of them.

Example::

    >>> "a100x8" in bundled_profiles()
    True
    >>> profile_resource("a100x8.json").name
    'a100x8.json'
"""

from __future__ import annotations

from importlib.resources import files
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

__all__ = ["bundled_profiles", "profile_resource"]

_SUFFIX = ".json"


def bundled_profiles() -> tuple[str, ...]:
    """Names of the bundled profiles (without ``.json``), sorted."""
    return tuple(
        sorted(f.name[: -len(_SUFFIX)] for f in files(__name__).iterdir() if f.name.endswith(_SUFFIX))
    )


def profile_resource(name: str) -> Traversable | None:
    """The bundled file of profile ``name`` (with or without ``.json``), or ``None`` if there is none."""
    stem = name[: -len(_SUFFIX)] if name.endswith(_SUFFIX) else name
    if stem not in bundled_profiles():
        return None
    return files(__name__).joinpath(stem + _SUFFIX)
