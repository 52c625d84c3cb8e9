"""Time of one collective on one process group: alpha–beta models over the profile's links.

Input: the collective ``kind``, ``nbytes`` = S of the nccl-tests convention (the full, unsharded buffer for
all_reduce, all_gather and reduce_scatter; each rank's buffer for all_to_all), a :class:`CollectiveGroup`
(k members on each of m nodes) and a :class:`~cost_models.profile.HardwareProfile`.
Output: seconds.  Local steps (``local_slice``, ``local_zero``, ``local_pad``) and groups of one cost 0.

Every algorithm is linear in S: ``t = latency + seconds_per_byte · S`` (an :class:`AlphaBeta`).  With
f = 2(n−1)/n for all_reduce and (n−1)/n otherwise, steps = 2(n−1) for all_reduce and n−1 otherwise:

* inside one node (m = 1), ring: ``steps·α_intra + f·S / busbw(kind)``, busbw measured by nccl-tests.
* across nodes, each device drives its share of the node's NICs: ``B_net = NICs · NIC bw · η / devices``.
  Two candidates; the cheaper wins (NCCL's tuner chooses among algorithms per size in the same way):

  - ring over all n ranks: ``f·S / min(busbw(kind), k·B_net)``; latency: NCCL's model, inter-node steps
    (2(m−1) or m−1) at α_inter and the rest at α_intra.
  - hierarchical (REFERENCE.md): all_reduce = reduce-scatter inside the node, all-reduce of S/k across
    nodes, all-gather inside: ``(k−1)/k·S/busbw_rs + 2(m−1)/m·(S/k)/B_net + (k−1)/k·S/busbw_ag``
    + ``2(k−1)·α_intra + 2(m−1)·α_inter``; all_gather and reduce_scatter keep their half of it.
    It moves less over the network but runs its phases one after another; it wins on small messages
    (fewer inter-node steps) and for large m.

* all_to_all across nodes: each rank sends (k−1)/n·S to its node and (n−k)/n·S off it, concurrently:
  ``max((k−1)/n·S / busbw_a2a, (n−k)/n·S / B_net) + (k−1)·α_intra + (n−k)·α_inter``.

Relations this keeps (tested): all_reduce volume = reduce_scatter + all_gather; a group that crosses nodes
pays the network; no collective is cheaper than its volume over its slowest link.

Example::

    >>> from cost_models.profile import load_profile
    >>> a100 = load_profile("a100x8")
    >>> t = collective_time("all_reduce", 2**30, CollectiveGroup(members_per_node=8), a100)
    >>> round(bus_bandwidth("all_reduce", 2**30, CollectiveGroup(8), a100) / 1e9)
    230
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Literal, get_args

import numpy as np
from numpy.typing import ArrayLike, NDArray

from cost_models.profile import HardwareProfile

__all__ = [
    "COLLECTIVE_KINDS",
    "LOCAL_KINDS",
    "Algorithm",
    "AlphaBeta",
    "CollectiveGroup",
    "CollectiveKind",
    "alpha_beta",
    "bus_bandwidth",
    "choose_algorithm",
    "collective_time",
    "collective_times",
]

CollectiveKind = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all"]
COLLECTIVE_KINDS: tuple[str, ...] = get_args(CollectiveKind)
LOCAL_KINDS: frozenset[str] = frozenset({"local_slice", "local_zero", "local_pad"})
Algorithm = Literal["local", "ring", "hierarchical", "pairwise"]


@dataclass(frozen=True, slots=True)
class CollectiveGroup:
    """The topology of one process group: ``members_per_node`` ranks on each of ``nodes`` nodes."""

    members_per_node: int
    nodes: int = 1

    def __post_init__(self) -> None:
        for name in ("members_per_node", "nodes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"CollectiveGroup.{name} must be a whole number >= 1, got {value!r}")

    @property
    def size(self) -> int:
        """Ranks in the group."""
        return self.members_per_node * self.nodes

    @property
    def crosses_nodes(self) -> bool:
        """Whether the group's traffic goes over the network."""
        return self.nodes > 1

    def __str__(self) -> str:
        return f"{self.size} ranks ({self.members_per_node}/node x {self.nodes} node{'s' * (self.nodes > 1)})"


@dataclass(frozen=True, slots=True)
class AlphaBeta:
    """One algorithm's cost line: ``latency + seconds_per_byte · S``."""

    algorithm: Algorithm
    latency: float
    seconds_per_byte: float

    def time(self, nbytes: float) -> float:
        """Seconds for a buffer of ``nbytes`` (S)."""
        return self.latency + self.seconds_per_byte * nbytes


def collective_time(kind: str, nbytes: float, group: CollectiveGroup, profile: HardwareProfile) -> float:
    """Seconds of collective ``kind`` over ``group`` with buffer S = ``nbytes`` (module docstring)."""
    return choose_algorithm(kind, nbytes, group, profile).time(nbytes)


def collective_times(
    kind: str, nbytes: ArrayLike, group: CollectiveGroup, profile: HardwareProfile
) -> NDArray[np.float64]:
    """Vectorised :func:`collective_time` over an array of buffer sizes."""
    s = np.asarray(nbytes, dtype=np.float64)
    if np.any(s < 0):
        raise ValueError("collective_times needs nbytes >= 0")
    lines = alpha_beta(kind, group, profile)
    return np.min(np.stack([ab.latency + ab.seconds_per_byte * s for ab in lines]), axis=0)


def choose_algorithm(kind: str, nbytes: float, group: CollectiveGroup, profile: HardwareProfile) -> AlphaBeta:
    """The cheapest candidate algorithm for this buffer size (ties: the first listed, ring)."""
    if nbytes < 0:
        raise ValueError(f"{kind} needs nbytes >= 0, got {nbytes}")
    return min(alpha_beta(kind, group, profile), key=lambda ab: ab.time(nbytes))


def bus_bandwidth(kind: str, nbytes: float, group: CollectiveGroup, profile: HardwareProfile) -> float:
    """The nccl-tests bus bandwidth the model implies: ``f(kind, n) · S / t`` in bytes/s (inf if t = 0)."""
    t = collective_time(kind, nbytes, group, profile)
    return _volume_factor(kind, group.size) * nbytes / t if t > 0 else float("inf")


@lru_cache(maxsize=4096)
def alpha_beta(kind: str, group: CollectiveGroup, profile: HardwareProfile) -> tuple[AlphaBeta, ...]:
    """The candidate algorithms for ``kind`` on ``group``, ring first."""
    if kind in LOCAL_KINDS or (kind in COLLECTIVE_KINDS and group.size == 1):
        return (AlphaBeta("local", 0.0, 0.0),)
    if kind not in COLLECTIVE_KINDS:
        raise ValueError(
            f"unknown collective kind {kind!r}: expected one of {[*COLLECTIVE_KINDS, *LOCAL_KINDS]}"
        )
    if kind == "all_to_all":
        return (_launched(_pairwise_all_to_all(group, profile), 1, profile),)
    if not group.crosses_nodes:
        return (_launched(_ring_in_node(kind, group.size, profile), 1, profile),)
    ring = _launched(_ring_across_nodes(kind, group, profile), 1, profile)
    if group.members_per_node == 1:  # nothing to do inside a node: hierarchical is the ring
        return (ring,)
    phases = 3 if kind == "all_reduce" else 2
    return (ring, _launched(_hierarchical(kind, group, profile), phases, profile))


def _launched(ab: AlphaBeta, launches: int, profile: HardwareProfile) -> AlphaBeta:
    """Every collective is at least one kernel launch: a fixed cost on top of the link latency.

    The host launches each collective like any kernel (the profile's launch floor), so one all-reduce costs
    less than the reduce-scatter + all-gather pair that moves the same volume; without it the two tie and
    the planner would pick between data parallel and FSDP by accident.
    """
    return AlphaBeta(ab.algorithm, ab.latency + launches * profile.compute.launch_floor, ab.seconds_per_byte)


def _volume_factor(kind: str, n: int) -> float:
    return (2.0 if kind == "all_reduce" else 1.0) * (n - 1) / n


def _steps(kind: str, n: int) -> int:
    return (2 if kind == "all_reduce" else 1) * (n - 1)


def _net_bandwidth(profile: HardwareProfile) -> float:
    return profile.inter_node.bandwidth_per_device(profile.devices_per_node)


def _ring_in_node(kind: str, n: int, profile: HardwareProfile) -> AlphaBeta:
    link = profile.intra_node
    return AlphaBeta(
        "ring", _steps(kind, n) * link.step_latency, _volume_factor(kind, n) / link.bus_bandwidth.of(kind)
    )


def _ring_across_nodes(kind: str, group: CollectiveGroup, profile: HardwareProfile) -> AlphaBeta:
    k, m, n = group.members_per_node, group.nodes, group.size
    network = k * _net_bandwidth(profile)  # the k members' share of their node's NICs
    slowest = network if k == 1 else min(profile.intra_node.bus_bandwidth.of(kind), network)
    inter_steps = _steps(kind, m)
    latency = (_steps(kind, n) - inter_steps) * profile.intra_node.step_latency
    latency += inter_steps * profile.inter_node.step_latency
    return AlphaBeta("ring", latency, _volume_factor(kind, n) / slowest)


def _hierarchical(kind: str, group: CollectiveGroup, profile: HardwareProfile) -> AlphaBeta:
    k, m = group.members_per_node, group.nodes
    bus = profile.intra_node.bus_bandwidth
    inside = {"reduce_scatter": (k - 1) / k / bus.reduce_scatter, "all_gather": (k - 1) / k / bus.all_gather}
    # The inter-node phase runs the same collective on S/k among the m peers of equal local rank.
    across = _volume_factor(kind, m) / k / _net_bandwidth(profile)
    phases = ("reduce_scatter", "all_gather") if kind == "all_reduce" else (kind,)
    seconds_per_byte = across + sum(inside[p] for p in phases)
    latency = len(phases) * (
        (k - 1) * profile.intra_node.step_latency + (m - 1) * profile.inter_node.step_latency
    )
    return AlphaBeta("hierarchical", latency, seconds_per_byte)


def _pairwise_all_to_all(group: CollectiveGroup, profile: HardwareProfile) -> AlphaBeta:
    k, n = group.members_per_node, group.size
    local = (k - 1) / n / profile.intra_node.bus_bandwidth.all_to_all
    remote = (n - k) / n / _net_bandwidth(profile)
    latency = (k - 1) * profile.intra_node.step_latency + (n - k) * profile.inter_node.step_latency
    return AlphaBeta("pairwise", latency, max(local, remote))
