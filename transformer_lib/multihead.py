"""Multi-head attention (chapter 5, "Multi-head attention").

``h`` heads each attend in a ``d_k = d_model / h`` wide subspace; the efficient version does all
heads in one batched matrix product by reshaping ``(B, T, d_model)`` to ``(B, h, T, d_k)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import check_mask, scaled_dot_product_attention
from .masks import causal_mask

__all__ = ["MultiHeadAttention", "merge_heads", "split_heads"]


def split_heads(x: Tensor, n_heads: int) -> Tensor:
    """``(B, T, d_model)`` -> ``(B, h, T, d_k)`` with ``d_k = d_model / h``."""
    B, T, d_model = x.shape
    return x.view(B, T, n_heads, d_model // n_heads).transpose(1, 2)  # (B, h, T, d_k)


def merge_heads(x: Tensor) -> Tensor:
    """``(B, h, T, d_k)`` -> ``(B, T, h * d_k)``, the inverse of :func:`split_heads`."""
    B, h, T, d_k = x.shape
    return x.transpose(1, 2).reshape(B, T, h * d_k)  # (B, T, d_model)


class MultiHeadAttention(nn.Module):
    """Multi-head attention with separate Q, K, V and output projections.

    Forward takes ``query (B, T_q, d_model)``, ``key`` and ``value`` ``(B, T_k, d_model)``, an
    optional boolean ``mask`` (True = may attend) broadcastable to ``(B, h, T_q, T_k)`` and
    ``is_causal`` to add a causal mask. It returns ``(output (B, T_q, d_model), weights)``
    where ``weights`` is ``(B, h, T_q, T_k)`` if ``need_weights`` else ``None``.

    Without weights it calls PyTorch's fused kernel
    (:func:`torch.nn.functional.scaled_dot_product_attention`); with weights it uses the
    library's hand-written :func:`~transformer_lib.attention.scaled_dot_product_attention`.
    Both compute the same function.
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, bias: bool = True):
        super().__init__()
        if n_heads < 1 or d_model % n_heads != 0:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        self.d_model, self.n_heads, self.d_k = d_model, n_heads, d_model // n_heads
        self.dropout = dropout
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    @classmethod
    def from_torch(cls, m: nn.MultiheadAttention) -> MultiHeadAttention:
        """Build a copy of a ``torch.nn.MultiheadAttention(batch_first=True)`` with equal weights."""
        if not isinstance(m, nn.MultiheadAttention):
            raise TypeError(f"expected torch.nn.MultiheadAttention, got {type(m).__name__}")
        if not m.batch_first:
            raise ValueError("from_torch needs a torch.nn.MultiheadAttention built with batch_first=True")
        if not m._qkv_same_embed_dim or m.bias_k is not None or m.add_zero_attn:
            raise ValueError("from_torch supports only kdim == vdim == embed_dim, no add_bias_kv, no add_zero_attn")
        has_bias = m.in_proj_bias is not None
        new = cls(m.embed_dim, m.num_heads, dropout=m.dropout, bias=has_bias)
        new = new.to(device=m.in_proj_weight.device, dtype=m.in_proj_weight.dtype)
        with torch.no_grad():
            for i, proj in enumerate((new.q_proj, new.k_proj, new.v_proj)):
                rows = slice(i * m.embed_dim, (i + 1) * m.embed_dim)
                proj.weight.copy_(m.in_proj_weight[rows])
                if has_bias:
                    proj.bias.copy_(m.in_proj_bias[rows])
            new.out_proj.weight.copy_(m.out_proj.weight)
            if has_bias:
                new.out_proj.bias.copy_(m.out_proj.bias)
        return new

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        mask: Tensor | None = None,
        need_weights: bool = False,
        is_causal: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        for name, t in (("query", query), ("key", key), ("value", value)):
            if t.dim() != 3 or t.shape[-1] != self.d_model:
                raise ValueError(f"{name} must have shape (B, T, d_model={self.d_model}), got {tuple(t.shape)}")
        if key.shape[:2] != value.shape[:2] or key.shape[0] != query.shape[0]:
            raise ValueError(
                f"query, key and value must share B, and key/value must share T_k: got {tuple(query.shape)}, "
                f"{tuple(key.shape)}, {tuple(value.shape)}"
            )
        B, T_q, _ = query.shape
        T_k = key.shape[1]
        check_mask(mask, torch.Size((B, self.n_heads, T_q, T_k)))
        fused_causal = is_causal and mask is None and T_q == T_k
        if is_causal:
            causal = causal_mask(T_q, T_k, device=query.device)  # (T_q, T_k)
            mask = causal if mask is None else mask & causal
        q = split_heads(self.q_proj(query), self.n_heads)  # (B, h, T_q, d_k)
        k = split_heads(self.k_proj(key), self.n_heads)  # (B, h, T_k, d_k)
        v = split_heads(self.v_proj(value), self.n_heads)  # (B, h, T_k, d_k)
        p = self.dropout if self.training else 0.0
        if need_weights:
            out, weights = scaled_dot_product_attention(q, k, v, mask=mask, dropout_p=p)  # (B, h, T_q, d_k)
        else:
            weights = None
            if fused_causal:
                # the pure causal case: let the fused kernel pick its causal (flash) path
                out = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
            else:
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)  # (B, h, T_q, d_k)
        return self.out_proj(merge_heads(out)), weights  # (B, T_q, d_model)
