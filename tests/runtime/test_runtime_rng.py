"""Dropout under a plan draws the single-device model's masks: BERT and T5 (dropout 0.1) in training mode."""

from __future__ import annotations

import copy
import functools
from typing import Any

import pytest
import torch
from torch import nn

import autoshard
from autoshard.capture import Captured, capture
from autoshard.codegen import full_grads, gather_outputs, parallel_info, parallelize, shard_inputs
from autoshard.codegen.shard import local_piece
from autoshard.runtime.launch import launch
from autoshard.runtime.verify import cluster_for

SEED = 123
COL, ROW = ((1, 1, 1), (2, 1)), ((1, 1, 2), (1, 2))  # linear on (B, S, H) over 2 devices
BERT_PLANS = {
    "megatron": (("*.query", COL), ("*.key", COL), ("*.value", COL), ("*.attention.output.dense", ROW)),
}
T5_PLANS = {
    "megatron": (("*.q", COL), ("*.k", COL), ("*.v", COL), ("*.o", ROW), ("*.wi", COL), ("*.wo", ROW))
}


@functools.cache
def _case(name: str) -> tuple[nn.Module, tuple[Any, ...], dict[str, Any], Captured]:
    import transformers

    torch.manual_seed(0)
    ids = torch.randint(0, 512, (4, 8), generator=torch.Generator().manual_seed(1))
    kwargs: dict[str, Any] = {}
    if name == "bert":
        config: Any = transformers.BertConfig(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=128,
            vocab_size=512,
            hidden_dropout_prob=0.1,
            attention_probs_dropout_prob=0.1,
            attn_implementation="sdpa",
        )
        model: nn.Module = transformers.BertForMaskedLM(config)
    else:
        config = transformers.T5Config(
            d_model=64,
            d_ff=128,
            d_kv=16,
            num_layers=2,
            num_heads=4,
            vocab_size=512,
            dropout_rate=0.1,
            use_cache=False,
        )
        model = transformers.T5ForConditionalGeneration(config)
        kwargs = {"decoder_input_ids": ids.flip(1).contiguous()}
    model = model.double().train()
    return model, (ids,), kwargs, capture(model, (ids,), kwargs, blocks="full")


def _logits(out: Any) -> torch.Tensor:
    return out.logits if hasattr(out, "logits") else (out[0] if isinstance(out, tuple) else out)


def _run(name: str, annotations: tuple[Any, ...]) -> tuple[list[Any], torch.Tensor, dict[str, torch.Tensor]]:
    model, args, kwargs, cap = _case(name)
    plan = autoshard.plan(model, cluster_for("cpu", 2), args, kwargs, annotations=dict(annotations))
    grad = torch.randn(_logits(model(*args, **kwargs)).shape, dtype=torch.float64)

    def work() -> tuple[torch.Tensor, dict[str, torch.Tensor | None], int, bool]:
        module = parallelize(model, plan, args, kwargs, captured=cap, record=True)
        torch.manual_seed(SEED)
        local = module(*shard_inputs(plan, *args, **kwargs))
        first = local[0] if isinstance(local, tuple) else local
        spec = parallel_info(module).outputs[0][0]
        first.backward(local_piece(grad, spec, plan.mesh_shape, parallel_info(module).comm.coord))
        out = gather_outputs(module, local)
        out = out[0] if isinstance(out, tuple) else out
        log = parallel_info(module).comm.log or []
        return out, full_grads(module), len(log), "seeded_dropout" in module.code

    ranks = launch(work, 2)
    model.zero_grad()
    torch.manual_seed(SEED)
    reference = _logits(model(*args, **kwargs))
    reference.backward(grad)
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return ranks, reference.detach(), grads


@pytest.mark.slow
@pytest.mark.parametrize(("name", "kind"), [("bert", "megatron"), ("t5", "megatron")])
def test_dropout_matches_single_device(name: str, kind: str) -> None:
    plans = BERT_PLANS if name == "bert" else T5_PLANS
    ranks, reference, grads = _run(name, plans[kind])
    for out, rank_grads, collectives, rewritten in ranks:
        assert rewritten and collectives > 0  # dropout was rewritten and the plan's collectives ran
        torch.testing.assert_close(out, reference, rtol=1e-9, atol=1e-12)
        for fqn, want in grads.items():
            got = rank_grads.get(fqn)
            assert got is not None, fqn
            torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12, msg=fqn)


def test_dropout_draws_differ_from_eval() -> None:
    """Guard against a vacuous pass: with dropout 0.1 the training-mode outputs differ from eval mode."""
    model, args, kwargs, _ = _case("bert")
    torch.manual_seed(SEED)
    train = _logits(model(*args, **kwargs)).detach()
    model.eval()
    try:
        assert not torch.allclose(train, _logits(model(*args, **kwargs)).detach())
    finally:
        model.train()


_B, _H, _S, _E = 4, 2, 6, 4
_CAUSAL = torch.ones(_S, _S, dtype=torch.bool).tril().expand(_B, 1, _S, _S)  # HF GPT-2's mask under export
_MASKS: dict[str, dict[str, Any]] = {
    "none": {},
    "is_causal": {"is_causal": True},
    "bool mask": {"attn_mask": _CAUSAL},
    "float mask": {"attn_mask": torch.randn(_B, 1, _S, _S, dtype=torch.float64)},
}


@pytest.mark.parametrize("mask", list(_MASKS))
def test_seeded_sdpa_matches_eager_attention_dropout(mask: str) -> None:
    """Each batch half, drawn as rank 0 / rank 1 of a batch split, is the eager masked attention's half, forward
    and backward.  A boolean mask used to reach ATen's math op as given (added as 0/1, not 0/-inf): GPT-2 with
    attention dropout verified MISMATCH even replicated."""
    from autoshard.runtime.rng import seeded_sdpa

    gen = torch.Generator().manual_seed(3)
    q, k, v, grad = (torch.randn(_B, _H, _S, _E, generator=gen, dtype=torch.float64) for _ in range(4))
    kwargs = _MASKS[mask]

    def run(piece: int | None) -> tuple[torch.Tensor, ...]:
        rows = slice(None) if piece is None else slice(piece * _B // 2, (piece + 1) * _B // 2)
        leaves = [t[rows].clone().requires_grad_() for t in (q, k, v)]
        local: dict[str, Any] = {n: m[rows] if isinstance(m, torch.Tensor) else m for n, m in kwargs.items()}
        lq, lk, lv = leaves
        torch.manual_seed(SEED)
        if piece is None:
            out = torch.nn.functional.scaled_dot_product_attention(lq, lk, lv, dropout_p=0.5, **local)
        else:
            out = seeded_sdpa(lq, lk, lv, dropout_p=0.5, spec="(S(0),)", mesh=(2,), coord=(piece,), **local)
        out.backward(grad[rows])
        return (out.detach(), *(t.grad for t in leaves if t.grad is not None))

    eager = run(None)
    halves = [run(0), run(1)]
    for want, *got in zip(eager, *halves, strict=True):
        assert torch.equal(torch.cat(got), want)  # bitwise: the same ops as eager's math path
    assert not torch.allclose(eager[0], torch.nn.functional.scaled_dot_product_attention(q, k, v, **kwargs))


class _Noisy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 16)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.fc(x)
        return h * torch.rand_like(h), torch.native_dropout(h, 0.5, True)[0]


@pytest.mark.filterwarnings("ignore:.*rand_like")
def test_native_dropout_is_reproduced_and_other_split_randomness_named() -> None:
    """``native_dropout`` is rewritten like ``dropout``; a random op without that rewrite is named once a
    strategy splits it (verify then refuses in one line instead of a MISMATCH), not while it runs replicated."""
    from autoshard.codegen.assign import assign_strategies
    from autoshard.placement import ShardingSpec
    from autoshard.runtime.rng import reproducible_randomness, unreproduced
    from autoshard.strategies import OpStrategy

    model, x = _Noisy().double().train(), torch.randn(4, 8, dtype=torch.float64)
    plan = autoshard.plan(model, cluster_for("cpu", 2), (x,), annotations={"fc": "column"})
    cap = capture(model, (x,), blocks="full")
    strategies = assign_strategies(cap, plan)
    graph = cap.graph_module.graph
    assert (
        unreproduced(graph, strategies) == ()
    )  # rand_like has no rule: it runs replicated, drawing it whole
    split = ShardingSpec.parse("(S(1),)")
    strategies["rand_like"] = OpStrategy((split,), (split,), (None,), 2)
    assert unreproduced(graph, strategies) == (
        f"rand_like (aten.rand_like.default, {strategies['rand_like']})",
    )
    lowered = copy.deepcopy(graph)
    assert reproducible_randomness(lowered, strategies, (2,), (0,)) == 1  # native_dropout, not rand_like
