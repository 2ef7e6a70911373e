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
        # the pure causal case goes to the fused kernel's causal (flash) path with no mask at all
        fused_causal = is_causal and mask is None and T_q == T_k and not need_weights
        if is_causal and not fused_causal:
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
                out = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
            elif mask is None:
                out = F.scaled_dot_product_attention(q, k, v, dropout_p=p)  # (B, h, T_q, d_k)
            else:
                # a query with no key to attend to gets zeros, as in the hand-written path, on every
                # PyTorch version and kernel: let it attend everywhere, then zero its output
                any_key = mask.any(dim=-1, keepdim=True)  # (..., T_q, 1)
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask | ~any_key, dropout_p=p)
                out = out * any_key  # (B, h, T_q, d_k)
        return self.out_proj(merge_heads(out)), weights  # (B, T_q, d_model)


def head_contributions(
    mha: MultiHeadAttention,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None = None,
    is_causal: bool = False,
) -> Tensor:
    """Each head's additive share of a :class:`MultiHeadAttention` output (chapter 5).

    Concatenating the heads and applying ``W_o`` equals summing, over heads, head ``i``'s output
    ``(T_q, d_k)`` times the ``d_k`` columns of ``W_o`` that belong to it. This returns those
    terms, ``(B, h, T_q, d_model)``, so that
    ``head_contributions(...).sum(1) + mha.out_proj.bias == mha(query, key, value, ...)[0]``.
    Arguments are those of :meth:`MultiHeadAttention.forward`; the module itself computes the
    heads (a hook reads the input of ``out_proj``), so masks and dropout behave exactly as there.
    """
    captured = []
    handle = mha.out_proj.register_forward_pre_hook(lambda _module, args: captured.append(args[0]))
    try:
        mha(query, key, value, mask=mask, is_causal=is_causal)
    finally:
        handle.remove()
    merged = captured[0]  # (B, T_q, d_model), the concatenated heads
    heads = split_heads(merged, mha.n_heads)  # (B, h, T_q, d_k)
    W_o = mha.out_proj.weight.view(mha.d_model, mha.n_heads, mha.d_k)  # (d_model, h, d_k)
    return torch.einsum("bhtk,dhk->bhtd", heads, W_o)  # (B, h, T_q, d_model)


def multihead_cost(
    d_model: int, n_heads: int, T_q: int, T_k: int | None = None, batch: int = 1, bias: bool = True
) -> dict[str, int]:
    """Parameters and forward FLOPs of one :class:`MultiHeadAttention` call (chapter 5).

    FLOPs count the matrix products only, two per multiply-add (the convention of
    :class:`torch.utils.flop_counter.FlopCounterMode`); bias additions and the softmax are left
    out. Returns a dict with ``params``; ``projection_flops`` (Q, K, V and output projections);
    ``attention_flops`` (the scores ``Q K^T`` and the weighted sum of values, over all heads);
    ``total_flops``; and ``score_entries``, the number of attention weights, ``B * h * T_q * T_k``,
    the only term that grows with ``h``. ``T_k`` defaults to ``T_q`` (self-attention).
    """
    if n_heads < 1 or d_model % n_heads != 0:
        raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
    T_k = T_q if T_k is None else T_k
    params = 4 * d_model * d_model + (4 * d_model if bias else 0)
    projection = 2 * batch * d_model * d_model * (2 * T_q + 2 * T_k)  # Q and output on T_q rows, K and V on T_k
    d_k = d_model // n_heads
    attention = 2 * (2 * batch * n_heads * T_q * T_k * d_k)  # Q K^T, then weights @ V
    return {
        "params": params,
        "projection_flops": projection,
        "attention_flops": attention,
        "total_flops": projection + attention,
        "score_entries": batch * n_heads * T_q * T_k,
    }


__all__ += ["head_contributions", "multihead_cost"]
