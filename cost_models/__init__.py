"""Pure cost functions of (FLOPs or bytes, process group, hardware profile): no torch, no graphs.

* :mod:`cost_models.profile`     — the hardware profile record, its JSON schema and loader
* :mod:`cost_models.compute`     — roofline time of one op on one device
* :mod:`cost_models.collectives` — alpha–beta time of one collective, flat or hierarchical over nodes
* :mod:`cost_models.memory`      — bytes per device of sharded tensors and of ZeRO training state

Every constant lives in a profile field with its source; these modules hold formulas only.  They import
nothing of autoshard except its error types, so the search and its tests can use them without torch.

Example::

    >>> from cost_models import CollectiveGroup, collective_time, compute_time, load_profile
    >>> h100 = load_profile("h100x8")
    >>> in_node, two_nodes = CollectiveGroup(members_per_node=8), CollectiveGroup(members_per_node=8, nodes=2)
    >>> [round(collective_time("all_reduce", 2**30, g, h100) * 1e3, 2) for g in (in_node, two_nodes)]  # ms
    [3.95, 5.38]
    >>> round(compute_time(2 * 8192**3, 3 * 2 * 8192**2, "bfloat16", h100) * 1e3, 2)  # ms, one 8192^3 GEMM
    1.49
"""

from __future__ import annotations

from cost_models.collectives import (
    COLLECTIVE_KINDS,
    LOCAL_KINDS,
    AlphaBeta,
    CollectiveGroup,
    CollectiveKind,
    alpha_beta,
    bus_bandwidth,
    choose_algorithm,
    collective_time,
    collective_times,
)
from cost_models.compute import bound, compute_time, compute_times, ridge_intensity
from cost_models.memory import (
    FP32_ADAM,
    MIXED_PRECISION_ADAM,
    StateBytes,
    StateRecipe,
    itemsize,
    local_shard_bytes,
    sharded_bytes,
    training_state_bytes,
)
from cost_models.profile import HardwareProfile, canonical_dtype, load_profile, parse_profile

__all__ = [
    "COLLECTIVE_KINDS",
    "FP32_ADAM",
    "LOCAL_KINDS",
    "MIXED_PRECISION_ADAM",
    "AlphaBeta",
    "CollectiveGroup",
    "CollectiveKind",
    "HardwareProfile",
    "StateBytes",
    "StateRecipe",
    "alpha_beta",
    "bound",
    "bus_bandwidth",
    "canonical_dtype",
    "choose_algorithm",
    "collective_time",
    "collective_times",
    "compute_time",
    "compute_times",
    "itemsize",
    "load_profile",
    "local_shard_bytes",
    "parse_profile",
    "ridge_intensity",
    "sharded_bytes",
    "training_state_bytes",
]
