"""Reference execution of redistribution steps on the simulated mesh: the semantics codegen must match.

Input: every device's piece of a tensor laid out as ``src`` (as from :func:`autoshard.local_mesh.distribute`),
the steps of :func:`autoshard.redistribute.plan_redistribute` and the mesh shape.  Output: every device's
piece after the steps.  Each step is checked against the move set (:mod:`autoshard.redistribute_steps`)
before it runs, so steps planned from another source are refused.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from autoshard.errors import ShardingError
from autoshard.local_mesh import Coord, coords
from autoshard.placement import ShardingSpec
from autoshard.redistribute_steps import _P, _R, Step, StepKind, _encode, _Layout, _transition, _with

__all__ = ["apply_steps_local"]


def apply_steps_local(
    pieces: dict[Coord, torch.Tensor], src: ShardingSpec, steps: Iterable[Step], mesh_shape: Sequence[int]
) -> dict[Coord, torch.Tensor]:
    """Execute ``steps`` on every device's piece (as from :func:`autoshard.local_mesh.distribute` of ``src``).

    The reference semantics codegen must match.  Raises :class:`ShardingError` when a step does not apply to
    the layout reached so far (e.g. steps planned from another source spec).
    """
    mesh_shape = tuple(mesh_shape)
    if set(pieces) != set(coords(mesh_shape)):
        raise ShardingError(
            f"pieces must hold one tensor per device of mesh {mesh_shape}, keyed by coordinate"
        )
    some = next(iter(pieces.values()))
    if src.partial_axes() and not some.is_floating_point():
        raise ShardingError(
            f"a {some.dtype} tensor cannot be Partial ({src}): only floating tensors are summed"
        )
    layout, current = _encode(src, mesh_shape), dict(pieces)
    for i, step in enumerate(steps):
        layout = _advance(layout, step, tuple(current[(0,) * len(mesh_shape)].shape), mesh_shape, i)
        if step.kind in ("local_zero", "local_pad") and not some.is_floating_point():
            raise ShardingError(
                f"step {i} ({step}) makes a {some.dtype} tensor Partial: only floats are summed"
            )
        current = _run_step(current, step, mesh_shape)
    return current


_TARGET_OF: dict[StepKind, int | None] = {
    "all_gather": _R,
    "all_reduce": _R,
    "local_zero": _P,
    "local_pad": _P,
}


def _advance(
    layout: _Layout, step: Step, local: tuple[int, ...], mesh_shape: tuple[int, ...], i: int
) -> _Layout:
    target = _TARGET_OF.get(step.kind, step.dst_dim)
    assert target is not None
    axis = step.mesh_axis
    ok = axis < len(layout) and mesh_shape[axis] > 1 and target != layout[axis]
    expected = _transition(layout, axis, target, local, 1, mesh_shape) if ok else None
    if expected is None or expected[:2] != (step.kind, step.src_dim):
        raise ShardingError(f"step {i} ({step}) does not apply to layout {_format_layout(layout)}")
    return _with(layout, axis, target)


def _format_layout(layout: _Layout) -> str:
    return "(" + ", ".join("R" if p == _R else "P" if p == _P else f"S({p})" for p in layout) + ")"


def _run_step(
    current: dict[Coord, torch.Tensor], step: Step, mesh_shape: tuple[int, ...]
) -> dict[Coord, torch.Tensor]:
    axis = step.mesh_axis
    n = mesh_shape[axis]
    out: dict[Coord, torch.Tensor] = {}
    for c in current:
        if c[axis] != 0:
            continue
        group = [(*c[:axis], k, *c[axis + 1 :]) for k in range(n)]
        results = _GROUP_OPS[step.kind]([current[g] for g in group], step, n)
        out.update(zip(group, results, strict=True))
    return out


def _all_gather(ts: list[torch.Tensor], step: Step, n: int) -> list[torch.Tensor]:
    full = torch.cat(ts, dim=_dim(step.src_dim))
    return [full.clone() for _ in ts]


def _local_slice(ts: list[torch.Tensor], step: Step, n: int) -> list[torch.Tensor]:
    return [t.chunk(n, dim=_dim(step.dst_dim))[k].clone() for k, t in enumerate(ts)]


def _all_to_all(ts: list[torch.Tensor], step: Step, n: int) -> list[torch.Tensor]:
    sent = [t.chunk(n, dim=_dim(step.dst_dim)) for t in ts]  # sent[m][k]: from member m to member k
    return [torch.cat([sent[m][k] for m in range(n)], dim=_dim(step.src_dim)) for k in range(n)]


def _all_reduce(ts: list[torch.Tensor], step: Step, n: int) -> list[torch.Tensor]:
    total = torch.stack(ts).sum(dim=0)
    return [total.clone() for _ in ts]


def _reduce_scatter(ts: list[torch.Tensor], step: Step, n: int) -> list[torch.Tensor]:
    total = torch.stack(ts).sum(dim=0)
    return [chunk.clone() for chunk in total.chunk(n, dim=_dim(step.dst_dim))]


def _local_zero(ts: list[torch.Tensor], step: Step, n: int) -> list[torch.Tensor]:
    return [ts[0].clone()] + [torch.zeros_like(t) for t in ts[1:]]


def _local_pad(ts: list[torch.Tensor], step: Step, n: int) -> list[torch.Tensor]:
    d = _dim(step.src_dim)
    padded = []
    for k, t in enumerate(ts):
        shape = list(t.shape)
        shape[d] *= n
        z = t.new_zeros(shape)
        z.narrow(d, k * t.shape[d], t.shape[d]).copy_(t)
        padded.append(z)
    return padded


def _dim(d: int | None) -> int:
    assert d is not None, "Step.__post_init__ guarantees the dims its kind needs"
    return d


_GROUP_OPS = {
    "all_gather": _all_gather,
    "local_slice": _local_slice,
    "all_to_all": _all_to_all,
    "all_reduce": _all_reduce,
    "reduce_scatter": _reduce_scatter,
    "local_zero": _local_zero,
    "local_pad": _local_pad,
}
