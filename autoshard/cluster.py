"""A cluster: a hardware profile repeated over nodes, and the device mesh laid over it.

Input: a profile (bundled name such as ``"a100x8"`` or ``"a100x8.json"``, a JSON path, or a loaded
:class:`~cost_models.profile.HardwareProfile`), the number of nodes, and the mesh's axis sizes.
Output: a :class:`Cluster`, an immutable, hashable record the planner keys its caches on, which prices
collectives on a mesh axis and ops on a device.

Layout.  Ranks are the row-major index over the mesh (last axis fastest) and rank r sits on node
r // devices_per_node.  Axes are therefore laid outermost-first over nodes: with ``mesh=(4, 8)`` on 4 nodes
of 8, axis 0 crosses nodes and axis 1 stays inside one.  The process group of axis a is the set of ranks that
differ only in coordinate a (stride = product of the later axis sizes); its topology, k members on each of
m nodes, is what :mod:`cost_models.collectives` prices.  Every group of an axis must have that same shape:
``mesh=(16, 4)`` on 8 nodes of 8 gives axis 0 two members on each of 8 nodes, while ``mesh=(4, 6)`` on
3 nodes of 8 is refused, since its axis-1 groups straddle node boundaries unevenly.

Example::

    >>> c = load_cluster("a100x8", nodes=4, mesh=(4, 8))
    >>> c.num_devices, c.axis_crosses_nodes(0), c.axis_crosses_nodes(1)
    (32, True, False)
    >>> c.collective_time("all_reduce", 2**30, axis=0) > c.collective_time("all_reduce", 2**30, axis=1)
    True
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from autoshard.errors import MeshError
from cost_models.collectives import CollectiveGroup
from cost_models.collectives import collective_time as _collective_time
from cost_models.compute import compute_time as _compute_time
from cost_models.profile import HardwareProfile, load_profile

__all__ = ["Cluster", "load_cluster"]


@dataclass(frozen=True, slots=True, repr=False)
class Cluster:
    """``nodes`` copies of ``profile``'s node with a device mesh of ``mesh_shape`` over all their devices.

    Attributes:
        profile: the node's hardware profile.
        nodes: number of nodes (>= 1).
        mesh_shape: axis sizes, outermost first; their product is the number of devices.
            Empty means one axis over all devices.
        axis_names: one short name per axis; empty means ``("axis0", "axis1", ...)``.
    """

    profile: HardwareProfile
    nodes: int = 1
    mesh_shape: tuple[int, ...] = ()
    axis_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _check_nodes(self.nodes)
        total = self.nodes * self.profile.devices_per_node
        shape = tuple(self.mesh_shape) or (total,)
        _check_mesh(shape, self.nodes, self.profile.devices_per_node)
        names = tuple(self.axis_names) or tuple(f"axis{i}" for i in range(len(shape)))
        _check_axis_names(names, shape)
        object.__setattr__(self, "mesh_shape", shape)
        object.__setattr__(self, "axis_names", names)
        _axis_groups(shape, self.profile.devices_per_node)  # refuses uneven layouts now, not at first use

    @property
    def num_devices(self) -> int:
        """Devices in the cluster (= product of the mesh's axis sizes)."""
        return self.nodes * self.profile.devices_per_node

    @property
    def devices_per_node(self) -> int:
        return self.profile.devices_per_node

    @property
    def device_memory(self) -> int:
        """Bytes of device memory (HBM) per device."""
        return self.profile.memory.capacity

    def axis_index(self, axis: int | str) -> int:
        """The index of ``axis`` given by index or by name; :class:`MeshError` if there is no such axis."""
        if isinstance(axis, str):
            if axis in self.axis_names:
                return self.axis_names.index(axis)
            raise MeshError(
                f"mesh {self.mesh_shape} has no axis named {axis!r}; its axes are {self.axis_names}"
            )
        if isinstance(axis, bool) or not isinstance(axis, int) or not 0 <= axis < len(self.mesh_shape):
            raise MeshError(
                f"mesh {self.mesh_shape} has no axis {axis!r}: use an index 0..{len(self.mesh_shape) - 1} "
                f"or a name in {self.axis_names}"
            )
        return axis

    def axis_group(self, axis: int | str = 0) -> CollectiveGroup:
        """The topology (members per node × nodes) of every process group of ``axis``."""
        return _axis_groups(self.mesh_shape, self.devices_per_node)[self.axis_index(axis)]

    def axis_crosses_nodes(self, axis: int | str) -> bool:
        """Whether collectives on ``axis`` go over the network."""
        return self.axis_group(axis).crosses_nodes

    def collective_time(self, kind: str, nbytes: float, axis: int | str = 0) -> float:
        """Seconds of collective ``kind`` on ``axis``; ``nbytes`` is S, the unsharded buffer (nccl-tests)."""
        return _collective_time(kind, nbytes, self.axis_group(axis), self.profile)

    def compute_time(self, flops: float, bytes_moved: float, dtype: object) -> float:
        """Roofline seconds of one op on one device (see :mod:`cost_models.compute`)."""
        return _compute_time(flops, bytes_moved, dtype, self.profile)

    def describe(self) -> str:
        """Two lines for reports: the hardware, then the mesh and which axes cross nodes."""
        p = self.profile
        net = p.inter_node.nics_per_node * p.inter_node.nic_bandwidth / 1e9
        hardware = (
            f"{self.nodes} x {p.name} = {self.num_devices} x {p.device} "
            f"({self.device_memory / 2**30:.0f} GiB each); "
            f"in node {p.intra_node.bus_bandwidth.all_reduce / 1e9:.3g} GB/s all-reduce busbw, "
            f"between nodes {net:.3g} GB/s per node"
        )
        axes = ", ".join(
            f"{name}={size} ({self._axis_where(i)})"
            for i, (name, size) in enumerate(zip(self.axis_names, self.mesh_shape, strict=True))
        )
        return f"{hardware}\nmesh {self.mesh_shape}: {axes}"

    def _axis_where(self, axis: int) -> str:
        g = self.axis_group(axis)
        if not g.crosses_nodes:
            return "in node"
        return f"across {g.nodes} nodes, {g.members_per_node}/node"

    def __repr__(self) -> str:
        mesh = f"mesh={self.mesh_shape}, axis_names={self.axis_names}"
        return f"Cluster({self.profile.name} x {self.nodes}, {mesh})"


def load_cluster(
    profile: str | os.PathLike[str] | HardwareProfile,
    *,
    nodes: int = 1,
    mesh: Sequence[int] | None = None,
    axis_names: Sequence[str] | None = None,
) -> Cluster:
    """A :class:`Cluster` of ``nodes`` nodes of ``profile`` with mesh ``mesh`` (default: one axis).

    ``profile`` is a bundled name (``"a100x8"`` or ``"a100x8.json"``), a path to a profile JSON file, or a
    loaded profile.  Raises :class:`~autoshard.errors.ProfileError` for a bad profile and
    :class:`~autoshard.errors.MeshError` for a mesh that does not fit ``nodes`` × devices per node.
    """
    record = profile if isinstance(profile, HardwareProfile) else load_profile(profile)
    return Cluster(
        record,
        nodes,
        tuple(mesh) if mesh is not None else (),
        tuple(axis_names) if axis_names is not None else (),
    )


def _check_nodes(nodes: object) -> None:
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
        raise MeshError(f"nodes must be a whole number >= 1, got {nodes!r}")


def _check_mesh(shape: tuple[int, ...], nodes: int, per_node: int) -> None:
    for i, size in enumerate(shape):
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise MeshError(
                f"mesh {shape}: axis {i} has size {size!r}; axis sizes must be whole numbers >= 1"
            )
    total = nodes * per_node
    if math.prod(shape) != total:
        examples = f"({total},)" + (f" or ({nodes}, {per_node})" if nodes > 1 else "")
        raise MeshError(
            f"mesh {shape} has {math.prod(shape)} devices but {nodes} node{'s' * (nodes > 1)} x {per_node} = "
            f"{total}: use a mesh whose sizes multiply to {total}, e.g. {examples}"
        )


def _check_axis_names(names: tuple[str, ...], shape: tuple[int, ...]) -> None:
    if len(names) != len(shape):
        raise MeshError(
            f"mesh {shape} has {len(shape)} axes but {len(names)} axis names {names}: give one per axis"
        )
    if any(not isinstance(n, str) or not n for n in names) or len(set(names)) != len(names):
        raise MeshError(f"axis names {names} must be distinct non-empty strings")


@lru_cache(maxsize=256)
def _axis_groups(shape: tuple[int, ...], per_node: int) -> tuple[CollectiveGroup, ...]:
    """The group topology of each axis; :class:`MeshError` if an axis's groups are not all alike."""
    total = math.prod(shape)
    groups = []
    for axis, size in enumerate(shape):
        stride = math.prod(shape[axis + 1 :])
        seen: set[tuple[int, int]] = set()
        for base in range(total):
            if (base // stride) % size:
                continue  # not the first member of its group
            members = [base + i * stride for i in range(size)]
            per = Counter(r // per_node for r in members)
            seen.add((min(per.values()), max(per.values())))
            if len(seen) > 1 or min(per.values()) != max(per.values()):
                raise MeshError(_uneven_message(shape, per_node, axis, members, per))
        ((k, _),) = seen
        groups.append(CollectiveGroup(members_per_node=k, nodes=size // k))
    return tuple(groups)


def _uneven_message(
    shape: tuple[int, ...], per_node: int, axis: int, members: list[int], per: Counter[int]
) -> str:
    layout = ", ".join(f"{count} on node {node}" for node, count in sorted(per.items()))
    return (
        f"mesh {shape} on nodes of {per_node}: the process groups of axis {axis} (size {shape[axis]}) "
        f"straddle node boundaries unevenly (ranks {members[0]}..{members[-1]}: {layout}); choose axis sizes "
        f"such that, for every axis, the product of the sizes after it and that product times the axis size "
        f"each divide {per_node} or are multiples of it (powers of two always work)"
    )
