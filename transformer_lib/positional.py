"""Positional encodings (chapter 6, "Positional encoding").

Both modules take token embeddings ``x (B, T, d_model)`` and return ``x`` plus a position
vector for each of the ``T`` positions. Sequences longer than ``max_len`` raise a ``ValueError``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

__all__ = ["LearnedPositionalEmbedding", "SinusoidalPositionalEncoding", "sinusoidal_encoding"]


def sinusoidal_encoding(max_len: int, d_model: int, base: float = 10000.0) -> Tensor:
    """The paper's encoding, ``(max_len, d_model)``, float32.

    PE(pos, 2i) = sin(pos / base^(2i/d_model)) and PE(pos, 2i+1) = cos(pos / base^(2i/d_model)):
    sines on the even dimensions, cosines on the odd ones, interleaved.
    """
    if max_len < 1 or d_model < 1:
        raise ValueError(f"max_len and d_model must be positive, got max_len={max_len}, d_model={d_model}")
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]  # (max_len, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (ceil(d_model / 2),)
    angles = pos / base ** (two_i / d_model)  # (max_len, ceil(d_model / 2))
    pe = torch.empty(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angles)
    pe[:, 1::2] = torch.cos(angles[:, : d_model // 2])
    return pe.float()


def _check_length(x: Tensor, d_model: int, max_len: int) -> None:
    if x.dim() != 3 or x.shape[-1] != d_model:
        raise ValueError(f"expected input of shape (B, T, d_model={d_model}), got {tuple(x.shape)}")
    if x.shape[1] > max_len:
        raise ValueError(f"sequence length {x.shape[1]} is longer than the maximum length {max_len}")


class SinusoidalPositionalEncoding(nn.Module):
    """Adds the fixed sinusoidal encoding (no parameters) to ``x (B, T, d_model)``, then dropout."""

    def __init__(self, d_model: int, max_len: int = 5000, dropout: float = 0.0):
        super().__init__()
        self.d_model, self.max_len = d_model, max_len
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("pe", sinusoidal_encoding(max_len, d_model), persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        _check_length(x, self.d_model, self.max_len)
        return self.dropout(x + self.pe[: x.shape[1]].to(x.dtype))  # (B, T, d_model)


class LearnedPositionalEmbedding(nn.Module):
    """Adds a learned vector per position (an ``nn.Embedding`` of ``max_len`` rows) to ``x``."""

    def __init__(self, max_len: int, d_model: int, dropout: float = 0.0):
        super().__init__()
        self.d_model, self.max_len = d_model, max_len
        self.embedding = nn.Embedding(max_len, d_model)
        nn.init.normal_(self.embedding.weight, std=0.02)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        _check_length(x, self.d_model, self.max_len)
        positions = torch.arange(x.shape[1], device=x.device)  # (T,)
        return self.dropout(x + self.embedding(positions))  # (B, T, d_model)


def scaled_embedding(embedding: nn.Embedding, ids: Tensor) -> Tensor:
    """Token embeddings multiplied by sqrt(d_model), as in the original paper (chapter 7)."""
    return embedding(ids) * math.sqrt(embedding.embedding_dim)
