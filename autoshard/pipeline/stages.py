"""The stage DP: where to cut the layer sequence into pipeline stages (Alpa's inter-op level, solved exactly).

Input: :class:`StageCosts` — one microbatch's costs of one repeated layer, of the part before the layers
(embedding: ``pre``) and of the part after them (final norm, head, loss: ``post``) on one device of a
stage's sub-mesh, each already the optimum of the intra-op search on that sub-mesh — the schedule, the
degree ``p``, chunks per device ``v``, microbatches ``m``, the per-device memory limit and any pinned cuts.
Output: :class:`StageSplit` — the cut points, per-device times and memory, the step time.  Pure: no torch.

A model of ``L`` identical layers is cut into ``C = p·v`` chunks; chunk ``c`` holds layers ``[l_c, l_{c+1})``
(``l_0 = 0``, ``l_C = L``, every chunk at least one layer), chunk 0 also ``pre`` and chunk ``C − 1`` also
``post`` (so the first and last stages are unequal), and runs on device ``device_of_chunk(c)``.  A chunk's
per-microbatch time is its parts' forward + backward plus one p2p send per neighbour on another device
(activations to the next chunk, gradients to the previous; ZB-V's two chunks on the last device hand over in
memory, :func:`~autoshard.pipeline.schedules.hand_offs`) plus, when it holds a layer, the first FSDP gather no
compute hides; its once-per-step time is its parts' optimizer and exposed gradient synchronisation (the
layers' share from :attr:`StageCosts.sync_exposed` by the layers its device holds, as
:mod:`cost_models.overlap` hides it; the first and last chunk also the all-reduce of a weight tied between them,
:attr:`StageCosts.tied_sync`), and its static memory its parts' sums (plus the runtime reserve once per
device); its activation memory is its parts' per-microbatch activations times the microbatches its device
holds in flight (:func:`~autoshard.pipeline.schedules.in_flight`).  A device also holds, once, what no node
owns (:meth:`StageCosts.held`, as :mod:`autoshard.problem.extras` prices the whole model's peak): the FSDP /
ZeRO-3 weights gathered for the layers it runs (``1 + prefetch`` of them at a time) and for the parts
before / after the layers it holds, the largest temporary of the parts it runs, and one layer's recompute
working set.  So a device's memory is its peak, the figure the budget holds and the report prints.

For ``v = 1`` the step time is ``Σ_d t_d + (m − 1) max_d t_d + max_d o_d`` (``t``: per microbatch, ``o``:
once per step).  ``Σ_d t_d`` is the same for every cut (all layers and ``C − 1`` boundaries are paid once),
so the optimum minimises ``(m − 1) τ + ω`` over the two bottlenecks.  The DP enumerates ``τ`` over the
distinct chunk times in increasing order and, for each, solves the bottleneck recursion

    H[c][l] = min over l' < l of max(H[c − 1][l'], o(c, l', l))   subject to  t(c, l', l) <= τ,
              mem(c, l', l) <= limit, and no pinned cut strictly inside (l', l)
    H[0][0] = 0,  H[0][l > 0] = inf,  ω(τ) = H[C][L]

table ``H`` indexed by chunks placed ``c`` and layers consumed ``l``; one numpy reduction over ``l'`` per
``c``, ``O(C·L²)`` per ``τ``.  It stops once ``(m − 1) τ`` alone exceeds the best objective found (for ``v > 1``,
``(m − 1/v)(τ + (v − 1) t_layer)``: the device of a chunk of time ``τ`` runs ``v − 1`` more chunks), so it
is exact (``tests/pipeline`` checks it against brute force over all cuts).  For ``v > 1`` the same
recursion bounds each *chunk* by ``τ``, and the cuts it returns are priced exactly on their devices (a
device's time is the sum of its ``v`` chunks): exact in the chunk bottleneck, a heuristic in the device's.
Its memory filter lets a chunk take ``1 / v`` of the budget; when no cut passes it, the DP runs again letting a
chunk take what the device's other chunks (a layer each, at the least) leave, so an uneven device (ZB-V's
first: the embedding and the head) is not ruled out; every cut is checked on its devices' sums.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from autoshard.pipeline.schedules import Schedule, chunk_sends, device_of_chunk, in_flight, step_time

__all__ = ["Part", "StageCosts", "StageSplit", "best_split", "price_split"]


@dataclass(frozen=True, slots=True)
class Part:
    """One microbatch's costs of a piece of the model on one device of its stage's sub-mesh."""

    forward: float = 0.0  # seconds per microbatch, compute + intra-op collectives
    backward: float = 0.0  # seconds per microbatch
    once: float = 0.0  # seconds per step: gradient synchronisation and optimizer update
    static: float = 0.0  # bytes: parameters, gradients, optimizer state
    activation: float = 0.0  # bytes kept for backward per microbatch

    def __add__(self, other: Part) -> Part:
        return Part(
            self.forward + other.forward,
            self.backward + other.backward,
            self.once + other.once,
            self.static + other.static,
            self.activation + other.activation,
        )

    def times(self, k: int) -> Part:
        return Part(k * self.forward, k * self.backward, k * self.once, k * self.static, k * self.activation)


@dataclass(frozen=True, slots=True)
class StageCosts:
    """Everything the stage DP needs about a model on one sub-mesh at one microbatch size."""

    layer: Part
    pre: Part
    post: Part
    layers: int  # L, the repeated layers
    p2p_seconds: float  # one send of a layer's output (activations forward or gradients backward)
    reserve: float = 0.0  # bytes every device holds before the model (CUDA context, NCCL, allocator)
    gather_head: float = 0.0  # per microbatch: a chunk's first FSDP gather, which no layer's compute hides
    sync_exposed: tuple[float, ...] = ()  # [k]: exposed gradient sync of k layers on one device, per step
    # the same with the parts outside the layers on that device: (pre, post) -> [k] (their syncs included)
    sync_parts: dict[tuple[bool, bool], tuple[float, ...]] = field(default_factory=dict)
    tied_bytes: float = 0.0  # local gradient bytes of weights read before and after the layers (tied)
    tied_sync: float = 0.0  # per step: their all-reduce between the first and last chunk's devices
    # the communication inside those figures that no compute hides (the report's split, not the DP's input):
    # per microbatch, of one layer / pre / post (gather_head comes on top), and per step of pre / post
    exposed_comm: tuple[float, float, float] = (0.0, 0.0, 0.0)
    exposed_once: tuple[float, float] = (0.0, 0.0)
    # per step, the gradient syncs of one layer / pre / post, hidden or not (the report's stage grad sync)
    sync_seconds: tuple[float, float, float] = (0.0, 0.0, 0.0)
    # bytes a device holds beside its parts' sums (the memory no node owns, problem/extras.py), of one layer /
    # pre / post: FSDP / ZeRO-3 gathered weights (a layer's held ``gather_depth`` layers at a time: 1 +
    # prefetch) and the largest temporary; and one layer's recompute working set (its backward re-runs it)
    gathered: tuple[float, float, float] = (0.0, 0.0, 0.0)
    gather_depth: int = 1
    temporary: tuple[float, float, float] = (0.0, 0.0, 0.0)
    working: float = 0.0

    def exposed_sync(self, layers: int, pre: bool = False, post: bool = False) -> float:
        """Seconds of the gradient sync of ``layers`` layers (and of the part before / after them when the
        device holds it) that their backward does not hide (:func:`autoshard.problem.step.critical_path`)."""
        table = self.sync_parts.get((pre, post), self.sync_exposed)
        return table[layers] if layers < len(table) else 0.0

    def held(self, layers: int, pre: bool = False, post: bool = False) -> tuple[float, float, float]:
        """(gathered weights, largest temporary, working set) in bytes of a device holding ``layers``
        layers and the part before / after them: at most ``gather_depth`` of its layers gathered at a time
        (it gathers no layer it does not hold) beside every gathered weight of the parts it holds, as
        :mod:`autoshard.problem.extras` counts the whole model; the largest temporary of the parts it runs."""
        g_layer, g_pre, g_post = self.gathered
        t_layer, t_pre, t_post = self.temporary
        gathered = min(self.gather_depth, layers) * g_layer + g_pre * pre + g_post * post
        temporary = max(t_layer if layers else 0.0, t_pre if pre else 0.0, t_post if post else 0.0)
        return gathered, temporary, self.working if layers else 0.0


@dataclass(frozen=True, slots=True)
class StageSplit:
    """A priced cut: ``bounds[c]`` is the first layer of chunk ``c`` (``bounds[C] = L``)."""

    bounds: tuple[int, ...]
    schedule: Schedule
    degree: int
    virtual: int
    microbatches: int
    step_seconds: float
    pipeline_seconds: float  # the pipelined part (without the once-per-step tail)
    forward: tuple[float, ...]  # per device, per microbatch
    backward: tuple[float, ...]
    once: tuple[float, ...]  # per device, per step
    memory: tuple[float, ...]  # per device, bytes at its peak: all of the below, reserve and parts' sums
    chunk_seconds: tuple[float, ...]  # per chunk, forward + backward of one microbatch
    gathered: tuple[float, ...] = ()  # per device, bytes of gathered weights (StageCosts.held)
    temporary: tuple[float, ...] = ()  # per device, the largest temporary


def _chunk(
    costs: StageCosts, schedule: Schedule, degree: int, c: int, chunks: int, start: int, end: int
) -> Part:
    part = costs.layer.times(end - start)
    if c == 0:
        part = part + costs.pre
    if c == chunks - 1:
        part = part + costs.post
    sends = chunk_sends(schedule, c, chunks, degree)  # activations on, gradients back; none within a device
    head = costs.gather_head if end > start else 0.0
    return part + Part(forward=costs.p2p_seconds * sends[0] + head, backward=costs.p2p_seconds * sends[1])


def _tied(costs: StageCosts, schedule: Schedule, degree: int, c: int, chunks: int) -> float:
    """The tied weights' gradient all-reduce, once per step on the first and the last chunk's devices when
    they differ (Megatron-LM's embedding group; one device holding both sums its copies locally)."""
    ends = (device_of_chunk(schedule, 0, degree), device_of_chunk(schedule, chunks - 1, degree))
    return costs.tied_sync if c in (0, chunks - 1) and ends[0] != ends[1] else 0.0


def price_split(
    costs: StageCosts,
    bounds: Sequence[int],
    schedule: Schedule,
    degree: int,
    virtual: int,
    microbatches: int,
) -> StageSplit:
    """The step time and per-device memory of one cut (the objective the DP minimises)."""
    chunks = degree * virtual
    assert len(bounds) == chunks + 1 and bounds[0] == 0 and bounds[-1] == costs.layers
    parts = [
        _chunk(costs, schedule, degree, c, chunks, bounds[c], bounds[c + 1])
        + Part(once=_tied(costs, schedule, degree, c, chunks))
        for c in range(chunks)
    ]
    per_device = [Part() for _ in range(degree)]
    for c, part in enumerate(parts):
        d = device_of_chunk(schedule, c, degree)
        per_device[d] = per_device[d] + part
    forward = [p.forward for p in per_device]
    backward = [p.backward for p in per_device]
    pipelined = step_time(schedule, forward, backward, microbatches, virtual)
    held = [0] * degree
    for c in range(chunks):
        held[device_of_chunk(schedule, c, degree)] += bounds[c + 1] - bounds[c]
    first, last = device_of_chunk(schedule, 0, degree), device_of_chunk(schedule, chunks - 1, degree)
    once = [
        p.once + costs.exposed_sync(k, d == first, d == last)
        for d, (p, k) in enumerate(zip(per_device, held, strict=True))
    ]
    extras = [costs.held(k, d == first, d == last) for d, k in enumerate(held)]
    memory = [
        costs.reserve
        + p.static
        + in_flight(schedule, d, degree, virtual, microbatches) * p.activation
        + gathered
        + temporary
        + working
        for d, (p, (gathered, temporary, working)) in enumerate(zip(per_device, extras, strict=True))
    ]
    return StageSplit(
        bounds=tuple(bounds),
        schedule=schedule,
        degree=degree,
        virtual=virtual,
        microbatches=microbatches,
        step_seconds=pipelined + max(once),
        pipeline_seconds=pipelined,
        forward=tuple(forward),
        backward=tuple(backward),
        once=tuple(once),
        memory=tuple(memory),
        chunk_seconds=tuple(p.forward + p.backward for p in parts),
        gathered=tuple(g for g, _, _ in extras),
        temporary=tuple(t for _, t, _ in extras),
    )


def _tables(
    costs: StageCosts,
    schedule: Schedule,
    degree: int,
    virtual: int,
    microbatches: int,
    limit: float,
    loose: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per chunk ``c``: time ``T[c, l', l]``, once ``O[c, l', l]`` and whether it fits ``F[c, l', l]``: within
    ``1 / v`` of the budget, or (``loose``) within what the device's other chunks leave at the least (one layer
    each), which rules out no cut that fits (ZB-V's first device holds the embedding and the head).  A chunk's
    memory counts the terms :meth:`StageCosts.held` gives a device holding just that chunk: no more than its
    device holds (gathers and temporaries of a chunk are among its device's), and on ``v`` chunks together no
    less (the device's are at most the chunks' sum): the ``1 / v`` filter passes no cut that would not fit, the
    loose one rules out none that would; :func:`price_split` checks every cut on its devices."""
    n, chunks = costs.layers, degree * virtual
    k = np.arange(n + 1)[None, :] - np.arange(n + 1)[:, None]  # layers in [l', l)
    valid = k >= 1
    lay = costs.layer
    shape = (chunks, n + 1, n + 1)
    t, o, fits = np.full(shape, np.inf), np.full(shape, np.inf), np.zeros(shape, dtype=bool)
    for c in range(chunks):
        ends = (
            c == 0,
            c == chunks - 1,
        )  # a chunk's own sync tail, by layers (with pre / post when it holds them)
        synced = np.array([costs.exposed_sync(j, *ends) for j in range(n + 1)])
        extra = _chunk(costs, schedule, degree, c, chunks, 0, 0)  # pre / post / p2p of this chunk, no layers
        d = device_of_chunk(schedule, c, degree)
        flight = in_flight(schedule, d, degree, virtual, microbatches)
        time = extra.forward + extra.backward + costs.gather_head + k * (lay.forward + lay.backward)
        memory = extra.static + k * lay.static + flight * (extra.activation + k * lay.activation)
        # the terms held beside the sums by a device holding just this chunk (StageCosts.held)
        layers = np.minimum(costs.gather_depth, np.maximum(k, 0)) * costs.gathered[0]
        _, temporary, working = costs.held(1, *ends)
        memory = memory + layers + costs.held(0, *ends)[0] + temporary + working
        others = (virtual - 1) * (lay.static + flight * lay.activation)  # the device's other chunks, at least
        room = limit - costs.reserve - others if loose else (limit - costs.reserve) / virtual
        ok = valid & (memory <= room)
        t[c] = np.where(valid, time, np.inf)
        tied = _tied(costs, schedule, degree, c, chunks)
        o[c] = np.where(valid, extra.once + tied + k * lay.once + synced[np.clip(k, 0, n)], np.inf)
        fits[c] = ok
    return t, o, fits


def best_split(
    costs: StageCosts,
    schedule: Schedule,
    degree: int,
    virtual: int,
    microbatches: int,
    memory_limit: float = math.inf,
    pinned_cuts: Sequence[int] = (),
) -> StageSplit | None:
    """The cut of least step time that fits ``memory_limit`` (see the module docstring), or None."""
    n, chunks = costs.layers, degree * virtual
    if chunks > n:
        return None
    best = _best_split(costs, schedule, degree, virtual, microbatches, memory_limit, pinned_cuts, False)
    if best is None and virtual > 1 and math.isfinite(memory_limit):  # an uneven device: a chunk over 1/v
        best = _best_split(costs, schedule, degree, virtual, microbatches, memory_limit, pinned_cuts, True)
    return best


def _best_split(
    costs: StageCosts,
    schedule: Schedule,
    degree: int,
    virtual: int,
    microbatches: int,
    memory_limit: float,
    pinned_cuts: Sequence[int],
    loose: bool,
) -> StageSplit | None:
    n, chunks = costs.layers, degree * virtual
    t, o, fits = _tables(costs, schedule, degree, virtual, microbatches, memory_limit, loose)
    lo, hi = np.arange(n + 1)[:, None], np.arange(n + 1)[None, :]
    for cut in pinned_cuts:  # a chunk may end or start at a pinned cut, never straddle it
        fits &= ~((lo < cut) & (cut < hi))[None]
    if pinned_cuts and len(set(pinned_cuts)) != chunks - 1:
        return None  # pins fix every boundary (the planner checks the count before calling)
    weight = microbatches - 1.0 / virtual
    # a split first found at τ has a chunk of time τ, and its device runs v − 1 more chunks of >= one layer
    least = (virtual - 1) * (costs.layer.forward + costs.layer.backward)
    best: StageSplit | None = None
    for tau in np.unique(t[fits]):
        if best is not None and weight * (tau + least) >= best.step_seconds:
            break
        bounds = _bottleneck(o, fits & (t <= tau), n, chunks)
        if bounds is None:
            continue
        split = price_split(costs, bounds, schedule, degree, virtual, microbatches)
        if max(split.memory) > memory_limit:
            continue
        if best is None or split.step_seconds < best.step_seconds:
            best = split
    return best


def _bottleneck(once: np.ndarray, allowed: np.ndarray, n: int, chunks: int) -> list[int] | None:
    """The bounds minimising the largest once-per-step chunk cost among allowed chunks (``H`` above)."""
    h = np.full(n + 1, np.inf)
    h[0] = 0.0
    back = np.zeros((chunks, n + 1), dtype=np.int64)
    for c in range(chunks):
        cand = np.where(allowed[c], np.maximum(h[:, None], once[c]), np.inf)  # (l', l)
        back[c] = np.argmin(cand, axis=0)
        h = cand[back[c], np.arange(n + 1)]
    if not np.isfinite(h[n]):
        return None
    bounds = [n]
    for c in range(chunks - 1, -1, -1):
        bounds.append(int(back[c][bounds[-1]]))
    return bounds[::-1]
