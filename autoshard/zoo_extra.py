"""The zoo's plain torch models: the seed text model and MLPs (``seed``, ``mlp``, ``mlp-deep``), and for coverage
a ResNet-style CNN and a torchtitan-style LLaMA.

The CNN and the LLaMA are written the way their communities write them, not the way autoshard would like them:

- :class:`ResNetCNN` -- convolution stem, batch norm, max pooling, residual basic blocks held in an
  ``nn.Sequential``, adaptive average pooling, a linear classifier;
- :class:`TitanLlama` -- torchtitan's / Meta's reference LLaMA layout: blocks in an ``nn.ModuleDict`` keyed
  ``"0"``, ``"1"``, ...; rotary embedding applied with complex numbers (``view_as_complex`` on a
  ``(..., head_dim/2, 2)`` view, multiply by a complex ``freqs_cis`` buffer, ``view_as_real`` back);
  attention projections ``wq/wk/wv/wo`` and SwiGLU ``w1/w2/w3``.

Example::

    model = TitanLlama(TitanConfig(dim=64, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=128))
    logits = model(torch.zeros(2, 16, dtype=torch.long))       # (2, 16, 128)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "MLP", "DeepMLP", "DeepMLPBlock", "ResNetCNN", "SeedTextModel", "TitanConfig", "TitanLlama",
    "precompute_freqs_cis",
]  # fmt: skip


# -- plain models of the zoo (seed, mlp, mlp-deep) -------------------------------------------------------


class SeedTextModel(nn.Module):
    """The seed text model: Embedding(vocab, dim) -> Linear(dim, dim) -> Linear(dim, 1) -> mean over S."""

    def __init__(self, vocab: int = 30522, dim: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.proj = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, 1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.proj(self.embed(ids))  # (B, S, dim)
        return self.head(x).mean(dim=1)  # (B, 1)


class MLP(nn.Module):
    """``fc1 -> GELU -> fc2``: the Megatron MLP (column-split fc1, row-split fc2 is the known optimum)."""

    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(hidden, ffn)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(ffn, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class DeepMLPBlock(nn.Module):
    """``Linear(hidden, hidden) -> ReLU``: one block of :class:`DeepMLP`."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.fc = nn.Linear(hidden, hidden)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc(x))


class DeepMLP(nn.Module):
    """``depth`` :class:`DeepMLPBlock` in an ``nn.ModuleList`` (capture finds them as repeated blocks)."""

    def __init__(self, hidden: int, depth: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(DeepMLPBlock(hidden) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


# -- ResNet-style CNN ----------------------------------------------------------------------------------------


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with batch norm and a residual connection (ResNet-18's block)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(x + self.bn2(self.conv2(y)))


class ResNetCNN(nn.Module):
    """Stem (conv, bn, relu, max pool), ``depth`` basic blocks, adaptive average pool, linear classifier."""

    def __init__(self, channels: int = 8, depth: int = 2, classes: int = 10, in_channels: int = 3) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.pool = nn.MaxPool2d(2)
        self.layers = nn.Sequential(*(BasicBlock(channels) for _ in range(depth)))
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, C_in, H, W)
        x = self.pool(F.relu(self.bn1(self.conv1(x))))
        x = self.avgpool(self.layers(x))  # (B, C, 1, 1)
        return self.fc(torch.flatten(x, 1))


# -- torchtitan-style LLaMA ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TitanConfig:
    """Shape of a :class:`TitanLlama` (torchtitan's ``ModelArgs`` names)."""

    dim: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    vocab_size: int = 128
    ffn_dim: int = 128
    max_seq_len: int = 64
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5


def precompute_freqs_cis(head_dim: int, end: int, theta: float) -> torch.Tensor:
    """``exp(i * t * theta^(-2j/d))`` as a complex64 ``(end, head_dim // 2)`` table."""
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2)[: head_dim // 2].float() / head_dim))
    t = torch.arange(end, dtype=torch.float32)
    return torch.polar(torch.ones(end, head_dim // 2), torch.outer(t, freqs))


def apply_rotary_emb(
    xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate query and key pairs by complex multiplication, as Meta's reference LLaMA does (in the real
    precision of ``freqs_cis``: float32 for complex64, as there; float64 for complex128)."""
    real = freqs_cis.real.dtype
    xq_ = torch.view_as_complex(xq.to(real).reshape(*xq.shape[:-1], -1, 2))  # (B, S, H, D/2) complex
    xk_ = torch.view_as_complex(xk.to(real).reshape(*xk.shape[:-1], -1, 2))
    freqs = freqs_cis.view(1, xq_.shape[1], 1, xq_.shape[-1])
    xq_out = torch.view_as_real(xq_ * freqs).flatten(3)
    xk_out = torch.view_as_real(xk_ * freqs).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


class Attention(nn.Module):
    def __init__(self, c: TitanConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = c.n_heads, c.n_kv_heads, c.dim // c.n_heads
        self.wq = nn.Linear(c.dim, c.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(c.dim, c.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(c.dim, c.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(c.n_heads * self.head_dim, c.dim, bias=False)

    def forward(self, x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
        bs, seq, _ = x.shape
        xq = self.wq(x).view(bs, seq, self.n_heads, self.head_dim)
        xk = self.wk(x).view(bs, seq, self.n_kv_heads, self.head_dim)
        xv = self.wv(x).view(bs, seq, self.n_kv_heads, self.head_dim)
        xq, xk = apply_rotary_emb(xq, xk, freqs_cis[:seq])
        rep = self.n_heads // self.n_kv_heads
        xk = xk.repeat_interleave(rep, dim=2) if rep > 1 else xk
        xv = xv.repeat_interleave(rep, dim=2) if rep > 1 else xv
        out = F.scaled_dot_product_attention(
            xq.transpose(1, 2), xk.transpose(1, 2), xv.transpose(1, 2), is_causal=True
        )  # (B, H, S, D)
        return self.wo(out.transpose(1, 2).reshape(bs, seq, -1))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, c: TitanConfig) -> None:
        super().__init__()
        self.attention = Attention(c)
        self.feed_forward = FeedForward(c.dim, c.ffn_dim)
        self.attention_norm = nn.RMSNorm(c.dim, eps=c.norm_eps)
        self.ffn_norm = nn.RMSNorm(c.dim, eps=c.norm_eps)

    def forward(self, x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), freqs_cis)
        return h + self.feed_forward(self.ffn_norm(h))


class TitanLlama(nn.Module):
    """torchtitan's LLaMA: ``tok_embeddings``, ``layers`` (a ModuleDict), ``norm``, ``output``."""

    def __init__(self, c: TitanConfig) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(c.vocab_size, c.dim)
        self.register_buffer(
            "freqs_cis",
            precompute_freqs_cis(c.dim // c.n_heads, c.max_seq_len, c.rope_theta),
            persistent=False,
        )
        self.layers = nn.ModuleDict({str(i): TransformerBlock(c) for i in range(c.n_layers)})
        self.norm = nn.RMSNorm(c.dim, eps=c.norm_eps)
        self.output = nn.Linear(c.dim, c.vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # tokens: (B, S)
        h = self.tok_embeddings(tokens)
        for layer in self.layers.values():
            h = layer(h, self.freqs_cis)
        return self.output(self.norm(h))
