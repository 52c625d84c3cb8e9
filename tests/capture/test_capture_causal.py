"""An explicit attention mask is marked causal exactly when it is: Hugging Face's position-built mask (evaluated
on small shapes, symbolic on long ones), and not a strict, windowed, padded or input-fed mask."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from autoshard import zoo
from autoshard.capture import capture
from autoshard.capture.meta import META_CAUSAL_MASK


def _marked(model: nn.Module, *args: torch.Tensor) -> list[bool]:
    cap = capture(model, args)
    return [
        bool(n.meta.get(META_CAUSAL_MASK))
        for n in cap.op_nodes()
        if "scaled_dot_product_attention" in str(n.target)
    ]


@pytest.mark.parametrize(
    "seq", [32, 512]
)  # 32: the mask is small enough to evaluate; 512: proven symbolically
def test_hf_llama_masks_are_proven_causal(seq: int) -> None:
    case = zoo.build("llama-tiny", batch=2, seq=seq)
    cap = capture(case.model, case.args)
    assert _marked(case.model, *case.args) == [True, True]
    assert any("explicit attention masks proven causal" in n for n in cap.notes)


def test_a_large_batch_of_position_vectors_is_still_evaluated() -> None:
    # batch 72 > _WIDE: the (72, 128) positions exceed 64 x their longest dim but not 64 per batch row; before,
    # every batch over 64 left HF's mask unproven (LLaMA-3-70B at batch 1024: attention priced as a full square)
    case = zoo.build("llama-tiny", batch=72, seq=128)
    assert _marked(case.model, *case.args) == [True, True]


def test_a_padding_mask_from_the_inputs_is_not_causal() -> None:
    case = zoo.build("llama-tiny", batch=2, seq=64)
    cap = capture(case.model, case.args, {"attention_mask": torch.ones(2, 64, dtype=torch.long)})
    sdpa = [n for n in cap.op_nodes() if "scaled_dot_product_attention" in str(n.target)]
    assert sdpa and not any(
        n.meta.get(META_CAUSAL_MASK) for n in sdpa
    )  # its values are unknown when planning


class Masked(nn.Module):
    """Attention over a mask built from positions: ``kind`` picks which."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind, self.proj = kind, nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = x.shape[1]
        pos = torch.arange(s, device=x.device) + 5  # offset positions: causality is about order, not values
        q, k = pos[:, None], pos[None, :]
        mask = {
            "causal": k <= q,
            "flipped": q >= k,
            "strict": k < q,  # the diagonal hidden: not causal
            "window": (k <= q) & (q - k < 4),  # sliding window: not causal
            "ones": (k <= q) & torch.ones((), dtype=torch.bool, device=x.device),
            "random": (k <= q)
            & (torch.rand(s, 1, device=x.device) >= 0),  # all true, but one draw proves nothing
        }[self.kind]
        h = self.proj(x)[:, None]  # (B, 1, S, 8)
        return torch.nn.functional.scaled_dot_product_attention(h, h, h, attn_mask=mask).squeeze(1)


@pytest.mark.parametrize(
    ("kind", "causal"),
    [
        ("causal", True),
        ("flipped", True),
        ("ones", True),
        ("strict", False),
        ("window", False),
        ("random", False),
    ],
)
@pytest.mark.parametrize("seq", [16, 256])
def test_position_built_masks(kind: str, causal: bool, seq: int) -> None:
    assert _marked(Masked(kind), torch.randn(2, seq, 8)) == [causal]
