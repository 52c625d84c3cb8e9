"""The causal-mask proof's compact evaluation (positions expanded over the batch held once) gives the values of
full evaluation, node for node, and still checks masks that differ between batch rows row by row."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import fx, nn

from autoshard import zoo
from autoshard.capture import capture, compact
from autoshard.capture import causal as causal_pass
from autoshard.capture.meta import META_CAUSAL_MASK


def _forms(gm: fx.GraphModule) -> dict[fx.Node, causal_pass._Form]:
    forms: dict[fx.Node, causal_pass._Form] = {}
    for node in gm.graph.nodes:
        causal_pass._form(node, forms)
    return forms


def _same(a: object, b: object) -> bool:
    if isinstance(a, compact.Value) and isinstance(b, compact.Value):
        return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.full(), b.full())
    if isinstance(a, causal_pass._Mask) and isinstance(b, causal_pass._Mask):
        pairs = zip(a.terms, b.terms, strict=True)
        return (a.lq, a.lk) == (b.lq, b.lk) and all(
            s.op == t.op and np.array_equal(s.q, t.q) and np.array_equal(s.k, t.k) for s, t in pairs
        )
    return a is None and b is None


@pytest.mark.parametrize(("model", "batch", "seq"), [("llama-tiny", 72, 128), ("llama-tiny", 3, 16)])
def test_compact_values_equal_full_evaluation(model: str, batch: int, seq: int) -> None:
    case = zoo.build(model, batch=batch, seq=seq, device="meta")
    gm = capture(case.model, case.args, case.kwargs).graph_module
    held = _forms(gm)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(compact, "_rule", lambda target: None)  # every op on full tensors, as before
        full = _forms(gm)
    assert held.keys() == full.keys()
    differing = [n.name for n in held if not _same(held[n], full[n])]
    assert not differing
    known = [v for v in held.values() if isinstance(v, compact.Value)]
    assert len(known) > 10
    # the batch of positions (B, S) is held once: diff and cumsum ran on one row
    cumsum = next(v for n, v in held.items() if "cumsum" in str(n.target))
    assert isinstance(cumsum, compact.Value) and cumsum.shape == (batch, seq) and cumsum.compact.shape[0] == 1


class Positions(nn.Module):
    """Every compact rule on positions expanded over the batch, some rows made to differ."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s = x.shape[0], x.shape[1]
        rows = torch.arange(b, device=x.device)[:, None]  # (B, 1)
        pos = torch.arange(s, device=x.device).expand(b, s)  # held once along the batch
        diff = torch.diff(pos, dim=1, prepend=pos[:, :1] - 1)  # slice off the held dim, diff with prepend
        runs = torch.cumsum(diff != 1, -1) + torch.cumprod(diff, -1)
        picked = runs[
            rows[:, :, None], torch.arange(s, device=x.device)[None, None, :] - s
        ]  # negative indices
        shifted = torch.where(rows == b - 1, pos.flip(1), pos)  # the last row differs
        head = pos[1:, 2:].to(torch.float32).unsqueeze(-1)  # slices along the held dim and the other
        total = picked.sum() + shifted.sum() + head.sum()
        return x + total.to(x.dtype)


def test_each_compact_rule_equals_full_evaluation() -> None:
    gm = capture(Positions(), (torch.randn(5, 12, 8),)).graph_module
    held = _forms(gm)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(compact, "_rule", lambda target: None)
        full = _forms(gm)
    assert [n.name for n in held if not _same(held[n], full[n])] == []
    by_op = {str(n.target): v for n, v in held.items() if isinstance(v, compact.Value)}
    for op in ("aten.diff.default", "aten.cumsum.default", "aten.cumprod.default", "aten.index.Tensor"):
        assert by_op[op].compact.shape[0] == 1, op  # computed on one row
    assert by_op["aten.where.self"].compact.shape == (5, 12)  # rows that differ are held apart


class RowMasked(nn.Module):
    """Attention over a (B, 1, S, S) mask built per batch row from constants: ``kind`` picks how rows differ."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind, self.proj = kind, nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s = x.shape[0], x.shape[1]
        row = torch.arange(b, device=x.device)[:, None]  # (B, 1)
        pos = torch.arange(s, device=x.device).expand(b, s)  # (B, S), every row the same
        if self.kind == "reversed_last_row":  # the last row's positions run backwards: not causal there
            pos = torch.where(row == b - 1, s - 1 - pos, pos)
        elif self.kind == "same_rows_computed_per_row":  # a per-row select whose rows all agree
            pos = torch.where(row >= 0, pos, 0)
        elif self.kind == "shifted_rows":  # each row offset: each row causal, but rows differ
            pos = pos + row
        q, k = pos[:, None, :, None], pos[:, None, None, :]
        mask = k <= q
        if self.kind == "padded":  # odd rows hide their first key (left padding): not causal there
            mask = mask & (pos >= row % 2)[:, None, None, :]
        h = self.proj(x)[:, None]  # (B, 1, S, 8)
        return torch.nn.functional.scaled_dot_product_attention(h, h, h, attn_mask=mask).squeeze(1)


@pytest.mark.parametrize(
    ("kind", "evaluated", "symbolic"),
    [
        ("plain", True, True),
        ("same_rows_computed_per_row", True, True),
        ("reversed_last_row", False, False),
        ("padded", False, False),
        # evaluated whole, each row is checked and each is causal; symbolic terms need one position row
        ("shifted_rows", True, False),
    ],
)
def test_masks_that_differ_between_rows_are_checked_per_row(
    kind: str, evaluated: bool, symbolic: bool
) -> None:
    for seq, expected in ((16, evaluated), (256, symbolic)):  # 16: the mask is evaluated; 256: symbolic
        cap = capture(RowMasked(kind), (torch.randn(3, seq, 8),))
        sdpa = [n for n in cap.op_nodes() if "scaled_dot_product_attention" in str(n.target)]
        assert [bool(n.meta.get(META_CAUSAL_MASK)) for n in sdpa] == [expected], (kind, seq)


def test_value_of_holds_stride_zero_dims_once() -> None:
    v = compact.value_of(torch.arange(4).expand(5, 3, 4))
    assert v.compact.shape == (1, 1, 4) and v.shape == (5, 3, 4)
    assert torch.equal(v.full(), torch.arange(4).expand(5, 3, 4))
    empty = compact.value_of(torch.zeros(0, 4).expand(0, 4))
    assert empty.compact.numel() == 0
