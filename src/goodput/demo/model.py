"""A small byte-level transformer language model (decoder-only, pre-norm), sized for a CPU demo.

It trains with dropout by default (attention and residual branches), so the demo and ``goodput verify-resume``
show that random draws in the training step resume bit for bit.
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["ModelConfig", "TinyLM"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Shape of the model. The defaults train visibly within a couple of CPU minutes."""

    vocab: int = 256
    context: int = 64
    width: int = 128
    layers: int = 2
    heads: int = 4
    dropout: float = 0.1

    def __post_init__(self) -> None:
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.width % self.heads:
            raise ValueError(f"width {self.width} must be a multiple of heads {self.heads}")


class _Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.norm1 = nn.LayerNorm(cfg.width)
        self.qkv = nn.Linear(cfg.width, 3 * cfg.width)
        self.proj = nn.Linear(cfg.width, cfg.width)
        self.norm2 = nn.LayerNorm(cfg.width)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.width, 4 * cfg.width), nn.GELU(), nn.Linear(4 * cfg.width, cfg.width)
        )
        self.dropout = cfg.dropout
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(c, dim=2)
        shape = (b, t, self.heads, c // self.heads)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        p = self.dropout if self.training else 0.0
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p)
        x = x + self.drop(self.proj(attn.transpose(1, 2).reshape(b, t, c)))
        return x + self.drop(self.mlp(self.norm2(x)))


class TinyLM(nn.Module):
    """Predicts the next byte. ``forward(tokens)`` returns logits; ``loss(batch)`` the mean cross-entropy."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab, cfg.width)
        self.pos = nn.Parameter(torch.zeros(1, cfg.context, cfg.width))
        self.blocks = nn.ModuleList(_Block(cfg) for _ in range(cfg.layers))
        self.norm = nn.LayerNorm(cfg.width)
        self.head = nn.Linear(cfg.width, cfg.vocab, bias=False)
        for name, param in self.named_parameters():
            if param.dim() >= 2:
                nn.init.normal_(
                    param, std=0.02 / (math.sqrt(2 * cfg.layers) if name.endswith("proj.weight") else 1)
                )

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.pos[:, : tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))

    def loss(self, batch: torch.Tensor) -> torch.Tensor:
        """Cross-entropy of predicting ``batch[:, 1:]`` from ``batch[:, :-1]``."""
        logits = self(batch[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1).long())
