"""Verify's count of context parallelism's K/V hops: what every gloo rank sent in one step against the plan.

Input: the plan a verify run executed and, per rank, the :class:`~autoshard.codegen.collectives.RingHop`
records its emitted modules logged (``MeshComm.hops``: one per hop the ring sent, with the bytes handed to
gloo's ``isend``).  Output: the hops per device and step by ``"phase bytes on axis a"``, for the report, or
:class:`~autoshard.errors.VerifyError` in one line when some rank's count differs from
``Plan.ring_transfers`` (:mod:`autoshard.problem.ring_hops`): the plan's listing, the price of the hops
and what the ring runs must be one story; a plan file edited by hand, or emission sending other bytes than
the pricing assumed (the grouped-query K/V copies, :func:`autoshard.problem.attention.kv_stride`), fails here.

Under the amp recipe the plan prices the hops in autocast's 16-bit dtype (``RingTransfer.itemsize``), which
verify, running the model in its own dtype without autocast, does not send: for such a plan the hops are
counted by the elements they carry (``RingHop.elements``; the label shows them as the plan's bytes), every
other plan by bytes.

Per rank for :func:`autoshard.verify` (every rank of a ring sends the same hops; the whole batch at once);
for a pipelined plan run as deployed (:mod:`autoshard.runtime.verify_pipeline`) every rank runs only its
stage's layers, microbatch by microbatch, so the sum over all ranks is compared with the plan's hops
(listed per device of one ring, for the whole model) times the ranks of one stage.

Example::

    ran = check_ring_hops(plan, [hops_of_rank_0, hops_of_rank_1])   # {"forward 8.0 KiB on axis 0": 2, ...}
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from autoshard.codegen.collectives import RingHop
from autoshard.errors import VerifyError
from autoshard.plans import Plan
from autoshard.report.labels import fmt_bytes
from cost_models.memory import RECIPES

__all__ = ["check_ring_hops", "check_staged_ring_hops"]

_Key = tuple[str, int, int]  # (phase, mesh axis, bytes per hop)


def check_ring_hops(plan: Plan, per_rank: Sequence[Sequence[RingHop]]) -> dict[str, int]:
    """Each rank's hops of one step against ``plan.ring_transfers`` (module doc); the hops per device.

    The ranks run the whole batch at once: a plan of ``m`` microbatches (its pipeline run as one stage) lists
    ``m`` times the hops of ``1 / m`` of the bytes."""
    m, size = max(1, plan.microbatches), _elements_of(plan)
    planned = Counter({(p, a, b * m): n // m for (p, a, b), n in _planned(plan).items()})
    for rank, hops in enumerate(per_rank):
        ran = Counter((h.phase, h.mesh_axis, _sent(h, size)) for h in hops)
        if ran != planned:
            raise VerifyError(f"verify: rank {rank} {_difference(ran, planned)}")
    return _labels(planned)


def check_staged_ring_hops(
    plan: Plan, per_rank: Sequence[Sequence[RingHop]], stage_ranks: int
) -> dict[str, int]:
    """A pipelined plan's hops: the sum over every rank against ``plan.ring_transfers`` times ``stage_ranks``,
    by phase and bytes (a stage's modules number the mesh axes without the pipeline's)."""
    planned = Counter({(p, -1, b): n * stage_ranks for (p, _, b), n in _planned(plan).items()})
    size = _elements_of(plan)
    ran = Counter((h.phase, -1, _sent(h, size)) for hops in per_rank for h in hops)
    if ran != planned:
        raise VerifyError(
            f"verify: the ranks together {_difference(ran, planned)} ({stage_ranks} ranks per stage)"
        )
    return _labels(Counter({(p, -1, b): n // stage_ranks for (p, _, b), n in planned.items()}))


def _elements_of(plan: Plan) -> int:
    """The plan's bytes per element when its hops are counted by elements (module doc), else 0."""
    policy, sizes = RECIPES.get(plan.precision), {r.itemsize for r in plan.ring_transfers}
    autocast = policy is not None and policy.autocast is not None  # a recipe verify does not run
    return sizes.pop() if autocast and len(sizes) == 1 and 0 not in sizes else 0


def _sent(hop: RingHop, size: int) -> int:
    """A hop's bytes, or, counted by elements (``size`` bytes per element as planned), its elements' bytes
    in the plan's dtype."""
    return hop.elements * size if size else hop.nbytes


def _planned(plan: Plan) -> Counter[_Key]:
    out: Counter[_Key] = Counter()
    for r in plan.ring_transfers:
        out[(r.phase, r.mesh_axis, r.nbytes)] += r.hops
    return out


def _label(key: _Key) -> str:
    phase, axis, nbytes = key
    return f"{phase} {fmt_bytes(nbytes)}" + (f" on axis {axis}" if axis >= 0 else "")


def _labels(counts: Counter[_Key]) -> dict[str, int]:
    return {_label(k): n for k, n in sorted(counts.items())}


def _difference(ran: Counter[_Key], planned: Counter[_Key]) -> str:
    """One clause: the first (phase, axis, bytes) whose count differs, and how to fix it."""
    key = min(k for k in ran.keys() | planned.keys() if ran[k] != planned[k])
    return (
        f"sent {ran[key]} ring K/V hops of {_label(key)} in one step where the plan lists {planned[key]} "
        f"(Plan.ring_transfers; all sent: {_summary(ran)}; listed: {_summary(planned)}): a plan edited by hand "
        "or made by another autoshard version lists other hops than its decisions run; re-plan it"
    )


def _summary(counts: Counter[_Key]) -> str:
    return ", ".join(f"{n} x {_label(k)}" for k, n in sorted(counts.items())) or "none"
