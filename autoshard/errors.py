"""The exceptions autoshard raises on bad input.

Every error a user can cause derives from :class:`AutoshardError`, so one ``except`` clause catches them all.
Messages follow one shape: *what* is wrong, *where* (file and field, module path, graph node), and *how to fix it*.
Internal invariants use ``assert``; they are bugs, not user errors.
"""

from __future__ import annotations

__all__ = [
    "AnnotationError",
    "AutoshardError",
    "CaptureError",
    "InfeasibleError",
    "MeshError",
    "PipelineError",
    "PlanFileError",
    "ProfileError",
    "ShardingError",
    "UnsupportedOpError",
    "VerifyError",
]


class AutoshardError(Exception):
    """Base class of every error autoshard raises because of its input."""


class ProfileError(AutoshardError, ValueError):
    """A hardware profile is missing, unreadable or fails schema validation."""


class MeshError(AutoshardError, ValueError):
    """A device mesh does not fit the cluster (wrong product, non-positive axis, bad axis index)."""


class CaptureError(AutoshardError, RuntimeError):
    """A model could not be captured into a graph."""


class ShardingError(AutoshardError, ValueError):
    """A placement, sharding spec or strategy tuple is malformed or does not fit the tensor it describes."""


class UnsupportedOpError(AutoshardError, NotImplementedError):
    """An operator has no sharding rule where one is required."""


class AnnotationError(AutoshardError, ValueError):
    """A user annotation names nothing in the model, or two annotations conflict."""


class InfeasibleError(AutoshardError, RuntimeError):
    """No plan satisfies the constraints (for example the per-device memory budget)."""


class PlanFileError(AutoshardError, ValueError):
    """A saved plan file is unreadable, of an unknown version, or malformed."""


class PipelineError(AutoshardError, ValueError):
    """A pipeline pin does not fit: stages, microbatches, schedule or a stage cut."""


class VerifyError(AutoshardError, RuntimeError):
    """A verify run sent other traffic than the plan it checks lists (ring hops against ``ring_transfers``)."""
