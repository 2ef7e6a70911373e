"""Attention functions: chapter 1 ("Why attention?") and chapter 2 ("Queries, keys and values").

Shapes follow the book's notation: ``B`` batch, ``h`` heads, ``T_q``/``T_k`` query and key
lengths, ``d_k`` the query/key width and ``d_v`` the value width.

Mask convention for the whole project: a **boolean** mask where ``True`` means "may attend",
broadcastable to ``(..., T_q, T_k)``; the same convention as
:func:`torch.nn.functional.scaled_dot_product_attention`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["AdditiveAttention", "check_mask", "masked_softmax", "scaled_dot_product_attention"]


def check_mask(mask: Tensor | None, scores_shape: torch.Size) -> None:
    """Raise a clear error unless ``mask`` is a boolean tensor that broadcasts to ``scores_shape``."""
    if mask is None:
        return
    if not isinstance(mask, Tensor):
        raise TypeError(f"mask must be a torch.Tensor of dtype torch.bool, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(
            f"mask must have dtype torch.bool (True = may attend), got {mask.dtype}; "
            "convert with mask.bool() if 1 means 'may attend'"
        )
    try:
        shape = torch.broadcast_shapes(mask.shape, scores_shape)
    except RuntimeError:
        shape = None
    if shape != scores_shape:
        raise ValueError(
            f"mask of shape {tuple(mask.shape)} does not broadcast to the attention scores' "
            f"shape {tuple(scores_shape)} (..., T_q, T_k)"
        )


def masked_softmax(scores: Tensor, mask: Tensor | None = None) -> Tensor:
    """Softmax over the last axis (the keys), ignoring positions where ``mask`` is False.

    Masked scores are replaced by the dtype's most negative finite value before the softmax, so
    their weight underflows to exactly 0. A row whose keys are *all* masked would be 0/0 (NaN)
    with ``-inf``; here it returns a row of zeros, and its gradient is zero, never NaN.
    """
    check_mask(mask, scores.shape)
    if mask is None:
        return torch.softmax(scores, dim=-1)
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1)
    any_key = mask.any(dim=-1, keepdim=True)  # (..., T_q, 1)
    return weights * any_key


def _check_qkv(q: Tensor, k: Tensor, v: Tensor) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() < 2:
            raise ValueError(f"{name} must have at least 2 dimensions (..., T, d), got shape {tuple(t.shape)}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q and k must have the same last dimension d_k, got q {tuple(q.shape)} (d_k={q.shape[-1]}) "
            f"and k {tuple(k.shape)} (d_k={k.shape[-1]})"
        )
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"k and v must have the same number of positions T_k, got k {tuple(k.shape)} and v {tuple(v.shape)}"
        )


def scaled_dot_product_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, dropout_p: float = 0.0
) -> tuple[Tensor, Tensor]:
    """softmax(q k^T / sqrt(d_k)) v, written out so every step can be read (chapter 3).

    Args:
        q: ``(..., T_q, d_k)`` queries.
        k: ``(..., T_k, d_k)`` keys.
        v: ``(..., T_k, d_v)`` values.
        mask: optional boolean, ``True`` = may attend, broadcastable to ``(..., T_q, T_k)``.
        dropout_p: probability of dropping an attention weight (applied whenever > 0).

    Returns:
        ``(output, weights)`` of shapes ``(..., T_q, d_v)`` and ``(..., T_q, T_k)``. A query
        whose keys are all masked gets zeros in both, never NaN.
    """
    _check_qkv(q, k, v)
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p}")
    d_k = q.shape[-1]
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)  # (..., T_q, T_k)
    weights = masked_softmax(scores, mask)  # (..., T_q, T_k)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p, training=True)
    return weights @ v, weights  # (..., T_q, d_v), (..., T_q, T_k)


class AdditiveAttention(nn.Module):
    """Bahdanau's additive attention: score(q, k) = w^T tanh(W_q q + W_k k) (chapter 2).

    Queries and keys may have different sizes. Forward takes ``queries (..., T_q, query_size)``,
    ``keys (..., T_k, key_size)``, ``values (..., T_k, d_v)`` and an optional boolean mask
    broadcastable to ``(..., T_q, T_k)``; it returns ``(output (..., T_q, d_v), weights (..., T_q, T_k))``.
    """

    def __init__(self, query_size: int, key_size: int, hidden_size: int, dropout: float = 0.0):
        super().__init__()
        self.query_size, self.key_size = query_size, key_size
        self.W_q = nn.Linear(query_size, hidden_size, bias=False)
        self.W_k = nn.Linear(key_size, hidden_size, bias=False)
        self.w_v = nn.Linear(hidden_size, 1, bias=False)
        self.dropout = nn.Dropout(dropout)

    def forward(
        self, queries: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        if queries.shape[-1] != self.query_size:
            raise ValueError(f"queries must have last dimension {self.query_size}, got shape {tuple(queries.shape)}")
        if keys.shape[-1] != self.key_size:
            raise ValueError(f"keys must have last dimension {self.key_size}, got shape {tuple(keys.shape)}")
        if keys.shape[-2] != values.shape[-2]:
            raise ValueError(
                f"keys and values must have the same number of positions T_k, got {tuple(keys.shape)} "
                f"and {tuple(values.shape)}"
            )
        q = self.W_q(queries).unsqueeze(-2)  # (..., T_q, 1, hidden)
        k = self.W_k(keys).unsqueeze(-3)  # (..., 1, T_k, hidden)
        scores = self.w_v(torch.tanh(q + k)).squeeze(-1)  # (..., T_q, T_k)
        weights = masked_softmax(scores, mask)  # softmax over the keys: dim=-1, always explicit
        return self.dropout(weights) @ values, weights
